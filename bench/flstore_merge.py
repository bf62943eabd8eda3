"""bench-flstore's result from several runs: ``python -m bench.flstore_merge BASE OTHER...``.

The whole benchmark takes longer than one sitting of a shared machine allows (the rounds of
120 and 200 ResNet-18-sized updates alone take most of an hour), so it can be run in parts,
each ``python -m bench.flstore ... --out DIR`` writing a complete result of its own, and the
parts merged: ``BASE/flstore.json`` keeps its ``run`` block, its live latency, handoff, policies
and lookup overhead; every other folder's sections (the demo's GTG-Shapley, the big rounds)
replace BASE's, each stamped with the ``run`` block of the run it came from, which the Markdown
names (a live latency or handoff section of another run is refused). Big-round sizes from
several runs are joined when their setup (the budget, GTG-Shapley's parameters, the askings,
the memos, the platform) is the same, each size stamped with its run; a different setup is
refused (``--drop big_rounds`` leaves BASE's out, for a setup run again otherwise). The systems
of one size may come from several runs (``--big-systems``): a run's systems replace those of an
earlier run of that size, the others are kept, and each names its run. The merged ``flstore.json`` goes to
``--out`` (default ``bench/results``) and ``flstore.md`` and ``.png`` are rendered from it as
written (:func:`bench.runinfo.rerender`). ``--result flstore_rounds`` merges the big rounds'
own result (``flstore_rounds.json``, which ``--big-rounds`` writes) the same way: BASE's run
heads it, each size of another run names its own.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

from bench.flstore import RESULTS
from bench.flstore_report import markdown, plot
from bench.flstore_rounds import SYSTEMS
from bench.flstore_rounds_report import document as rounds_document
from bench.flstore_rounds_report import plot as rounds_plot
from bench.runinfo import rerender

#: the sections a part of the benchmark adds, those whose Markdown names the run they came from
#: (the live latency, the handoff, the policies and the overhead are BASE's)
SECTIONS = ("shapley", "big_rounds")
#: each result's Markdown and plot
RENDERERS = {"flstore": (markdown, plot), "flstore_rounds": (rounds_document, rounds_plot)}
#: sections only BASE may hold
BASE_ONLY = ("latency", "handoff")
#: what the big rounds of two runs must share to stand in one table
SETUP = ("budget_bytes", "gtg_params", "repeats", "gtg_repeats", "memos", "platform")


class MergeRefused(ValueError):
    """Two parts that cannot stand in one result."""


def merge(base: dict[str, Any], *others: dict[str, Any]) -> dict[str, Any]:
    """``base`` with the sections of each of ``others`` (see the module); nothing is changed in
    place."""
    out = copy.deepcopy(base)
    for other in others:
        run = other["run"]
        extra = [k for k in BASE_ONLY if k in other]
        if extra:
            raise MergeRefused(f"{', '.join(extra)}: only the base result may hold them")
        for key in SECTIONS:
            if key not in other:
                continue
            section = copy.deepcopy(other[key])
            if key == "big_rounds":  # each size names its run
                held = out.get(key) or {**section, "sizes": {}}
                out[key] = _join_sizes(held, section, run)
            else:
                out[key] = {**section, "run": run}
    return out


def _join_sizes(held: dict[str, Any], new: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    differ = [k for k in SETUP if held.get(k) != new.get(k)]
    if differ:
        raise MergeRefused(
            "the big rounds of the two runs differ in "
            + ", ".join(f"{k} ({held.get(k)!r} vs {new.get(k)!r})" for k in differ)
        )
    sizes: dict[str, Any] = {}
    for n, row in held["sizes"].items():
        came_from = row.get("run") or held.get("run")
        sizes[n] = {**row, "run": came_from} if came_from else row
    for n, row in new["sizes"].items():
        sizes[n] = _join_systems(sizes.get(n), row, run)
    joined = {k: v for k, v in held.items() if k != "run"}
    joined["sizes"] = {n: sizes[n] for n in sorted(sizes, key=int)}
    return joined


def _asked(row: dict[str, Any]) -> list[str]:
    """The systems a size's run was to ask (a row without ``systems``: all)."""
    return list(row.get("systems") or SYSTEMS)


def _join_systems(
    held: dict[str, Any] | None, new: dict[str, Any], run: dict[str, Any]
) -> dict[str, Any]:
    """A size's row of ``new``'s run (``run``), with the systems it did not ask kept from
    ``held``; each system's run in ``runs``. FedFaaS's answers are compared with
    ObjStore-Agg's and Cache-Agg's only within one run: where one of the two comes from
    another, that comparison is not known."""
    mine = _asked(new)
    if held is None or set(_asked(held)) <= set(mine):
        return {**new, "run": run, "runs": dict.fromkeys(mine, run)}
    before = held.get("runs") or dict.fromkeys(_asked(held), held.get("run"))
    kept = [x for x in _asked(held) if x not in mine]
    out = {**held, **{x: new[x] for x in mine}}
    out["systems"] = [x for x in SYSTEMS if x in mine or x in kept]
    out["runs"] = {x: run if x in mine else before.get(x) for x in out["systems"]}
    out["run"] = run
    for key, baseline in (("same_answer", "objstore-agg"), ("same_answer_cache_agg", "cache-agg")):
        compared = {"fedfaas", baseline}
        if compared <= set(mine):
            out[key] = new.get(key)
        elif compared & set(mine):
            out[key] = None
    if "cache-agg" in mine:
        out["cache_agg_skipped_need_bytes"] = new.get("cache_agg_skipped_need_bytes")
        out["cache_agg_not_asked"] = False
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.flstore_merge", description=__doc__)
    ap.add_argument(
        "base",
        type=Path,
        help="folder of the result whose run, policies and overhead the merged result keeps",
    )
    ap.add_argument(
        "others",
        type=Path,
        nargs="+",
        help="folders of the results whose sections are added, in order",
    )
    ap.add_argument(
        "--drop",
        action="append",
        default=[],
        choices=SECTIONS,
        help="a section of BASE to leave out (its setup run again otherwise); repeatable",
    )
    ap.add_argument(
        "--result",
        choices=tuple(RENDERERS),
        default="flstore",
        help="the result merged: flstore (default) or flstore_rounds (the big rounds, which "
        "bench.flstore --big-rounds writes to a result of its own)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder of the merged files")
    args = ap.parse_args(argv)
    name = args.result
    read = [json.loads((d / f"{name}.json").read_text()) for d in (args.base, *args.others)]
    for section in args.drop:
        read[0].pop(section, None)
    try:
        merged = merge(read[0], *read[1:])
    except MergeRefused as exc:
        ap.error(str(exc))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(merged, indent=1) + "\n")
    sys.stdout.write(rerender(name, *RENDERERS[name], args.out))


if __name__ == "__main__":
    main()
