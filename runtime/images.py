"""Map a deployment's ``image`` to the function folder the runtime runs.

The embedded runtime runs handler folders, not container images: an image deploys only if one of
the stack files given at start names it (``image:`` with ``handler:``; the user's ``--stack``
first, then the platform's own ``--platform-stack``, ``stack.platform.yml``, which holds the
``aggregator``), or if the deployment carries the annotation ``com.fedfaas.handler`` with a
folder. This plays the part of OpenFaaS CE's check that an image is public: anything else is
refused with 400 before a replica starts.
"""

from __future__ import annotations

import logging
from pathlib import Path

from core.stackfile import Stack, StackError, load_stack
from runtime.errors import UnsupportedImage
from runtime.models import FunctionDeployment

log = logging.getLogger(__name__)

HANDLER_ANNOTATION = "com.fedfaas.handler"
LANG_ANNOTATION = "com.fedfaas.lang"
SUPPORTED_LANGS = ("python3-http", "python3-http-debian")


def image_repository(image: str) -> str:
    """``ghcr.io/x/fn:1.2@sha256:..`` -> ``ghcr.io/x/fn`` (registry ports are kept)."""
    image = image.split("@", 1)[0]
    head, sep, tail = image.rpartition(":")
    return head if sep and "/" not in tail else image


class _StackFile:
    """One stack file, re-read whenever it changes on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path.resolve()
        self._stack: Stack | None = None
        self._mtime: float = -1.0

    def stack(self) -> Stack | None:
        try:
            mtime = self.path.stat().st_mtime
        except OSError:
            log.warning("stack file %s is gone; keeping the last one read", self.path)
            return self._stack
        if mtime != self._mtime:
            try:
                # fprocess is not needed to find folders; a missing template must not block it.
                self._stack = load_stack(self.path, read_template=False)
                self._mtime = mtime
            except StackError as exc:
                log.error("cannot use stack file: %s", exc)
        return self._stack


class ImageResolver:
    """Resolve images through stack files (the first that names an image wins)."""

    def __init__(self, *stack_paths: Path | None) -> None:
        self.files = [_StackFile(p) for p in stack_paths if p is not None]

    @property
    def stack_path(self) -> Path | None:
        """The first stack file (relative ``com.fedfaas.handler`` folders are read from its
        folder)."""
        return self.files[0].path if self.files else None

    def _lookup(self, image: str) -> tuple[Path, str] | None:
        fns = [f for sf in self.files if (st := sf.stack()) for f in st.functions.values()]
        for match in (
            lambda f: f.image == image,
            lambda f: image_repository(f.image) == image_repository(image),
        ):
            for f in fns:
                if f.image and f.handler_dir is not None and match(f):
                    return f.handler_dir, f.lang
        return None

    def resolve(self, spec: FunctionDeployment) -> Path:
        """The folder holding ``handler.py`` for ``spec``.

        Raises
        ------
        UnsupportedImage
            No image, an image the stack file does not know, an unsupported ``lang``, or a folder
            without ``handler.py``.
        """
        service, image = spec.service, spec.image.strip()
        if not image:
            raise UnsupportedImage(service, "image is required")
        annotations = spec.annotations or {}
        lang = annotations.get(LANG_ANNOTATION, "")
        if annotations.get(HANDLER_ANNOTATION):
            raw = Path(annotations[HANDLER_ANNOTATION])
            base = self.stack_path.parent if self.stack_path else Path.cwd()
            folder = raw if raw.is_absolute() else (base / raw).resolve()
        else:
            found = self._lookup(image)
            if found is None:
                names = ", ".join(str(sf.path) for sf in self.files)
                where = f"stack files {names}" if names else "no stack file"
                raise UnsupportedImage(
                    service,
                    f"image {image!r} is unknown to this runtime ({where}): the embedded runtime "
                    "runs handler folders, so add a function with this `image:` and its "
                    f"`handler:` folder to the stack file, or set the annotation "
                    f"{HANDLER_ANNOTATION}=<folder>",
                )
            folder, lang = found[0], lang or found[1]
        lang = lang or "python3-http"
        if lang not in SUPPORTED_LANGS:
            raise UnsupportedImage(
                service,
                f"lang {lang!r} is not supported here; use one of {', '.join(SUPPORTED_LANGS)}",
            )
        if not (folder / "handler.py").is_file():
            raise UnsupportedImage(service, f"no handler.py in {folder} (image {image!r})")
        return folder
