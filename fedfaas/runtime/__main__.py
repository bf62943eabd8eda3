"""``python -m fedfaas.runtime --host H --port P --stack stack.yml --state-dir DIR [--auth-dir DIR]``.

The flags are ``RuntimeSettings.FLAGS`` (``--nodes '{"node0": "/run/node0.sock"}'`` places
replicas on node gateways).
"""

from __future__ import annotations

import logging

import uvicorn

from fedfaas.runtime.app import create_app
from fedfaas.runtime.settings import RuntimeSettings


def main(argv: list[str] | None = None) -> None:
    settings, log_level = RuntimeSettings.from_argv(argv)
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per health probe otherwise
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=int(settings.stop_grace) + 5,
    )


if __name__ == "__main__":
    main()
