"""The report of ``bench.flower_baseline``: its tables, rendered from its JSON as written.

:func:`render` is the Markdown file: the interleaved comparison of FedFaaS and the Flower peers
(:func:`bench.harness.compare.compare_rows`) and where each Flower's server window went
(:func:`split_table`), or one Flower round's figures (:func:`table`).
"""

from __future__ import annotations

from typing import Any

from bench.runinfo import run_header


def table(res: dict[str, Any]) -> str:
    if not res["ok"]:
        return f"Flower round failed ({res['failure']}): {res['detail'][:500]}"
    mb = 1e6
    rows = [
        (
            "clients x update",
            f"{res['num_clients']} x {res['update_bytes'] / mb:.1f} MB ({res['num_tensors']} tensors)",
        ),
        ("weights in client memory -> aggregated model", f"{res['e2e_s']:.2f} s"),
        (
            "server window: first update bytes received -> aggregated",
            f"{res['server_s'] or 0:.2f} s",
        ),
        ("  of which ingest (all results in)", f"{res['ingest_s']:.2f} s"),
        ("  of which aggregate (aggregate_train / aggregate_fit)", f"{res['aggregate_s']:.2f} s"),
        *_split_rows(res),
        ("round (model sent -> aggregated)", f"{res['round_s']:.2f} s"),
        (
            "server processes' summed peak in the window (VmHWM)",
            f"{res['server_hwm_bytes'] / mb:.0f} MB",
        ),
        *_cgroup_rows(res.get("cgroup")),
        ("server RSS idle, before the uploads", f"{res['server_idle_rss_bytes'] / mb:.0f} MB"),
    ]
    head = f"Flower {res['flwr_version']}, {res.get('api', 'start_server/start_client')}"
    lines = [f"| {head} | value |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines)


def _split_rows(res: dict[str, Any]) -> list[tuple[str, str]]:
    """Where the server window went (results stored before the split have none)."""
    if res.get("poll_wait_s") is None:
        return []
    return [
        (
            "  the ServerApp's wait for its next poll after every update's bytes were in",
            f"{res['poll_wait_s']:.2f} s",
        ),
        ("  its last pull of the replies from the SuperLink", f"{res['last_pull_s']:.2f} s"),
    ]


def _cgroup_rows(cg: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The server's and the clients' cgroup figures (none in results stored before them)."""
    if not cg:
        return []
    server, clients = cg["server"], cg["clients"]
    return [
        (
            f"server cgroup peak memory (CPUs {server['cpus']})",
            f"{server['peak_bytes'] / 1e6:.0f} MB",
        ),
        ("server cgroup CPU-seconds in the round", f"{server['cpu_s']:.2f} s"),
        (
            "server threads that ran (most at once)",
            f"{server['threads_ran']} ({server['threads_max']})",
        ),
        ("clients' cgroup peak memory", f"{clients['peak_bytes'] / 1e6:.0f} MB"),
    ]


def render(stored: dict[str, Any]) -> str:
    from bench.harness.compare import compare_rows

    out = ["# bench: flower_baseline", "", run_header(stored["run"]), ""]
    if stored.get("compare"):
        cfg = stored["config"]
        out += [
            f"{cfg['clients']} clients x {cfg['update_bytes'] / 1e6:.1f} MB ({cfg['model']}), "
            f"rule {cfg['rule']}; FedFaaS: one node gateway (userspace router), "
            f"{cfg['fedfaas']}; {', '.join(cfg['peers'])}. Each system's round "
            f"{stored['compare']['repeats']} times, interleaved, the server side of each in a "
            "cgroup pinned to the same CPUs.",
            "",
            "| figure | FedFaaS | baseline(s) | ratio | target | threads |",
            "|---|---|---|---|---|---|",
            *compare_rows(stored["compare"]),
            "",
            "Where Flower's server window goes (median over the runs; Flower 1.42's ServerApp "
            "polls the SuperLink every 3 s and moves each array as its own HTTP request):",
            "",
            "| system | server window (s) | first -> 99 % of the update bytes in (s) | "
            "poll wait (s) | last pull (s) | aggregate (s) |",
            "|---|---:|---:|---:|---:|---:|",
            *split_table(stored["compare"]),
        ]
    if stored.get("ok") is not None:  # a single round (--single)
        out.append(table(stored))
    return "\n".join(out) + "\n"


def split_table(cmp: dict[str, Any]) -> list[str]:
    import statistics

    rows = []
    for cpus, block in cmp["by_cpus"].items():
        for system, recs in block["runs"].items():
            done = [r for r in recs if r.get("ok", True)]
            if not done or system == "FedFaaS":
                continue

            def med(key: str, done: list[dict[str, Any]] = done) -> str:
                vals = [r[key] for r in done if r.get(key) is not None]
                return f"{statistics.median(vals):.2f}" if vals else "n/a"

            bytes_in = [
                r["server_s"] - r["all_bytes_to_aggregate_s"] - r["aggregate_s"]
                for r in done
                if r.get("all_bytes_to_aggregate_s") is not None and r.get("server_s")
            ]
            rows.append(
                f"| {system} (CPUs {cpus}) | {med('server_s')} | "
                f"{f'{statistics.median(bytes_in):.2f}' if bytes_in else 'n/a'} | "
                f"{med('poll_wait_s')} | {med('last_pull_s')} | {med('aggregate_s')} |"
            )
    return rows
