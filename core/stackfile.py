"""Parse an OpenFaaS ``stack.yml`` (schema 1.0) the way ``faas-cli`` does.

The result of :func:`load_stack` gives, per function, the exact ``FunctionDeployment`` body that
``faas-cli deploy -f stack.yml`` sends (reference/openfaas.md section 7): ``labels`` and
``annotations`` always objects, empty ``envVars``/``secrets``/``constraints`` omitted, ``limits`` and
``requests`` omitted when both of their fields are empty, ``envProcess`` from ``fprocess`` or from
``template/<lang>/template.yml``.

It also maps images to handler folders, which is how the embedded runtime turns a deployment's
``image`` back into a folder of Python code.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "DEFAULT_GATEWAY",
    "FunctionSpec",
    "Stack",
    "StackError",
    "envsubst",
    "load_stack",
    "parse_stack",
    "resolve_gateway",
]

DEFAULT_GATEWAY = "http://127.0.0.1:8080"
SUPPORTED_PROVIDER = "openfaas"

#: The platform's own functions: the ``aggregator`` (and the ``flstore`` cache function's image).
#: They are not in the user's ``stack.yml``: on Kubernetes the Helm chart deploys the
#: aggregator (it needs the node's shared memory and router socket, which ``faas-cli deploy``
#: cannot give it) and the cache engine creates the cache functions, so ``faas-cli deploy -f
#: stack.yml`` must not deploy them. ``fedfaas up`` deploys the aggregator from here.
PLATFORM_STACK = Path(__file__).resolve().parents[1] / "stack.platform.yml"

_ENV_RE = re.compile(
    r"\$\$"  # escaped dollar
    r"|\$\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:-|-|:=|=)(?P<default>[^}]*))?\}"
    r"|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)"
)
_TRUE = {"y", "yes", "true", "on"}
_FALSE = {"n", "no", "false", "off", ""}


class StackError(ValueError):
    """The stack file is invalid; the message says what and where."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


def envsubst(text: str, env: Mapping[str, str] | None = None) -> str:
    """Substitute ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}`` and ``$VAR`` like drone/envsubst.

    Unset variables become the empty string (faas-cli's default, non-strict mode); ``$$`` is a
    literal ``$``.
    """
    values = os.environ if env is None else env

    def repl(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group("braced") or m.group("bare")
        value = values.get(name)
        op = m.group("op")
        if op in (":-", ":="):
            return value if value else (m.group("default") or "")
        if op in ("-", "="):
            return value if value is not None else (m.group("default") or "")
        return value or ""

    return _ENV_RE.sub(repl, text)


@dataclass(frozen=True)
class FunctionSpec:
    """One entry under ``functions:`` in a stack file, after substitution and merging."""

    name: str
    lang: str
    handler: str
    image: str
    fprocess: str
    environment: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    secrets: list[str] = field(default_factory=list)
    constraints: list[str] = field(default_factory=list)
    limits: dict[str, str] = field(default_factory=dict)
    requests: dict[str, str] = field(default_factory=dict)
    namespace: str = ""
    readonly_root_filesystem: bool = False
    handler_dir: Path | None = None

    def deployment(self) -> dict[str, Any]:
        """The ``FunctionDeployment`` JSON body faas-cli sends for this function."""
        body: dict[str, Any] = {"service": self.name, "image": self.image}
        if self.fprocess:
            body["envProcess"] = self.fprocess
        if self.environment:
            body["envVars"] = dict(self.environment)
        if self.constraints:
            body["constraints"] = list(self.constraints)
        if self.secrets:
            body["secrets"] = list(self.secrets)
        body["labels"] = dict(self.labels)
        body["annotations"] = dict(self.annotations)
        if self.limits:
            body["limits"] = dict(self.limits)
        if self.requests:
            body["requests"] = dict(self.requests)
        body["readOnlyRootFilesystem"] = self.readonly_root_filesystem
        if self.namespace:
            body["namespace"] = self.namespace
        return body


@dataclass(frozen=True)
class Stack:
    """A parsed stack file."""

    path: Path
    gateway: str
    functions: dict[str, FunctionSpec]
    copy: list[str] = field(default_factory=list)

    def select(self, pattern: str | None = None) -> list[FunctionSpec]:
        """Functions whose name matches the glob ``pattern`` (faas-cli ``--filter``), in file order."""
        return [
            f
            for n, f in self.functions.items()
            if pattern is None or fnmatch.fnmatchcase(n, pattern)
        ]

    def image_map(self) -> dict[str, Path]:
        """Map each function's image to its handler folder (absolute)."""
        return {
            f.image: f.handler_dir for f in self.functions.values() if f.image and f.handler_dir
        }

    def lang_of(self, image: str) -> str | None:
        """The ``lang`` of the function built from ``image``, if the stack has one."""
        for f in self.functions.values():
            if f.image == image:
                return f.lang
        return None


def _as_bool(value: Any, where: str, path: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise StackError(path, f"{where}: expected a boolean, got {value!r}")


def _str_map(value: Any, where: str, path: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise StackError(path, f"{where}: expected a map of strings")
    return {str(k): "" if v is None else str(v) for k, v in value.items()}


def _str_list(value: Any, where: str, path: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise StackError(path, f"{where}: expected a list of strings")
    return [str(v) for v in value]


def _resources(value: Any, where: str, path: str) -> dict[str, str]:
    raw = _str_map(value, where, path)
    return {k: raw[k] for k in ("memory", "cpu") if raw.get(k)}


def _template_fprocess(base: Path, lang: str, fn: str, path: str) -> str:
    tpl = base / "template" / lang / "template.yml"
    if not tpl.is_file():
        raise StackError(
            path,
            f"function {fn!r}: no fprocess and no template/{lang}/template.yml next to the stack "
            "file; set `fprocess:` or add the template",
        )
    data = yaml.safe_load(tpl.read_text()) or {}
    return str(data.get("fprocess") or "")


def parse_stack(
    text: str,
    path: str | Path = "stack.yml",
    *,
    env: Mapping[str, str] | None = None,
    base_dir: Path | None = None,
    read_template: bool = True,
) -> Stack:
    """Parse stack-file ``text``; relative paths resolve against ``base_dir`` (default: its folder).

    Raises
    ------
    StackError
        The version is not 1.0, the provider is not ``openfaas``, or a field has the wrong shape.
    """
    spath = str(path)
    base = (base_dir or Path(path).resolve().parent).resolve()
    try:
        # BaseLoader keeps every scalar a string, as Go's map[string]string decoding does
        # (``1.10`` stays "1.10", ``true`` stays "true").
        doc = yaml.load(envsubst(text, env), Loader=yaml.BaseLoader)  # noqa: S506 - BaseLoader is safe
    except yaml.YAMLError as exc:
        raise StackError(spath, f"not valid YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise StackError(spath, "expected a mapping with `provider` and `functions`")
    version = doc.get("version")
    if version not in (None, "", "1.0"):
        raise StackError(spath, f"version must be 1.0, got {version!r}")
    provider = doc.get("provider") or {}
    if not isinstance(provider, dict) or provider.get("name") != SUPPORTED_PROVIDER:
        name = provider.get("name") if isinstance(provider, dict) else provider
        raise StackError(spath, f"provider.name must be {SUPPORTED_PROVIDER!r}, got {name!r}")
    functions_raw = doc.get("functions") or {}
    if not isinstance(functions_raw, dict):
        raise StackError(spath, "functions: expected a map of function name to definition")
    functions: dict[str, FunctionSpec] = {}
    for name, raw in functions_raw.items():
        functions[name] = _parse_function(str(name), raw or {}, base, spath, read_template)
    config = doc.get("configuration") or {}
    copy = _str_list(
        config.get("copy") if isinstance(config, dict) else None, "configuration.copy", spath
    )
    return Stack(Path(path), str(provider.get("gateway") or ""), functions, copy)


def _parse_function(
    name: str, raw: Any, base: Path, spath: str, read_template: bool
) -> FunctionSpec:
    where = f"functions.{name}"
    if not isinstance(raw, dict):
        raise StackError(spath, f"{where}: expected a mapping")
    lang = str(raw.get("lang") or "")
    handler = str(raw.get("handler") or "")
    environment = _str_map(raw.get("environment"), f"{where}.environment", spath)
    for env_file in _str_list(raw.get("environment_file"), f"{where}.environment_file", spath):
        file_path = (base / env_file).resolve()
        if not file_path.is_file():
            raise StackError(spath, f"{where}.environment_file: {env_file} not found")
        data = yaml.load(file_path.read_text(), Loader=yaml.BaseLoader) or {}  # noqa: S506
        if not isinstance(data, dict):
            raise StackError(spath, f"{where}.environment_file: {env_file} is not a mapping")
        environment.update(_str_map(data.get("environment"), f"{env_file}: environment", spath))
    fprocess = str(raw.get("fprocess") or "")
    if not fprocess and read_template and lang:
        fprocess = _template_fprocess(base, lang, name, spath)
    return FunctionSpec(
        name=name,
        lang=lang,
        handler=handler,
        image=str(raw.get("image") or ""),
        fprocess=fprocess,
        environment=environment,
        labels=_str_map(raw.get("labels"), f"{where}.labels", spath),
        annotations=_str_map(raw.get("annotations"), f"{where}.annotations", spath),
        secrets=_str_list(raw.get("secrets"), f"{where}.secrets", spath),
        constraints=_str_list(raw.get("constraints"), f"{where}.constraints", spath),
        limits=_resources(raw.get("limits"), f"{where}.limits", spath),
        requests=_resources(raw.get("requests"), f"{where}.requests", spath),
        namespace=str(raw.get("namespace") or ""),
        readonly_root_filesystem=_as_bool(
            raw.get("readonly_root_filesystem", False), f"{where}.readonly_root_filesystem", spath
        ),
        handler_dir=(base / handler).resolve() if handler else None,
    )


def load_stack(
    path: str | Path, *, env: Mapping[str, str] | None = None, read_template: bool = True
) -> Stack:
    """Read and parse the stack file at ``path`` (see :func:`parse_stack`)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise StackError(str(p), f"cannot read: {exc.strerror}") from exc
    return parse_stack(text, p, env=env, read_template=read_template)


def resolve_gateway(
    flag: str | None = None, yaml_gateway: str | None = None, env: Mapping[str, str] | None = None
) -> str:
    """Pick the gateway URL with faas-cli's precedence.

    ``--gateway`` (when not the default) > ``provider.gateway`` (when not the default) >
    ``OPENFAAS_URL`` > ``http://127.0.0.1:8080``; lowercased, ``http://`` added if no scheme.
    """
    values = os.environ if env is None else env
    chosen = DEFAULT_GATEWAY
    if flag and flag.rstrip("/") != DEFAULT_GATEWAY:
        chosen = flag
    elif yaml_gateway and yaml_gateway.rstrip("/") != DEFAULT_GATEWAY:
        chosen = yaml_gateway
    elif values.get("OPENFAAS_URL"):
        chosen = values["OPENFAAS_URL"]
    chosen = chosen.strip().lower().rstrip("/")
    if "://" not in chosen:
        chosen = "http://" + chosen
    return chosen
