"""Accounting rules shared by both backends, and decoding of the kernel's map values."""

from __future__ import annotations

from bpf.frame import Kind
from bpf.metrics import EP_METRICS, Accounting, DropReason, decode_drops, decode_ep_metrics


def test_delivered_frame_counts_for_sender_and_receiver() -> None:
    acct = Accounting()
    acct.add(1)
    acct.add(2)
    acct.delivered(1, 2, Kind.TASK, 64, now=100)
    acct.delivered(1, 2, Kind.TASK, 64, now=250)
    m = acct.snapshot()
    assert (m[1].msgs_sent, m[1].bytes_sent, m[1].last_send_ns) == (2, 128, 250)
    assert (m[2].msgs_received, m[2].bytes_received, m[2].last_recv_ns) == (2, 128, 250)
    assert m[1].msgs_received == 0 and m[2].msgs_sent == 0


def test_exec_time_runs_from_first_update_received_to_partial_sent() -> None:
    acct = Accounting()
    for i in (1, 2, 3):
        acct.add(i)
    acct.delivered(1, 2, Kind.UPDATE, 64, now=1_000)  # opens the task on 2
    acct.delivered(1, 2, Kind.UPDATE, 64, now=5_000)  # does not move the start
    assert acct.snapshot()[2].task_open
    assert acct.snapshot()[2].exec_ns is None
    acct.delivered(2, 3, Kind.PARTIAL, 64, now=9_000)
    m = acct.snapshot()[2]
    assert m.first_update_recv_ns == 1_000 and m.result_sent_ns == 9_000
    assert m.exec_ns == 8_000 and m.tasks_completed == 1 and not m.task_open
    # The next UPDATE opens a new task (aggregator reuse); RESULT closes it too.
    acct.delivered(1, 2, Kind.UPDATE, 64, now=20_000)
    acct.delivered(2, 3, Kind.RESULT, 64, now=23_000)
    m = acct.snapshot()[2]
    assert m.exec_ns == 3_000 and m.exec_ns_total == 11_000 and m.tasks_completed == 2
    assert m.mean_exec_ns == 5_500


def test_partial_without_an_open_task_is_not_an_execution() -> None:
    acct = Accounting()
    acct.add(1)
    acct.add(2)
    acct.delivered(1, 2, Kind.PARTIAL, 64, now=10)
    assert acct.snapshot()[1].tasks_completed == 0
    assert acct.snapshot()[1].exec_ns is None


def test_drops_count_by_reason_and_against_the_sender() -> None:
    acct = Accounting()
    acct.add(1)
    acct.dropped(1, DropReason.CROSS_JOB)
    acct.dropped(1, DropReason.CROSS_JOB)
    acct.dropped(None, DropReason.BAD_SIZE)
    assert acct.drops()["cross_job"] == 2 and acct.drops()["bad_size"] == 1
    assert acct.snapshot()[1].drops == 2


def test_removed_endpoint_has_no_metrics() -> None:
    acct = Accounting()
    acct.add(1)
    acct.remove(1)
    assert acct.snapshot() == {}


def test_kernel_metrics_value_decodes_field_by_field() -> None:
    values = list(range(1, 14))  # tx_msgs .. drops in struct ep_metrics order
    m = decode_ep_metrics(5, EP_METRICS.pack(*values))
    assert EP_METRICS.size == 104
    assert (m.endpoint_id, m.msgs_sent, m.bytes_sent, m.msgs_received, m.bytes_received) == (
        5,
        1,
        2,
        3,
        4,
    )
    assert (m.last_send_ns, m.last_recv_ns, m.first_update_recv_ns) == (5, 6, 7)
    assert m.task_open  # open_since_ns = 8
    assert (m.result_sent_ns, m.exec_ns, m.exec_ns_total, m.tasks_completed, m.drops) == (
        9,
        10,
        11,
        12,
        13,
    )


def test_exec_is_none_until_a_task_completed() -> None:
    m = decode_ep_metrics(1, EP_METRICS.pack(*([0] * 13)))
    assert m.exec_ns is None and m.mean_exec_ns is None and not m.task_open


def test_drop_counters_are_named_by_reason() -> None:
    assert decode_drops([1, 2, 3, 4, 5, 6]) == {
        "bad_size": 1,
        "unknown_sender": 2,
        "spoofed_src": 3,
        "unknown_dst": 4,
        "cross_job": 5,
        "undeliverable": 6,
    }
    assert decode_drops([])["cross_job"] == 0
