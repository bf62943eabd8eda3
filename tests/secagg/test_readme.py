"""core/secagg/README.md holds: its status sentence, the options it says are refused, and the
tests it points to (tests/docs checks its paths and links)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from client.sdk import submit_job
from core.secagg.config import INCOMPATIBLE

README = Path(__file__).resolve().parents[2] / "core" / "secagg" / "README.md"


def test_the_status_sentence_holds_jobs_take_secure_aggregation() -> None:
    text = README.read_text()
    assert "`submit_job(..., secure_aggregation={...})`" in text
    assert "secure_aggregation" in inspect.signature(submit_job).parameters


def test_the_refused_options_are_the_ones_config_refuses() -> None:
    named = set(re.findall(r"\(`(\w+)`\)", README.read_text().split("config.refusals`")[1]))
    assert named == set(INCOMPATIBLE)


def test_each_test_file_it_names_has_the_tests_it_describes() -> None:
    here = Path(__file__).parent
    for name in re.findall(r"`tests/secagg/(\w+\.py)`", README.read_text()):
        assert (here / name).is_file(), name
    protocol = (here / "test_protocol.py").read_text()
    for words in ("two_of_ten_dropped", "past_the_threshold", "wrong_share", "look_uniform"):
        assert words in protocol
