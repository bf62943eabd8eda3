"""Entry point of FedFaaS's compose services under faasd: wait for servers, then run the service.

faasd starts compose services in ``depends_on`` order without waiting for any to be ready, and
never restarts one that exited: a node gateway that pinged Redis before Redis listened would stay
down. Each FedFaaS service therefore runs behind this script (bind-mounted read-only into its
container by docker-compose.yaml), which waits until every ``HOST:PORT`` accepts a TCP
connection and then replaces itself with the command::

    python wait-for.py [--timeout SECONDS] HOST:PORT... -- COMMAND...

After ``--timeout`` seconds (default 120) it exits 1, naming what did not answer. Standard
library only: it runs in the services image before anything of FedFaaS is imported.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host, int(port)


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:  # not resolvable yet (faasd adds a service's name when it starts) or closed
        return False


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print(
            "wait-for: usage: wait-for.py [--timeout S] HOST:PORT... -- COMMAND...", file=sys.stderr
        )
        return 2
    split = argv.index("--")
    command = argv[split + 1 :]
    p = argparse.ArgumentParser(prog="wait-for.py")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("servers", nargs="+", type=_address)
    ns = p.parse_args(argv[:split])
    if not command:
        p.error("no command after --")
    deadline = time.monotonic() + ns.timeout
    waiting = list(ns.servers)
    while waiting:
        waiting = [(h, port) for h, port in waiting if not _answers(h, port)]
        if waiting and time.monotonic() > deadline:
            names = ", ".join(f"{h}:{port}" for h, port in waiting)
            print(f"wait-for: {names} not answering after {ns.timeout:.0f}s", file=sys.stderr)
            return 1
        if waiting:
            time.sleep(0.2)
    os.execvp(command[0], command)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
