"""What each FL client of the soak uploads, and the record of what the gateways acknowledged.

Every (client, round) has its own update, the fault campaign's 257 KiB model drawn from a
seed of their names (:func:`seed_of`, :func:`bench.fault_checks.Model.update`), and each
client's sample count is fixed (:func:`weight_of`): the load (``loadtests/platform.py``)
uploads it, and the soak (``bench/soak.py``) computes, from the clients' own
acknowledgements (:func:`read_acks`), the FedAvg each published model must equal. No locust
here: the soak's check imports this module.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from bench.fault_checks import small_model

#: the soak's model: the fault campaign's 257 KiB one
MODEL = small_model()


def seed_of(client: str, rnd: int) -> int:
    """A seed for ``client``'s update of round ``rnd`` (the same in every process)."""
    return int.from_bytes(hashlib.sha256(f"{client}/{rnd}".encode()).digest()[:8], "little")


def update_of(client: str, rnd: int) -> dict[str, np.ndarray]:
    """``client``'s update of round ``rnd`` (the tensors of :data:`MODEL`)."""
    return MODEL.update(seed_of(client, rnd))


def weight_of(client: str) -> int:
    """``client``'s sample count (``c7`` -> 3): 1 to 5, fixed for the whole soak."""
    return 1 + int(client.lstrip("c") or 0) % 5


def ack_line(client: str, rnd: int, how: str) -> str:
    """One acknowledgement as a JSON line: ``how`` is ``"202"`` or ``"duplicate"`` (409
    ``duplicate_client`` after an attempt whose answer was lost: that upload was taken)."""
    return json.dumps({"client": client, "round": rnd, "how": how})


def read_acks(lines: Iterable[str]) -> dict[int, dict[str, str]]:
    """round -> client -> how it was acknowledged, from :func:`ack_line` lines."""
    out: dict[int, dict[str, str]] = {}
    for line in lines:
        if line.strip():
            rec: dict[str, Any] = json.loads(line)
            out.setdefault(int(rec["round"]), {})[str(rec["client"])] = str(rec["how"])
    return out


def read_ack_file(path: Path) -> dict[int, dict[str, str]]:
    """:func:`read_acks` of a file (empty when there is none)."""
    return read_acks(path.read_text().splitlines()) if path.exists() else {}
