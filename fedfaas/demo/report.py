"""The demo's report: the FedAvg check, the tables, FLStore's answers, the plot."""

from __future__ import annotations

from pathlib import Path

from fedfaas.demo.config import CHANCE, DemoConfig, DemoResult


def say(msg: str = "") -> None:
    print(msg, flush=True)


def fedavg_error(global_model: bytes, uploads: list[tuple[bytes, int]]) -> float:
    """Max |served - FedAvg(uploads)| / max |FedAvg| over all tensors (float64 reference)."""
    from client.model import bytes_to_state_dict
    from client.train import fedavg_state_dicts

    if not uploads:
        return float("nan")
    ref = fedavg_state_dicts(
        [bytes_to_state_dict(b) for b, _ in uploads], [float(n) for _, n in uploads]
    )
    got = bytes_to_state_dict(global_model)
    err = max(float((got[k].double() - v.double()).abs().max()) for k, v in ref.items())
    scale = max(float(v.double().abs().max()) for v in ref.values())
    return err / scale


def plot(cfg: DemoConfig, result: DemoResult, path: Path) -> None:
    """Accuracy and time per round, and FLStore's Shapley values with Oort's picks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = [r["round"] for r in result.rounds]
    fig, (ax1, ax2, ax3) = plt.subplots(
        1, 3, figsize=(16, 4.5), gridspec_kw={"width_ratios": [1, 1, 2]}
    )
    ax1.plot(rounds, [r["accuracy"] for r in result.rounds], marker="o", label="global model")
    ax1.axhline(CHANCE, color="grey", linestyle="--", label="chance (10%)")
    ax1.set(xlabel="round", ylabel="test accuracy", ylim=(0, 1), title="Accuracy per round")
    ax1.set_xticks(rounds)
    ax1.legend(loc="center right")
    ax2.bar(rounds, [r["seconds"] for r in result.rounds], color="tab:orange")
    ax2.set(xlabel="round", ylabel="seconds", title="Round time (fetch, train, upload, aggregate)")
    ax2.set_xticks(rounds)
    shap = result.answers.get("shapley")
    if shap:
        picked = set(result.answers.get("oort", {}).get("selected", []))
        flagged = set(result.answers.get("malicious", {}).get("flagged", []))
        names = sorted(shap["values"])
        vals = [shap["values"][c] for c in names]
        colors = ["tab:red" if c in flagged else "tab:blue" for c in names]
        bars = ax3.bar(range(len(names)), vals, color=colors)
        for b, c in zip(bars, names, strict=True):
            if c in picked:
                b.set_hatch("//")
                b.set_edgecolor("black")
        ax3.axhline(0, color="grey", linewidth=0.8)
        ax3.set_xticks(range(len(names)), [c.removeprefix("client-") for c in names], fontsize=7)
        ax3.set(
            xlabel="client (red: flagged malicious by Multi-Krum; hatched: Oort's picks for "
            f"round {result.answers.get('oort', {}).get('round', '?')})",
            ylabel="GTG-Shapley value (accuracy)",
            title=f"FLStore: contribution of each client, round {shap['round']}",
        )
    else:
        ax3.set_axis_off()
    fig.suptitle(
        f"FedFaaS demo: digits, {cfg.clients} non-IID clients over two node gateways, "
        f"{cfg.malicious or 'no client'} sign-flipping"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(cfg: DemoConfig, result: DemoResult, out: Path) -> None:
    say("")
    if cfg.mode == "async":
        say(
            "| version | test accuracy | test loss | since start (s) | updates counted so far | - |"
        )
    else:
        say("| round | test accuracy | test loss | round time (s) | updates | global vs FedAvg |")
    say("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in result.rounds:
        err = r["fedavg_max_rel_err"]
        say(
            f"| {r['round']} | {r['accuracy']:.3f} | {r['loss']:.3f} | {r['seconds']:.2f} "
            f"| {r['accepted']} | {'-' if err is None else f'{err:.1e}'} |"
        )
    say("")
    if cfg.mode == "async":
        say(
            "async (FedBuff): each version applies a buffer of staleness-weighted updates "
            "trained on recent versions; a version is no FedAvg of its uploads, so it is not "
            "checked against one here (tests/dataplane/test_fedbuff_gateway.py checks the rule)."
        )
    else:
        say(
            "round time = fetch model, train locally, upload, aggregate over both nodes; "
            "'global vs FedAvg' = max relative difference between the served global model and "
            "a float64 sample-weighted average of the uploads the clients sent."
        )
    agg = result.aggregation
    if agg:
        per = ", ".join(
            f"pid {r['pid']} ({r['node'] or '-'}): {r['tasks']}" for r in agg["replicas"]
        )
        say(
            f"aggregation: {agg['tasks']} tasks, all in replicas of the `aggregator` function "
            f"on the embedded runtime [{per}]"
        )
    _answers(cfg, result)
    say("")
    say(f"checkpoints (written by the node gateways): MinIO {result.urls.get('minio', '?')}:")
    for k in result.checkpoint_keys:
        say(f"  s3://{result.bucket}/{k}   (+ clients/<id>.safetensors, meta.json beside it)")
    when = (
        f"up for {cfg.hold:.0f} s more"
        if cfg.hold > 0
        else "the demo stops the platform now; FEDFAAS_DEMO_HOLD=600 keeps it up 10 min"
    )
    say(
        f"MinIO console: {result.urls.get('minio_console', '?')}  user {result.minio_user!r}, "
        f"password in {out / 'platform' / 'secrets' / 'minio-root-password'} ({when})"
    )
    say(
        f"operations console: {result.urls.get('console', '?')}  log in with the token in "
        f"{out / 'platform' / 'secrets' / 'gateway-admin-secret'} (admin) or analyst-token "
        f"beside it ({when})"
    )
    if result.urls.get("console", "").startswith("https://"):
        ca = out / "platform" / "secrets" / "tls" / "ca.crt"
        say(f"  (HTTPS: import the platform's CA, {ca}, in the browser)")
    t = result.timings
    say(
        "timings: "
        + ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {v:.1f} s" for k, v in t.items())
        + f"; {result.seconds:.1f} s so far"
    )
    say(f"plot: {out / 'demo.png'}   report: {out / 'demo.json'}")


def _answers(cfg: DemoConfig, result: DemoResult) -> None:
    a = result.answers
    if not a:
        return
    say("")
    say("FLStore, asked through the request tracker (POST /v1/queries?wait=true):")
    m = a["malicious"]
    verdict = (
        "found the planted one"
        if m["found"]
        else ("no client was planted" if m["planted"] is None else f"MISSED {m['planted']}")
    )
    say(
        f"  1. which client is malicious? multi-krum on round {m['round']} flags "
        f"{', '.join(m['flagged'])}; cosine-to-aggregate flags {', '.join(m['cosine_flagged'])} "
        f"({verdict}; {m['seconds']:.2f} s)"
    )
    s = a["shapley"]
    ranked = sorted(s["values"].items(), key=lambda kv: kv[1])
    say(
        f"  2. what did each client contribute? GTG-Shapley on round {s['round']} "
        f"(accuracy {s['v_empty']:.3f} -> {s['v_full']:.3f}, {s['permutations']} permutations, "
        f"{s['seconds']:.2f} s); lowest {s['lowest']}:"
    )
    for i in range(0, len(ranked), 5):
        say("     " + ", ".join(f"{c} {v:+.4f}" for c, v in ranked[i : i + 5]))
    o = a["oort"]
    among = "of the clients not flagged" if o.get("candidates") else "of all clients"
    say(
        f"  3. which clients next? Oort picks {o['k']} {among} for round {o['round']}: "
        f"{', '.join(o['selected'])} ({o['seconds']:.2f} s)"
    )
