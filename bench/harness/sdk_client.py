"""One FL client of a benchmark round, as its own light process (``python -m
bench.harness.sdk_client --spec FILE --out FILE``): numpy, safetensors and the SDK, nothing of
the server side, so that N clients on the machine weigh what N SDK clients weigh.

Its "trained weights" are mapped as numpy arrays (every page resident,
:func:`bench.harness.rc.map_weights`). It says it is ready (``ready-<client>`` in the
spec's ``work`` folder) and, released with the others by the ``go`` file there, marks
``t_start_ns`` (``time.monotonic_ns``) and uploads them through
:meth:`client.sdk.FLClient.upload` (its real HTTP path: 1 MiB chunks over httpx, its 409/503
retries), marks ``t_done_ns``. The spec's ``upload`` says what the SDK is given: ``"stream"``
(the default) the state dict, which the SDK writes as safetensors while it sends
(:class:`client.stream.SafetensorsBody`); ``"bytes"`` the safetensors bytes, serialised first
(``safetensors.numpy.save``, ``t_encoded_ns`` after it), as an SDK user holding bytes does. It
writes the marks, its ``VmHWM`` and its measured thread pools to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

#: what the SDK is given to upload: the state dict (streamed) or its safetensors bytes
UPLOADS = ("stream", "bytes")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.harness.sdk_client")
    p.add_argument(
        "--spec",
        required=True,
        help="JSON: work, weights, url, job, client, token, samples, upload (stream or bytes)",
    )
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    from bench.harness import round_clients as rc
    from client.sdk import FLClient

    spec = json.loads(Path(a.spec).read_text())
    upload = spec.get("upload", "stream")
    if upload not in UPLOADS:
        raise SystemExit(f"upload must be one of {UPLOADS}, not {upload!r}")
    with FLClient(spec["url"], spec["job"], spec["client"], spec["token"], timeout=600) as c:
        rc.client_round(
            spec,
            Path(a.out),
            lambda data: c.upload(1, data, spec["samples"], busy_wait=600),
            serialise=upload == "bytes",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
