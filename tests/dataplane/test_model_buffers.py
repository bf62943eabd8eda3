"""The gateway encodes each round's model into a buffer no reader holds any more (its pages are in
place, so publication pays no page faults), never into one a response is still sending."""

from __future__ import annotations

import numpy as np

from core import wire
from gateway.creation import served_model
from gateway.jobs import MODEL_BUFFERS, Job


def _job() -> Job:
    job = Job.__new__(Job)  # only the model buffers are used here
    job.model_buffers = []
    return job


def _root(view: memoryview) -> object:
    """The array a view was written into (numpy slices chain their bases)."""
    arr = view.obj
    while isinstance(arr, np.ndarray) and arr.base is not None:
        arr = arr.base
    return arr


def _publish(job: Job, src: bytearray, spec: wire.ModelSpec, rnd: int) -> memoryview:
    view = wire.encode_view(src, spec, {"round": str(rnd)}, out=job.free_model_buffer())
    job.keep_model_buffer(view)
    return view


def test_a_buffer_is_written_again_only_once_no_view_of_it_is_alive() -> None:
    spec = wire.ModelSpec.build([("a", "F32", (1000,)), ("b", "BF16", (10,))])
    src = bytearray(spec.object_nbytes)
    np.frombuffer(src, np.float32, 1000, spec.by_name()["a"].offset)[:] = 1.5
    job = _job()
    served = _publish(job, src, spec, 1)
    first = bytes(served)
    assert job.free_model_buffer() is None  # the served model is read
    sending = served.cast("B")  # a response still sending round 1's model
    served = _publish(job, src, spec, 2)  # round 2 goes to a second buffer
    assert len(job.model_buffers) == MODEL_BUFFERS and bytes(sending) == first
    assert job.free_model_buffer() is None
    del sending  # the download ended
    reused = job.free_model_buffer()
    assert reused is not None and reused is job.model_buffers[0]
    del reused
    third = _publish(job, src, spec, 3)
    assert _root(third) is job.model_buffers[0]  # written in place, no new allocation
    assert bytes(third) == wire.encode(src, spec, {"round": "3"})
    assert bytes(served) == wire.encode(src, spec, {"round": "2"})  # untouched


def test_buffers_reserved_at_install_serve_the_first_rounds_with_no_new_allocation() -> None:
    spec = wire.ModelSpec.build([("w", "F32", (4096,)), ("b", "F32", (3,))])
    src = bytearray(spec.object_nbytes)
    job = _job()
    job.spec = spec
    job.reserve_model_buffers()
    # ids only: a reference held here would count as a reader
    reserved = [id(b) for b in job.model_buffers]
    assert len(reserved) == MODEL_BUFFERS
    assert all(b.size >= wire.encoded_nbytes(spec, {"round": "123456"}) for b in job.model_buffers)
    one = _publish(job, src, spec, 1)
    two = _publish(job, src, spec, 2)
    assert id(_root(one)) == reserved[0] and id(_root(two)) == reserved[1]
    del one  # round 1's model is no longer served
    three = _publish(job, src, spec, 123456)
    assert id(_root(three)) == reserved[0]
    assert [id(b) for b in job.model_buffers] == reserved
    assert bytes(three) == wire.encode(src, spec, {"round": "123456"})


def test_the_initial_model_is_served_from_a_model_buffer_that_later_rounds_reuse() -> None:
    # one model-sized copy fewer on the root: the initial model is not a separate bytes copy
    # beside the buffers reserved for the rounds' models
    spec = wire.ModelSpec.build([("w", "F32", (4096,)), ("b", "F32", (3,))])
    src = bytearray(spec.object_nbytes)
    np.frombuffer(src, np.float32, 4096, spec.by_name()["w"].offset)[:] = 0.25
    body = wire.encode(src, spec, {"round": "0"})
    job = _job()
    job.spec = spec
    job.fedbuff = job.secagg = None
    initial = served_model(job, body, b"key", 0)  # what job creation serves
    assert isinstance(initial, memoryview) and initial.readonly and bytes(initial) == body
    initial_buf = id(_root(initial))  # an id: a reference held here would count as a reader
    assert [id(b) for b in job.model_buffers] == [initial_buf]
    assert job.model_buffers[0].size >= wire.encoded_nbytes(spec, {"round": "9" * 12})
    job.reserve_model_buffers()  # the root's install tops the buffers up, counting this one
    assert len(job.model_buffers) == MODEL_BUFFERS
    one = _publish(job, src, spec, 1)  # the initial model is still served: another buffer
    assert id(_root(one)) != initial_buf and bytes(initial) == body
    del initial  # no one reads the initial model any more
    two = _publish(job, src, spec, 2)
    assert id(_root(two)) == initial_buf  # its buffer takes round 2's model, in place
    assert bytes(two) == wire.encode(src, spec, {"round": "2"})
    assert len(job.model_buffers) == MODEL_BUFFERS
