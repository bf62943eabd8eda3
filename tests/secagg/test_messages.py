"""Stage messages from the network: every malformed one is refused with a MessageError that
says what is wrong (the HTTP stages will answer it as a 400), and the coordinator refuses
messages out of turn."""

from __future__ import annotations

from typing import Any

import pytest

from core.secagg.config import SecAggConfig
from core.secagg.coordinator import Coordinator, RoundFailed
from core.secagg.messages import (
    Advert,
    MessageError,
    b64,
    context,
    envelopes_from_json,
    unmask_from_json,
)
from core.secagg.participant import Participant

GOOD = {"c_pk": b64(bytes(32)), "s_pk": b64(bytes(32)), "b_commit": b64(bytes(32))}


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ([], "an advert is an object"),
        ({**GOOD, "extra": ""}, "an advert is an object"),
        ({**GOOD, "c_pk": "***"}, "c_pk is not valid base64"),
        ({**GOOD, "s_pk": b64(bytes(31))}, "s_pk must be 32 bytes, not 31"),
        ({**GOOD, "b_commit": 5}, "b_commit must be a base64 string"),
        ({**GOOD, "c_pk": "A" * 5000}, "c_pk must be a base64 string"),
    ],
)
def test_bad_adverts_say_what_is_wrong(body: Any, says: str) -> None:
    with pytest.raises(MessageError, match=says):
        Advert.from_json(body)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"s": {}}, "an unmask message is an object with s and b"),
        ({"s": [], "b": {}}, "s must be an object of at most 3 owners"),
        ({"s": {}, "b": {"x": [1]}}, r"b\[x\] must be \[index, share\]"),
        ({"s": {}, "b": {"x": [True, b64(bytes(16))]}}, r"b\[x\] must be \[index, share\]"),
        ({"s": {"x": [9, b64(bytes(16))]}, "b": {}}, r"s\[x\]: index out of range"),
        ({"s": {"x": [1, b64(bytes(15))]}, "b": {}}, r"s\[x\] must be 16 bytes"),
    ],
)
def test_bad_unmask_messages_say_what_is_wrong(body: Any, says: str) -> None:
    with pytest.raises(MessageError, match=says):
        unmask_from_json(body, 3)


def test_too_many_envelopes_are_refused() -> None:
    with pytest.raises(MessageError, match="at most 2 peers"):
        envelopes_from_json({p: b64(b"x" * 40) for p in "abc"}, 2)


def test_the_coordinator_refuses_messages_out_of_turn() -> None:
    cfg, ctx = SecAggConfig(), context("job-c", 1)
    parts = {c: Participant(cfg, c, ctx) for c in ("a", "b", "c", "d")}
    server = Coordinator(cfg, ctx)
    server.add_advert("a", parts["a"].advertise())
    with pytest.raises(MessageError, match="a already advertised"):
        server.add_advert("a", parts["a"].advertise())
    with pytest.raises(RoundFailed, match="at least 3 clients, not 1"):
        server.close_adverts()
    for c in "bcd":
        server.add_advert(c, parts[c].advertise())
    roster = server.close_adverts()
    with pytest.raises(MessageError, match="the advertise stage is closed"):
        server.add_advert("e", parts["a"].advertise())
    with pytest.raises(MessageError, match="a did not share its keys"):
        server.add_masked("a")
    envelopes = parts["a"].share_keys(roster)
    with pytest.raises(MessageError, match="one envelope to each of its neighbours"):
        server.add_envelopes("a", dict(list(envelopes.items())[:1]))
    server.add_envelopes("a", envelopes)
    with pytest.raises(MessageError, match="a already shared its keys"):
        server.add_envelopes("a", envelopes)
    with pytest.raises(MessageError, match="e did not advertise"):
        server.add_envelopes("e", envelopes)
