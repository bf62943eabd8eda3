"""Issue 16, item 2: every FLStore workload gives the same answer in the cache functions (through
the request tracker), in ObjStore-Agg and in Cache-Agg on the same data: the live query plan of
``make bench-flstore`` at a small size (a small CNN, 2 rounds of 6 clients, and the digits job for
the four workloads that need an evaluator), with real MinIO, Redis, runtime and baselines; and, for
the workloads an independent implementation computes (``bench.flstore_reference``), the same
answer as that reference, read from the same rounds in MinIO."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench import flstore

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # end to end: `make test-slow`

WORKLOADS = {
    "cosine-to-aggregate",
    "multi-krum",
    "kmeans",
    "personalize",
    "foolsgold",
    "provenance",
    "oort",
    "track",
    "leave-one-out",
    "shapley",
    "incentives",
    "evaluate",
}


def test_all_twelve_workloads_answer_the_same_in_fedfaas_and_both_baselines(
    tmp_path: Path,
) -> None:
    args = argparse.Namespace(small=True, rounds=2, clients=6, memo=["on"])
    res = flstore.latency(args, tmp_path)
    rows = res["modes"]["on"]["queries"]
    seen = {r["workload"].removesuffix(" (digits)") for r in rows}
    assert seen == WORKLOADS
    differ = [(r["workload"], r["query"]) for r in rows if not r["same_result"]]
    assert not differ, differ
    # and FedFaaS's answers equal an independent implementation's (bench.flstore_reference),
    # for every workload it computes: not only the same code reached by the same objects
    checked = {r["workload"].removesuffix(" (digits)") for r in rows if r["reference"] is not None}
    assert checked == {"cosine-to-aggregate", "multi-krum", "kmeans", "foolsgold", "leave-one-out"}
    wrong = [(r["workload"], r["query"], r["reference"]) for r in rows if r["reference"]]
    assert not wrong, wrong
    # every query was served from memory: by the cache functions, or by the engine's metadata
    assert all(r["fedfaas"]["hit"] for r in rows)
