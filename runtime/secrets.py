"""OpenFaaS secrets on the embedded runtime: values as files, never in the API's answers.

The runtime keeps each secret as ``<state_dir>/secrets/<name>`` (folder 0700, file 0600). A
function deployed with ``secrets: [a, b]`` gets its own folder holding exactly ``a`` and ``b``
(:func:`sync_folder`), whose path reaches its replicas as ``FEDFAAS_SECRETS_DIR``
(:data:`runtime.function_auth.SECRETS_DIR_ENV`), the counterpart of the ``/var/openfaas/secrets`` mount on Kubernetes.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from runtime.errors import InvalidRequest

# Kubernetes DNS-1123 subdomain, as faas-cli's validateSecretName checks it.
_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
NAME_RE = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
NAME_MAX = 253


def validate_name(name: str) -> None:
    """Raise :class:`InvalidRequest` unless ``name`` is a DNS-1123 subdomain (a safe file name)."""
    if not name:
        raise InvalidRequest('secret name is required: send {"name": ..., "value": ...}')
    if len(name) > NAME_MAX or not NAME_RE.match(name):
        raise InvalidRequest(
            f"invalid secret name {name!r}: use at most {NAME_MAX} lower-case letters, digits, "
            "'-' and '.', starting and ending with a letter or digit (DNS-1123 subdomain)"
        )


def private_folder(folder: Path) -> Path:
    """Create ``folder`` (and parents) and make it 0700; return it."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    return folder


def write_file(folder: Path, name: str, value: bytes) -> Path:
    """Write ``folder/name`` with mode 0600, atomically (a reader sees the old or the new value)."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.")  # mkstemp creates it 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(value)
        os.replace(tmp, folder / name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return folder / name


class SecretStore:
    """The runtime's secrets, one 0600 file each in a 0700 folder.

    Parameters
    ----------
    root:
        The folder (``<state_dir>/secrets``); created on first use.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def names(self) -> list[str]:
        """Every secret's name, sorted."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_file() and NAME_RE.match(p.name))

    def exists(self, name: str) -> bool:
        return NAME_RE.match(name) is not None and (self.root / name).is_file()

    def read(self, name: str) -> bytes:
        return (self.root / name).read_bytes()

    def write(self, name: str, value: bytes) -> None:
        """Create or replace secret ``name`` (the caller checked the name and existence)."""
        write_file(private_folder(self.root), name, value)

    def delete(self, name: str) -> None:
        (self.root / name).unlink()


def sync_folder(folder: Path, names: list[str], store: SecretStore) -> None:
    """Make ``folder`` (0700) hold exactly the secrets ``names`` from ``store`` (files 0600)."""
    private_folder(folder)
    wanted = set(names)
    for p in folder.iterdir():
        if p.name not in wanted:
            p.unlink()
    for name in wanted:
        write_file(folder, name, store.read(name))
