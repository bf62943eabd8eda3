"""The README's architecture picture is its source's output: ``make docs-diagram`` draws
docs/architecture.svg from scripts/architecture_diagram.py, byte for byte the same each run
with one matplotlib, and the picture names the SHA-256 of the source it was drawn from (a new
matplotlib release alone may change the bytes, not the picture's source)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from tests.docs.snippets import REPO

PICTURE = REPO / "docs" / "architecture.svg"
SOURCE = REPO / "scripts" / "architecture_diagram.py"


def test_the_committed_picture_was_drawn_from_the_source_as_it_is(tmp_path: Path) -> None:
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()
    assert f"source sha256 {digest}" in PICTURE.read_text(), (
        "docs/architecture.svg was drawn from another version of "
        "scripts/architecture_diagram.py: run `make docs-diagram` and commit the picture"
    )
    once, twice = tmp_path / "once.svg", tmp_path / "twice.svg"
    for out in (once, twice):
        subprocess.run([sys.executable, str(SOURCE), str(out)], check=True, cwd=REPO, timeout=120)
    assert once.read_bytes() == twice.read_bytes()  # reproducible: no date, no random ids
    assert f"source sha256 {digest}" in once.read_text()


def test_the_picture_shows_every_part_its_source_names() -> None:
    sys.path.insert(0, str(SOURCE.parent))
    try:
        import architecture_diagram as source
    finally:
        sys.path.remove(str(SOURCE.parent))
    svg = PICTURE.read_text()
    for box in source.BOXES:
        assert box.label in svg and box.folder in svg, box.key
    for arrow in source.ARROWS:
        assert arrow.label in svg, arrow
    keys = {b.key for b in source.BOXES}
    assert all({a.src, a.dst} <= keys for a in source.ARROWS)
    # the folders the picture names are the repository's
    for box in source.BOXES:
        folder = box.folder.split(":")[0].split(" ")[0].rstrip(",")
        if folder.endswith("/"):
            assert (REPO / folder).is_dir(), folder


def test_make_docs_diagram_draws_it_from_the_source() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k != "MFLAGS"}
    res = subprocess.run(
        ["make", "-n", "docs-diagram"], cwd=REPO, capture_output=True, text=True, env=env
    )
    assert res.returncode == 0, res.stderr
    assert "scripts/architecture_diagram.py docs/architecture.svg" in res.stdout
