"""A part's first call to Redis waits for it to listen, for a bounded time.

Where the parts start together (the chart's pods, faasd's containers), a part can start before
Redis listens: on Kubernetes the node gateway and the control plane exited ("Connection
refused") and sat in CrashLoopBackOff's back-off after every install. :func:`wait_for_redis`
pings until Redis answers, for at most ``wait_s`` seconds, logging each refusal at WARNING; a
refusal that waiting cannot mend (wrong credentials, a Redis that refuses the user) and the
last refusal past the deadline are raised, so the part still stops saying why.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis.asyncio as aioredis

log = logging.getLogger(__name__)

#: how long a starting part waits for Redis to listen
REDIS_START_WAIT_S = 60.0


async def wait_for_redis(
    client: aioredis.Redis, what: str, wait_s: float = REDIS_START_WAIT_S
) -> None:
    """Ping ``client`` until Redis answers; ``what`` names the part in the log. Raises the
    last connection error after ``wait_s`` seconds, any other error at once."""
    import redis.exceptions as rex

    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    delay = 0.2
    while True:
        try:
            await client.ping()
            return
        except (rex.ConnectionError, rex.TimeoutError) as exc:
            if isinstance(exc, rex.AuthenticationError) or loop.time() + delay > deadline:
                raise
            log.warning(
                "%s: Redis does not answer yet (%s); trying again in %.1f s", what, exc, delay
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
