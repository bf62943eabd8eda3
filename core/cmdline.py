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
import sys
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Self

from pydantic import ValidationError
from pydantic_settings import BaseSettings


class CommandLineSettings(BaseSettings):
    """Settings that are also a ``python -m MODULE`` command line (see the module docstring).

    Class attributes
    ----------------
    MODULE : the component's module (``python -m MODULE``).
    FLAGS : setting -> flag. A boolean's flag is the one that turns its default over
        (``--no-ebpf`` for a ``True`` default, ``--lazy`` for a ``False`` one); a mapping's
        value is JSON.
    DESCRIPTION : the ``--help`` text.
    """

    MODULE: ClassVar[str]
    FLAGS: ClassVar[Mapping[str, str]]
    DESCRIPTION: ClassVar[str] = ""

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
