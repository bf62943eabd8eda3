"""The runtime resolves an image through the user's stack file, then the platform's
(``--stack``, ``--platform-stack``): the first file naming the image wins, and an image neither
names is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.stackfile import PLATFORM_STACK
from runtime.errors import UnsupportedImage
from runtime.images import ImageResolver
from runtime.models import FunctionDeployment


def _stack(folder: Path, functions: dict[str, str]) -> Path:
    """A stack file in ``folder`` with a handler folder per function (``name: image``)."""
    folder.mkdir(parents=True, exist_ok=True)
    body = "version: 1.0\nprovider:\n  name: openfaas\nfunctions:\n"
    for name, image in functions.items():
        (folder / name).mkdir(exist_ok=True)
        (folder / name / "handler.py").write_text("def handle(req):\n    return req\n")
        body += f"  {name}:\n    lang: python3-http\n    handler: ./{name}\n    image: {image}\n"
    path = folder / "stack.yml"
    path.write_text(body)
    return path


def _resolve(resolver: ImageResolver, image: str) -> Path:
    return resolver.resolve(FunctionDeployment(service="f", image=image))


def test_the_users_stack_wins_and_the_platform_stack_fills_in(tmp_path: Path) -> None:
    user = _stack(tmp_path / "user", {"echo": "me/echo:1", "agg": "me/shared:1"})
    platform = _stack(tmp_path / "platform", {"agg": "me/shared:1", "only": "me/only:1"})
    resolver = ImageResolver(user, platform)
    assert _resolve(resolver, "me/shared:1") == tmp_path / "user" / "agg"
    assert _resolve(resolver, "me/only:1") == tmp_path / "platform" / "only"
    assert _resolve(resolver, "me/only:2") == tmp_path / "platform" / "only"  # same repository
    with pytest.raises(UnsupportedImage, match="stack files"):
        _resolve(resolver, "me/nobody:1")
    with pytest.raises(UnsupportedImage, match="stack file"):
        _resolve(ImageResolver(user), "me/only:1")


def test_the_repos_aggregator_resolves_through_the_platform_stack_only() -> None:
    repo = PLATFORM_STACK.parent
    image = "ghcr.io/fedfaas/aggregator:0.1.0"
    with pytest.raises(UnsupportedImage):
        _resolve(ImageResolver(repo / "stack.yml"), image)
    folder = _resolve(ImageResolver(repo / "stack.yml", PLATFORM_STACK), image)
    assert folder == repo / "functions" / "aggregator"
