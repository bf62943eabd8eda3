"""Every system's round, repeated and interleaved, on the same CPUs, measured by cgroup.

:func:`run_compare` runs each system's round ``repeats`` times for each CPU set, the systems
alternating (FedFaaS, Flower, SF, FedFaaS, ...; :func:`interleaved`), every run in fresh
cgroups (:class:`~bench.harness.cgroups.RoundGroups`): the server side pinned to the CPU set,
the clients on the CPUs it leaves (sharing them only when it leaves none). :func:`summarise` gives each figure's median and min-max over the runs
that finished (:func:`spread`) and FedFaaS's ratios to each baseline as ratios of medians;
:func:`compare_rows` renders them as rows of ``bench.dataplane``'s table.
"""

from __future__ import annotations

import logging
import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bench.harness import round_window as rw
from bench.harness.cgroups import CgroupError, RoundGroups

log = logging.getLogger(__name__)

#: the system every other is compared with
SUBJECT = "FedFaaS"

#: every compared row's runs per system (issue 37: at least 5, the systems alternating); the
#: default of each benchmark's ``--repeats``
REPEATS = 5

#: a system's round: (its cgroups, a tag unique to the run within its comparison) -> its round
#: record; two comparisons in one process repeat each other's tags (:func:`run_tag`), so
#: runners that name folders after the tag give each comparison a folder of its own
Runner = Callable[[RoundGroups, str], dict[str, Any]]

#: figures compared as ratios of medians: key, the word a ratio says
RATIOS = (
    ("e2e_s", "faster"),
    ("server_s", "faster"),
    ("server_peak_bytes", "less"),
    ("server_cpu_s", "less"),
)


# ----------------------------------------------------------------------------- pure logic
def interleaved(systems: Sequence[str], repeats: int) -> list[tuple[int, str]]:
    """(repeat, system) in run order: every system once per repeat, in the given order."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, not {repeats}")
    return [(rep, system) for rep in range(repeats) for system in systems]


def spread(values: Sequence[float | None]) -> dict[str, float] | None:
    """``{"median", "min", "max", "n"}`` of the values that are not None (None: no value)."""
    got = [float(v) for v in values if v is not None]
    if not got:
        return None
    return {"median": statistics.median(got), "min": min(got), "max": max(got), "n": len(got)}


def figures(rec: Mapping[str, Any]) -> dict[str, float | None]:
    """One run's compared figures from its round record (None where it has none): the two
    windows, each cgroup's peak, the server group's CPU-seconds and threads, the sampled
    peak (secondary) and its sample rate, and for FedFaaS its design floor."""
    cg = rec.get("cgroup") or {}
    server, clients = cg.get("server") or {}, cg.get("clients") or {}
    samples, window = rec.get("server_peak_samples"), rec.get("e2e_s")
    floor = (rec.get("design_floor") or {}).get("bytes")
    peak = server.get("peak_bytes")
    return {
        "e2e_s": rec.get("e2e_s"),
        "server_s": rec.get("server_s"),
        "server_peak_bytes": peak,
        "client_peak_bytes": clients.get("peak_bytes"),
        "server_cpu_s": server.get("cpu_s"),
        "threads_ran": server.get("threads_ran"),
        "threads_max": server.get("threads_max"),
        "sampled_peak_bytes": rec.get("server_peak_bytes"),
        # older records: the samples over the round's window, near the sampler's own span
        "sample_hz": rec.get("server_peak_sample_hz")
        or (samples / window if samples and window else None),
        "floor_bytes": floor,
        "peak_over_floor": peak / floor if peak and floor else None,
    }


def summarise(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """Per system: each figure's :func:`spread` over its runs that finished, how many
    finished, and what stopped the others; ``ratios``: for each baseline and each figure of
    :data:`RATIOS`, the baseline's median over FedFaaS's."""
    out: dict[str, Any] = {"systems": {}, "ratios": {}}
    for system, recs in runs.items():
        done = [figures(r) for r in recs if r.get("ok", True)]
        keys = done[0].keys() if done else ()
        out["systems"][system] = {
            "runs": len(recs),
            "ok": len(done),
            "failures": [
                rw.killed_at(dict(r)) or r.get("failure") for r in recs if not r.get("ok", True)
            ],
            **{k: spread([d[k] for d in done]) for k in keys},
        }
    mine = out["systems"].get(SUBJECT) or {}
    for system, theirs in out["systems"].items():
        if system == SUBJECT:
            continue
        out["ratios"][system] = {
            key: (theirs[key]["median"] / mine[key]["median"])
            if theirs.get(key) and mine.get(key) and mine[key]["median"]
            else None
            for key, _ in RATIOS
        }
    return out


# ----------------------------------------------------------------------------- running
def run_tag(system: int, cpus: str, repeat: int) -> str:
    """A run's tag: letters and digits only, short (it names the run's job, folders, store and
    router socket, an AF_UNIX path), unique per system index, CPU set and repeat
    (``run_tag(0, "0-1", 4) == "x0c0t1r4"``)."""
    cpu = "".join({"-": "t", ",": "p"}.get(c, c) for c in cpus if c.isalnum() or c in "-,")
    return f"x{system}c{cpu}r{repeat}"


def run_compare(
    runners: Mapping[str, Runner],
    *,
    cpus_sets: Sequence[str],
    repeats: int,
    after_run: Callable[[dict[str, Any]], None] | None = None,
    close_timeout: float = 15.0,
) -> dict[str, Any]:
    """Every system of ``runners`` (FedFaaS first), ``repeats`` times per CPU set of
    ``cpus_sets``, interleaved; each run in fresh cgroups named after the run, removed after
    it whatever happened (a group that cannot be removed is named in the run's record,
    ``cgroup_left``). A run that raises is a failure record. Returns ``{"systems",
    "repeats", "order", "by_cpus": {cpus: {"runs": {system: [records]}, "summary"}}}``;
    ``after_run`` gets that result as it stands after every run (summaries of the runs so
    far), so a benchmark cut short keeps what it did. ``close_timeout``: seconds a run's
    groups may take to empty after it."""
    systems = list(runners)
    out: dict[str, Any] = {
        "systems": systems,
        "repeats": repeats,
        "order": "interleaved: " + ", ".join(systems) + ", then again",
        "by_cpus": {},
    }
    for cpus in cpus_sets:
        runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
        for rep, system in interleaved(systems, repeats):
            tag = run_tag(systems.index(system), cpus, rep)
            log.info("compare: %s on CPUs %s, repeat %d", system, cpus, rep)
            groups = RoundGroups(f"fedfaas-bench-{os.getpid()}-{tag}", cpus)
            left = None
            try:
                rec = dict(runners[system](groups, tag))
            except Exception as exc:  # noqa: BLE001 - recorded as the run's result
                log.exception("compare: %s, repeat %d failed", system, rep)
                rec = rw.failure("error", f"{type(exc).__name__}: {exc}"[:2000])
            finally:
                try:
                    groups.close(close_timeout)
                except CgroupError as exc:  # a process outlived its run: said in the record
                    log.error("compare: %s, repeat %d: %s", system, rep, exc)
                    left = str(exc)
            if left is not None:
                rec["cgroup_left"] = left
            rec["repeat"] = rep
            runs[system].append(rec)
            out["by_cpus"][cpus] = {"runs": runs, "summary": summarise(runs)}
            if after_run is not None:
                after_run(out)
    return out


# ----------------------------------------------------------------------------- rendering
def _cell(s: Mapping[str, float] | None, scale: float = 1.0, digits: int = 2) -> str:
    if not s:
        return "n/a"
    f = f"{{:.{digits}f}}"
    return (
        f"{f.format(s['median'] / scale)} [{f.format(s['min'] / scale)}-"
        f"{f.format(s['max'] / scale)}]"
    )


#: a round's server-side figures as short table columns: label, figure, scale (the reports of
#: bench.dataplane's variants and bench.scale's points start with these)
SERVER_COLUMNS = (
    ("round s", "e2e_s", 1.0),
    ("server window s", "server_s", 1.0),
    ("server peak GB (cgroup)", "server_peak_bytes", 1e9),
    ("server CPU-s (cgroup)", "server_cpu_s", 1.0),
)

#: the rows of one CPU set: label, figure, scale, target, the word of its ratio ("": none)
ROWS = (
    ("round e2e, weights in client memory -> global available (s)", "e2e_s", 1.0,
     ">= 5x Flower", "faster"),
    ("server window, first update bytes -> global available (s)", "server_s", 1.0,
     ">= 4x Flower", "faster"),
    ("server peak memory by cgroup, every page charged once (GB)", "server_peak_bytes", 1e9,
     ">= 3x below Flower at 20 clients", "less"),
    ("server CPU-seconds in the round, cgroup cpuacct", "server_cpu_s", 1.0,
     ">= 5x below Flower, >= 2x below SF", "less"),
    ("clients' peak memory by cgroup (GB)", "client_peak_bytes", 1e9, "", ""),
    ("secondary: server peak of sampled per-process pages (GB)", "sampled_peak_bytes", 1e9,
     "", ""),
    ("secondary: samples per second of that sampled peak", "sample_hz", 1.0, "", ""),
)  # fmt: skip


def compare_rows(compare: Mapping[str, Any]) -> list[str]:
    """Rows of ``bench.dataplane``'s table (figure | FedFaaS | baselines | ratio | target |
    threads), one block per CPU set: median [min-max] over the runs that finished."""
    rows: list[str] = []
    for cpus, block in (compare.get("by_cpus") or {}).items():
        rows += _block_rows(cpus, block["summary"], compare["order"])
    return rows


def _block_rows(cpus: str, summ: Mapping[str, Any], order: str) -> list[str]:
    systems = summ["systems"]
    me = systems.get(SUBJECT) or {}
    peers = [(s, x) for s, x in systems.items() if s != SUBJECT]
    n = ", ".join(f"{s} {x['ok']}/{x['runs']}" for s, x in systems.items())
    failed = "; ".join(
        f"{s}: {', '.join(str(f) for f in x['failures'])}"
        for s, x in systems.items()
        if x["failures"]
    )
    head = (
        f"| **same CPUs {cpus}**: the server side of every system in its own cgroup pinned to "
        f"CPUs {cpus} (cpuset), the clients in another on the CPUs that leaves (all of them "
        f"when it leaves none); runs finished {n}"
        f"{'; failed ' + failed if failed else ''}; each cell median [min-max], {order} | | | "
        f"| | |"
    )
    where = f"CPUs {cpus}"
    threads = "server threads that ran (median [min-max]): " + "; ".join(
        f"{s} {_cell(x.get('threads_ran'), digits=0)}" for s, x in systems.items()
    )
    rows = [head]
    for label, key, scale, target, word in ROWS:
        theirs = "; ".join(f"{s} {_cell(x.get(key), scale)}" for s, x in peers)
        ratio = "; ".join(
            f"{r[key]:.2f}x {word} than {s}"
            for s, r in summ["ratios"].items()
            if word and r.get(key)
        )
        rows.append(
            f"| {label} ({where}) | {_cell(me.get(key), scale)} | {theirs} | {ratio} | "
            f"{target} | {threads} |"
        )
    if me.get("floor_bytes"):
        rows.append(
            f"| FedFaaS design floor (GB: in-flight uploads + accumulators + published global + "
            f"idle processes, from the settings); cgroup peak / floor ({where}) | "
            f"{_cell(me['floor_bytes'], 1e9)}; {_cell(me.get('peak_over_floor'))} | | | "
            f"peak <= 1.15x floor | {threads} |"
        )
    return rows
