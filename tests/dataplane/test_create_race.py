"""A job being created is not loaded from the journal by the gateway's own housekeeping.

``create_job`` writes the job to the journal, then publishes its version 0 (a fenced
compare-and-set: several round trips), then installs it. The housekeeping loop, reading the
journal every ~0.2 s in between, took the job for one of this node's from before a restart,
found no model for it and closed its namespace, the very directory the job was being created
in: every endpoint grant of the job then failed ("No such file or directory", seen in the
fault campaign). Here the journal read runs exactly in that window.
"""

from __future__ import annotations

import asyncio
import shutil

import numpy as np
import pytest
from safetensors.numpy import save

from gateway.core import Gateway
from tests.dataplane.gwproc import gateway_settings

pytestmark = pytest.mark.integration


def test_the_journal_read_between_writing_and_installing_a_job_leaves_it_alone(
    tmp_path, redis_url
) -> None:  # type: ignore[no-untyped-def]
    s = gateway_settings(tmp_path, redis_url)

    async def run() -> None:
        gw = Gateway(s)
        await gw.start()
        try:
            publish = gw.journal.publish
            seen = []

            async def publish_with_a_load_between(*a, **kw):  # type: ignore[no-untyped-def]
                await gw._load_jobs()  # the housekeeping loop's read, in the window
                seen.append(sorted(gw.jobs))
                await publish(*a, **kw)

            gw.journal.publish = publish_with_a_load_between  # type: ignore[method-assign]
            w0 = save({"w": np.zeros(64, np.float32)})
            job = await gw.create_job("race", 2, 2, ["a", "b"], None, w0)
            assert seen == [[]]  # the read ran, and did not load the job
            assert gw.jobs["race"] is job
            assert job.ns.path.is_dir() and (job.ns.path / ".arena").exists()  # not closed
            await gw._load_jobs()  # once installed, the loop sees it as the same job
            assert gw.jobs["race"] is job
        finally:
            await gw.stop()

    try:
        asyncio.run(run())
    finally:
        shutil.rmtree(s.shm_root, ignore_errors=True)
