"""``python -m runtime --host H --port P --stack stack.yml --state-dir DIR --auth-dir DIR``.

The flags are ``RuntimeSettings.FLAGS`` (``--nodes '{"node0": "/run/node0.sock"}'`` places
replicas on node gateways).
"""

from __future__ import annotations

import logging
import sys

from core.shutdown import serve
from core.tls import TlsError
from runtime.app import create_app
from runtime.settings import RuntimeSettings


def main(argv: list[str] | None = None) -> None:
    settings, log_level = RuntimeSettings.from_argv(argv)
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per health probe otherwise
    try:  # TLS files that cannot work (the runtime's or its replicas'): exit 2 saying why
        tls = settings.tls()
        app = create_app(settings)
    except TlsError as exc:
        sys.stderr.write(f"error: {exc}\n")
        sys.exit(2)
    # in-flight calls get half the grace, the replicas' stop (stop_grace each, in parallel)
    # the other half
    serve(
        app,
        host=settings.host,
        port=settings.port,
        grace=2 * settings.stop_grace + 10,
        log_level=log_level,
        tls=tls,
    )


if __name__ == "__main__":
    main()
