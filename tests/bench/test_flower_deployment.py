"""What bench.flower_baseline's docstring says of Flower 1.42's Deployment Runtime, read from
the Flower the benchmark runs (its own environment, bench.harness.flower_env): the defaults
and constants that shape the round it measures."""

from __future__ import annotations

import json
import subprocess
import textwrap

import numpy as np
import pytest

from bench.harness import round_clients as rc
from bench.harness.flower_env import flower_python

pytestmark = pytest.mark.integration

PROBE = textwrap.dedent(
    """
    import inspect, json, sys
    import numpy as np
    from flwr.app import ArrayRecord, MetricRecord, RecordDict
    from flwr.common import constant
    from flwr.supercore import constant as core_constant
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
    from importlib import import_module
    flower_superlink = import_module("flwr.superlink.cli.flower_superlink")
    flower_supernode = import_module("flwr.supernode.cli.flower_supernode")
    run_clientapp = import_module("flwr.supernode.runtime.run_clientapp")
    http_grid = import_module("flwr.superlink.grid.http_grid")
    layout = json.loads(sys.argv[1])
    rng = np.random.default_rng(0)  # distinct contents: equal chunks would be one object
    arrays = [rng.random(s, dtype=np.float32) for _, s in layout]
    record = RecordDict({"arrays": ArrayRecord(arrays), "metrics": MetricRecord({"n": 1})})
    print(json.dumps({
        "chunk": constant.FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE,
        "backoff": [core_constant.PULL_INITIAL_BACKOFF, core_constant.PULL_BACKOFF_CAP],
        "objects": len(get_all_nested_objects(record)),
        "one_worker": "workers=1," in inspect.getsource(flower_superlink),
        "poll_s": "time.sleep(3)" in inspect.getsource(http_grid.HttpGrid.send_and_receive),
        "isolation_default": "default=ISOLATION_MODE_SUBPROCESS"
            in inspect.getsource(flower_supernode),
        "one_message_per_clientapp": (
            lambda src: src.count("pull_task_input(") == 1 and "flwr_exit(" in src
            and "while " not in src
        )(inspect.getsource(run_clientapp.run_clientapp)),
    }))
    """
)


def test_flowers_deployment_runtime_is_what_the_benchmark_says() -> None:
    layout = rc.resnet18_layout()
    out = subprocess.run(
        [str(flower_python()), "-c", PROBE, json.dumps(layout)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    got = json.loads(out.stdout)
    assert got["chunk"] == 5 * 1024 * 1024  # each array moves in 5 MB chunks
    assert got["backoff"] == [1, 10]  # an object not yet pushed is pulled again after 1..10 s
    # every array is an object, and so is each 5 MB chunk of it: one HTTP request each
    chunks = sum(-(-4 * int(np.prod(shape)) // got["chunk"]) for _, shape in layout)
    assert got["objects"] >= len(layout) + chunks
    assert got["one_worker"]  # the SuperLink's uvicorn runs one worker
    assert got["poll_s"]  # the ServerApp asks the SuperLink for replies every 3 s
    assert got["isolation_default"]  # a SuperNode's ClientApps run as its subprocesses
    assert got["one_message_per_clientapp"]  # a ClientApp process pulls one message and exits
