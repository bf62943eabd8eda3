"""The demo's report: the FedAvg check, the table, where the checkpoints are, the plot."""

from __future__ import annotations

from pathlib import Path

from fedfaas.demo.config import CHANCE, DemoConfig, DemoResult
from fedfaas.services import MinioServer


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


def plot(result: DemoResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = [r["round"] for r in result.rounds]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(rounds, [r["accuracy"] for r in result.rounds], marker="o", label="global model")
    ax1.axhline(CHANCE, color="grey", linestyle="--", label="chance (10%)")
    ax1.set(xlabel="round", ylabel="test accuracy", ylim=(0, 1), title="Accuracy per round")
    ax1.set_xticks(rounds)
    ax1.legend(loc="lower right")
    ax2.bar(rounds, [r["seconds"] for r in result.rounds], color="tab:orange")
    ax2.set(xlabel="round", ylabel="seconds", title="Round time (fetch, train, upload, aggregate)")
    ax2.set_xticks(rounds)
    fig.suptitle("FedFaaS demo: digits, non-IID clients over node gateways")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(cfg: DemoConfig, result: DemoResult, minio: MinioServer, out: Path) -> None:
    say("")
    say("| round | test accuracy | test loss | round time (s) | updates | global vs FedAvg |")
    say("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in result.rounds:
        say(
            f"| {r['round']} | {r['accuracy']:.3f} | {r['loss']:.3f} | {r['seconds']:.2f} "
            f"| {r['accepted']} | {r['fedavg_max_rel_err']:.1e} |"
        )
    say("")
    say(
        "round time = fetch model, train locally, upload, aggregate over both nodes; "
        "'global vs FedAvg' = max relative difference between the served global model and "
        "a float64 sample-weighted average of the uploads the clients sent."
    )
    say(f"aggregation: {result.aggregators}")
    say(
        f"checkpoints: MinIO {minio.url}, bucket '{result.bucket}', written by "
        f"{result.checkpoints_by}:"
    )
    for k in result.checkpoint_keys:
        say(f"  s3://{result.bucket}/{k}   (+ clients/<id>.safetensors, meta.json beside it)")
    say(
        f"MinIO console: {minio.console_url}  user {minio.access_key!r} password "
        f"{minio.secret_key!r} -> Object Browser -> {result.bucket} -> {cfg.job}/rounds/"
    )
    say(
        "  (the demo stops MinIO when it ends; FEDFAAS_DEMO_HOLD=600 keeps it up 10 min, or "
        f"reopen the data later with: MINIO_ROOT_USER={minio.access_key} "
        f"MINIO_ROOT_PASSWORD={minio.secret_key} minio server {result.minio_data} "
        "--console-address 127.0.0.1:9001)"
    )
    say(f"plot: {out / 'demo.png'}   report: {out / 'demo.json'}")
