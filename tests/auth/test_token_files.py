"""Token files: read trimmed; a mode that lets others read (or anyone but the owner write) is
warned about, the 0440 Kubernetes gives a pod's fsGroup is not."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from core.auth import read_token_file, write_token_file


@pytest.mark.parametrize(
    ("mode", "warned"), [(0o600, False), (0o440, False), (0o644, True), (0o620, True)]
)
def test_a_loose_token_file_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: int, warned: bool
) -> None:
    path = write_token_file(tmp_path / "t", " tok \n")
    os.chmod(path, mode)
    with caplog.at_level(logging.WARNING, logger="core.auth"):
        assert read_token_file(path) == "tok"
    assert ("should be 0600" in caplog.text) is warned
