"""``fedfaas``: run a FedFaaS node on one machine and deploy functions to it.

    fedfaas up [--state-dir DIR]        start MinIO, Redis, the runtime; deploy stack.yml + the aggregator
    fedfaas status [--state-dir DIR]    each part, its address, PID, readiness; eBPF mode
    fedfaas down [--state-dir DIR]      stop everything, leave DIR clean (logs kept)
    fedfaas deploy -f stack.yml         what `faas-cli deploy -f stack.yml` does
    fedfaas demo [--state-dir DIR]      the main job: real FL training over two node gateways
    fedfaas calibrate --gateway URL ... measure a node's capacity MC (LIFL appendix E)

Each subcommand is a ``register(subparsers)`` function that adds its parser and sets
``handler``; add one to :data:`COMMANDS` (or, from another package, to :data:`PLUGINS` as
``"module:function"``). Handlers return the exit code. Exit codes: 0 ok, 1 failure,
2 bad command line, 3 ``status`` of a platform that is not running.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("fedfaas")

Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]
EXIT_FAILURE, EXIT_USAGE, EXIT_NOT_RUNNING = 1, 2, 3


def _existing_file(value: str) -> Path:
    path = Path(value)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {value}")
    return path.resolve()


def _existing_dir(value: str) -> Path:
    path = Path(value)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"no such folder: {value}")
    return path.resolve()


def _state_dir(value: str) -> Path:
    path = Path(value).resolve()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value} exists and is not a folder")
    return path


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {value!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range 0-65535: {port}")
    return port


def _part_names(value: str) -> list[str]:
    from fedfaas.platform.optional import OPTIONAL

    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n != "all" and n not in OPTIONAL]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown part(s) {', '.join(unknown) or value!r}; choose from "
            f"{', '.join(OPTIONAL)} or all"
        )
    return names


def _add_state_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--state-dir",
        type=_state_dir,
        default=None,
        metavar="DIR",
        help="folder for state, secrets, data and logs (default: $FEDFAAS_STATE_DIR or ./.state)",
    )


def _settings(args: argparse.Namespace, **extra: Any) -> Any:
    from fedfaas.settings import load_settings

    return load_settings(state_dir=getattr(args, "state_dir", None), **extra)


# --- up ------------------------------------------------------------------------------------------


def register_up(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "up",
        help="start MinIO, Redis and the runtime; deploy the stack",
        description="Start the node's parts in order, each ready before the next, "
        "deploy the stack, and leave them running. Ports: the usual "
        "one if free, else any free one; 0 = any; N = exactly N.",
    )
    _add_state_dir(p)
    p.add_argument(
        "--stack",
        type=_existing_file,
        default=None,
        metavar="FILE",
        help="stack file to deploy (default: ./stack.yml)",
    )
    for name in ("runtime", "minio", "minio-console", "redis"):
        p.add_argument(f"--{name}-port", type=_port, default=None, metavar="PORT")
    p.add_argument(
        "--with",
        dest="with_parts",
        type=_part_names,
        default=None,
        metavar="PART[,PART]",
        help="also run optional parts: gateway, cache-engine, request-tracker, control-plane, "
        "console, prometheus (the console then takes its rates from it), or all (every one "
        "but prometheus; default: $FEDFAAS_WITH_PARTS or none)",
    )
    p.add_argument(
        "--openfaas-gateway",
        type=_existing_file,
        default=None,
        metavar="PATH",
        help="run OpenFaaS's own gateway binary PATH (and a Prometheus, Debian's `prometheus`) "
        "in front of the runtime; the optional parts reach functions through it. It listens "
        "on :8080 and :8082 (fixed upstream, every interface)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds each part may take to become ready",
    )
    p.add_argument(
        "--shm-dir",
        type=_existing_dir,
        default=None,
        metavar="DIR",
        help="memory file system for the node gateways' object stores (default: "
        "$FEDFAAS_SHM_DIR or /dev/shm); a tmpfs of its own caps their memory",
    )
    p.add_argument(
        "--tls",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="serve HTTPS on the runtime, the node gateways, the cache engine, the request "
        "tracker, the control plane and the console, with a CA and per-part certificates "
        "minted into the state's secrets/tls (the parts call each other over mTLS; the SDK "
        "takes ca_file=secrets/tls/ca.crt); --no-tls serves plain HTTP (default: $FEDFAAS_TLS "
        "or on)",
    )
    p.set_defaults(handler=run_up)


def run_up(args: argparse.Namespace) -> int:
    from fedfaas.platform import Platform, render_status

    settings = _settings(
        args,
        stack_file=args.stack,
        runtime_port=args.runtime_port,
        minio_port=args.minio_port,
        minio_console_port=args.minio_console_port,
        redis_port=args.redis_port,
        start_timeout=args.timeout,
        with_parts=args.with_parts,
        shm_dir=args.shm_dir,
        tls=args.tls,
    )
    platform = Platform(settings, openfaas_gateway=args.openfaas_gateway)
    result = platform.up()
    print("already running" if result.already_running else "fedfaas is up")
    print(render_status(platform.status()))
    print(f"basic auth for /system/*: {settings.state_dir}/secrets/basic-auth-{{user,password}}")
    print(
        f"logs: {settings.state_dir}/logs/; stop with `fedfaas down --state-dir {settings.state_dir}`"
    )
    return 0


# --- down ----------------------------------------------------------------------------------------


def register_down(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("down", help="stop everything and clean the state folder")
    _add_state_dir(p)
    p.add_argument("--purge", action="store_true", help="remove the logs too")
    p.set_defaults(handler=run_down)


def run_down(args: argparse.Namespace) -> int:
    from fedfaas.platform import Platform

    settings = _settings(args)
    stopped = Platform(settings).down(purge=args.purge)
    print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
    kept = "" if args.purge else " (logs kept in logs/)"
    print(f"{settings.state_dir} is clean{kept}")
    return 0


# --- status --------------------------------------------------------------------------------------


def register_status(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("status", help="show each part, its address and PID, and the eBPF mode")
    _add_state_dir(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=run_status)


def run_status(args: argparse.Namespace) -> int:
    from fedfaas.platform import Platform, render_status

    report = Platform(_settings(args)).status()
    print(json.dumps(report.to_json(), indent=2) if args.json else render_status(report))
    if not report.running:
        return EXIT_NOT_RUNNING
    return 0 if report.healthy else EXIT_FAILURE


# --- deploy --------------------------------------------------------------------------------------


def register_deploy(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "deploy",
        help="deploy a stack file (as `faas-cli deploy -f`)",
        description="PUT each function to /system/functions, POST on 404. "
        "Without --gateway, deploys to the platform running in "
        "--state-dir (with its credentials) if there is one.",
    )
    p.add_argument(
        "-f",
        "--yaml",
        dest="stack",
        type=_existing_file,
        required=True,
        metavar="STACK",
        help="stack file, e.g. stack.yml",
    )
    p.add_argument(
        "-g",
        "--gateway",
        default=None,
        metavar="URL",
        help="gateway URL (default: the local platform, else as faas-cli resolves it)",
    )
    p.add_argument("--filter", default=None, metavar="GLOB", help="only functions matching GLOB")
    p.add_argument("--replace", action="store_true", help="DELETE each function first")
    p.add_argument(
        "--auth-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="folder with basic-auth-user and basic-auth-password (required unless the "
        "local platform is the gateway)",
    )
    _add_state_dir(p)
    p.set_defaults(handler=run_deploy)


def run_deploy(args: argparse.Namespace) -> int:
    from core.stackfile import StackError
    from fedfaas.deploy import DeployError, deploy
    from fedfaas.platform import PlatformError, credentials, state
    from fedfaas.platform.context import Context

    auth = credentials.basic_auth(args.auth_dir) if args.auth_dir is not None else None
    st = state.load(_settings(args).state_dir) if args.gateway is None else None
    runtime = st.record("runtime") if st is not None else None
    url, resolve = args.gateway, True
    verify: Any = True
    if st is not None and runtime is not None:
        # the local platform: exactly its runtime, with its credentials (and its CA)
        url, resolve = runtime.address, False
        verify = Context.of(st).verify()
        if auth is None:
            auth = credentials.basic_auth(Path(st.state_dir) / "secrets")
    if auth is None:
        raise PlatformError(
            "no credentials for the gateway: --auth-dir DIR names the folder with its "
            "basic-auth-user and basic-auth-password (every gateway, the embedded runtime "
            "included, checks basic auth on /system/*)"
        )
    try:
        results = deploy(
            args.stack,
            url,
            auth=auth,
            filter=args.filter,
            replace=args.replace,
            resolve=resolve,
            verify=verify,
        )
    except (DeployError, StackError) as exc:
        raise PlatformError(str(exc)) from exc
    for r in results:
        print(f"Deployed. {r.status} {r.function} ({r.method})")
    if not results:
        print("no function matched" + (f" --filter {args.filter}" if args.filter else ""))
    return 0


# --- demo ----------------------------------------------------------------------------------------


def register_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo", help="run the main job: a real FL job over two node gateways, with a report"
    )
    _add_state_dir(p)
    p.add_argument(
        "--mode",
        choices=("sync", "async"),
        default="sync",
        help="async: the job runs FedBuff (buffered asynchronous FL) and a third of the "
        "clients are 5x slower",
    )
    p.set_defaults(handler=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if importlib.util.find_spec("fedfaas.demo") is not None:
        demo = importlib.import_module("fedfaas.demo")
        code = demo.run(settings.state_dir, demo.DemoConfig.from_env(args.mode))
        return int(code or 0)
    from fedfaas.platform import smoke

    smoke.run(settings, print)
    return 0


# --- calibrate -----------------------------------------------------------------------------------


def _levels(value: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {value!r}") from None
    if not levels or any(n < 1 for n in levels) or list(levels) != sorted(set(levels)):
        raise argparse.ArgumentTypeError(f"levels must be increasing positive integers: {value!r}")
    return levels


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {n}")
    return n


def register_calibrate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "calibrate",
        help="measure a node's maximum service capacity MC (LIFL appendix E)",
        description="Raise the number of concurrent updates sent to one node gateway step by "
        "step until the time to aggregate them degrades; MC = k' * E' at that knee. The node "
        "needs warm aggregators: replicas of the `aggregator` function placed on it "
        "(`fedfaas up --with gateway` places them). Prints JSON.",
    )
    p.add_argument("--gateway", required=True, metavar="URL", help="the node gateway")
    p.add_argument(
        "--admin-secret-file",
        required=True,
        type=_existing_file,
        metavar="FILE",
        help="the admin secret (`fedfaas up`: <state>/secrets/gateway-admin-secret)",
    )
    p.add_argument(
        "--params",
        type=_positive_int,
        default=1_000_000,
        help="float32 parameters in the test model (ResNet-18: 11181642; default 1000000)",
    )
    p.add_argument("--levels", type=_levels, default=(1, 2, 4, 8, 16), metavar="N,N,...")
    p.add_argument("--repeats", type=_positive_int, default=2)
    p.add_argument(
        "--ca-file",
        type=_existing_file,
        default=None,
        metavar="FILE",
        help="verify an https gateway against this CA (default: the CA of the platform in "
        "--state-dir, <state>/secrets/tls/ca.crt, when it has one, else the system's CAs)",
    )
    _add_state_dir(p)
    p.set_defaults(handler=run_calibrate)


def run_calibrate(args: argparse.Namespace) -> int:
    import asyncio

    import httpx
    import numpy as np

    from control_plane.calibrate import measure_gateway
    from control_plane.errors import ControlPlaneError
    from core.wire import encode_tensors

    ca_file = args.ca_file
    if ca_file is None:  # the local platform's CA (fedfaas up serves TLS by default)
        platform_ca = _settings(args).state_dir / "secrets" / "tls" / "ca.crt"
        ca_file = platform_ca if platform_ca.is_file() else None
    rng = np.random.default_rng(0)
    initial = encode_tensors({"w": np.zeros(args.params, dtype=np.float32)})
    update = encode_tensors({"w": rng.standard_normal(args.params, dtype=np.float32)})
    try:
        result = asyncio.run(
            measure_gateway(
                args.gateway.rstrip("/"),
                initial,
                update,
                args.admin_secret_file.read_text().strip(),
                args.levels,
                1.5,
                args.repeats,
                "calibrate",
                120.0,
                ca_file,
            )
        )
    except (ControlPlaneError, httpx.HTTPError) as exc:
        print(f"fedfaas calibrate: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    print(
        json.dumps(
            {
                "mc": result.mc,
                "knee_level": result.knee_level,
                "levels": list(result.levels),
                "updates_per_s": list(result.rates),
                "exec_s": list(result.exec_times),
                "params": args.params,
            }
        )
    )
    return 0


# --- wiring --------------------------------------------------------------------------------------

#: Subcommands, in the order ``--help`` lists them.
COMMANDS: list[Register] = [
    register_up,
    register_status,
    register_down,
    register_deploy,
    register_demo,
    register_calibrate,
]
#: Subcommands of other packages, as ``"module:function"``, imported when the parser is built.
PLUGINS: list[str] = []


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedfaas",
        description="FedFaaS: serverless federated learning on one machine or on OpenFaaS.",
    )
    verbosity = parser.add_mutually_exclusive_group()
    verbosity.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    verbosity.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in COMMANDS:
        register(sub)
    for spec in PLUGINS:
        module, _, func = spec.partition(":")
        getattr(importlib.import_module(module), func)(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fedfaas`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="[%(name)s] %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(max(level, logging.WARNING))  # a line per request
    from fedfaas.platform import PlatformError

    try:
        return int(args.handler(args))
    except (PlatformError, OSError) as exc:  # OSError: a file named on the command line
        log.debug("failed", exc_info=True)
        print(f"fedfaas {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print(f"fedfaas {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `fedfaas status | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
