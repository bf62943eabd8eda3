"""One command line per component, rendered from its settings class and parsed back into it.

A component's settings class derives from :class:`CommandLineSettings` and names its module
and one flag per setting (``FLAGS``). ``python -m <module>`` parses its command line with
:meth:`~CommandLineSettings.from_argv`; every launcher (``fedfaas up``, tests, benchmarks)
renders it with :meth:`~CommandLineSettings.to_argv`. So the flags live in one table and no
command line is written out by hand::

    class TrackerSettings(CommandLineSettings):
        MODULE: ClassVar[str] = "request_tracker"
        FLAGS: ClassVar[dict[str, str]] = {"host": "--host", "port": "--port", ...}

    argv = TrackerSettings(port=8092, engine_url=url).to_argv()   # the launcher
    settings, log_level = TrackerSettings.from_argv(sys.argv[1:])  # python -m request_tracker

Secrets never go on a command line (``ps`` shows it to every user) nor into the environment
(``/proc/<pid>/environ``): a setting holds the PATH of a secret file (mode 0600), which the
component reads at start (``admin_token_file``, ``redis_credentials_file``, ...).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol, Self, TypeVar, cast

from pydantic import ValidationError
from pydantic_settings import BaseSettings


class CommandLineSettings(BaseSettings):
    """Settings that are also a ``python -m MODULE`` command line (see the module docstring).

    Class attributes
    ----------------
    MODULE : the component's module (``python -m MODULE``).
    FLAGS : setting -> flag. A boolean's flag is the one that turns its default over
        (``--no-ebpf`` for a ``True`` default, ``--lazy`` for a ``False`` one); a mapping's
        value is JSON. A class that does not list them gets one per setting, named after it
        (``stop_grace``: ``--stop-grace``; ``--no-...`` for a ``True`` boolean), but for
        ``FLAG_NAMES`` (setting -> another flag) and ``NO_FLAG`` (settings without one).
    DESCRIPTION : the ``--help`` text.
    """

    MODULE: ClassVar[str]
    FLAGS: ClassVar[Mapping[str, str]]
    FLAG_NAMES: ClassVar[Mapping[str, str]] = {}
    NO_FLAG: ClassVar[frozenset[str]] = frozenset()
    DESCRIPTION: ClassVar[str] = ""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        owner = next((c for c in cls.__mro__ if "FLAGS" in c.__dict__), None)
        if owner is None or owner in _FLAGS_FROM_FIELDS:  # none listed: one per setting
            cls.FLAGS = {
                name: cls.FLAG_NAMES.get(name) or _flag(name, info.get_default())
                for name, info in cls.model_fields.items()
                if name not in cls.NO_FLAG
            }
            _FLAGS_FROM_FIELDS.add(cls)

    def to_argv(self, python: str = sys.executable, log_level: str | None = None) -> list[str]:
        """``[python, "-m", MODULE, flags...]`` that runs these settings.

        Every setting with a flag is rendered (booleans only when they differ from the
        default), so the command line, which wins over the environment, says it all.

        Raises
        ------
        ValueError
            If a setting that differs from its default has no flag.
        """
        cls = type(self)
        argv = [python, "-m", cls.MODULE]
        for name, info in cls.model_fields.items():
            value = getattr(self, name)
            default = info.get_default(call_default_factory=True)
            flag = cls.FLAGS.get(name)
            if flag is None:
                if value != default:
                    raise ValueError(f"setting {name!r} has no flag of `python -m {cls.MODULE}`")
                continue
            if isinstance(value, bool):
                if value != default:
                    argv.append(flag)
            elif isinstance(value, Mapping):
                argv += [flag, json.dumps(dict(value), sort_keys=True, default=str)]
            elif value is not None:
                argv += [flag, str(value)]
        if log_level:
            argv += ["--log-level", log_level]
        return argv

    @classmethod
    def parser(cls) -> argparse.ArgumentParser:
        """The ``python -m MODULE`` argument parser, one flag per :attr:`FLAGS` entry."""
        p = argparse.ArgumentParser(prog=f"python -m {cls.MODULE}", description=cls.DESCRIPTION)
        prefix = str(cls.model_config.get("env_prefix", ""))
        for name, flag in cls.FLAGS.items():
            info = cls.model_fields[name]
            doc = f"{name} (env {prefix}{name.upper()}; default {info.get_default()!r})"
            if _kind(info.annotation) is bool:
                store = "store_false" if info.get_default() else "store_true"
                p.add_argument(flag, dest=name, action=store, default=None, help=doc)
            elif _kind(info.annotation) is dict:
                p.add_argument(flag, dest=name, type=_json_object, metavar="JSON", help=doc)
            else:
                p.add_argument(flag, dest=name, help=doc)
        p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
        return p

    @classmethod
    def from_argv(cls, argv: list[str] | None = None) -> tuple[Self, str]:
        """Parse a command line into ``(settings, log level)``; exits 2 on a bad one, as
        argparse does, naming the setting that is wrong."""
        p = cls.parser()
        ns = vars(p.parse_args(argv))
        log_level = str(ns.pop("log_level")).upper()
        try:
            return cls(**{k: v for k, v in ns.items() if v is not None}), log_level
        except ValidationError as exc:
            problems = "; ".join(
                f"{cls.FLAGS.get(str(e['loc'][0]), e['loc'][0])}: {e['msg']}"
                if e["loc"]
                else e["msg"]  # a rule across settings: its message names the flags
                for e in exc.errors()
            )
            p.error(problems)


S = TypeVar("S", bound=CommandLineSettings)
#: the settings classes whose :attr:`~CommandLineSettings.FLAGS` are made from their fields
_FLAGS_FROM_FIELDS: set[type[CommandLineSettings]] = set()


def _flag(name: str, default: Any) -> str:
    """A setting's own flag: its name, with ``--no-`` where it turns a ``True`` default off."""
    return ("--no-" if default is True else "--") + name.replace("_", "-")


class ServiceSettings(Protocol):
    """What :func:`run_service` reads of an HTTP service's settings."""

    host: str
    port: int
    stop_grace: float


def configure_logging(level: str) -> None:
    """The components' log lines at ``level``; httpx's per-request lines only from WARNING."""
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)


def run_service(settings: type[S], create_app: Callable[[S], Any], argv: list[str] | None) -> int:
    """``python -m MODULE``'s main of an HTTP service: parse ``argv`` into ``settings``, log
    (:func:`configure_logging`) and serve ``create_app(settings)`` on its ``host`` and ``port``
    until a signal (:func:`core.shutdown.serve`, with its ``stop_grace``)."""
    from core.shutdown import serve  # uvicorn: only where a service runs
    from core.tls import TlsError, TlsSettings

    s, log_level = settings.from_argv(argv)
    configure_logging(log_level)
    where = cast(ServiceSettings, s)
    try:  # a service with TlsSettings serves HTTPS when they name a certificate
        tls = s.tls() if isinstance(s, TlsSettings) else None
    except TlsError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    app = create_app(s)
    return serve(app, host=where.host, port=where.port, grace=where.stop_grace, tls=tls)


def _kind(annotation: Any) -> Any:
    """``bool``, ``dict`` or something else, seen through ``X | None``."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    base = typing.get_origin(annotation) or annotation
    if args and base not in (dict, Mapping):
        base = typing.get_origin(args[0]) or args[0]
    return dict if base in (dict, Mapping) else base


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError('expected a JSON object, e.g. {"name": "value"}')
    return value
