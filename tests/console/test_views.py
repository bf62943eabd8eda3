"""The job page's derived views (pure functions over the control plane's job view)."""

from __future__ import annotations

from console.views import series, stragglers, timeline

VIEW = {
    "history": [
        {
            "round": 1,
            "state": "closed",
            "seconds": 3.5,
            "aggregated": 6,
            "received": 5,
            "published": True,
            "selected_by": "random",
        },
    ],
    "round": {
        "number": 2,
        "state": "open",
        "opened_at": 100.0,
        "deadline_at": 130.0,
        "received": {"node0": 2, "node1": 3},
        "clients_per_node": {"node0": 4, "node1": 3},
        "published": False,
        "reopened": 1,
        "selected_by": "oort",
    },
}


def test_the_timeline_has_the_ended_rounds_then_the_open_one() -> None:
    rows = timeline(VIEW, now=110.0)
    assert [(r["round"], r["state"]) for r in rows] == [(1, "closed"), (2, "open")]
    assert rows[0]["updates"] == 6  # the published model's count, not what the polls saw
    assert rows[1] == {
        "round": 2,
        "state": "open",
        "seconds": 10.0,
        "updates": 5,
        "published": False,
        "reopened": 1,
        "deadline_in_s": 20.0,
        "selected_by": "oort",
    }


def test_a_round_already_in_the_history_is_not_shown_twice() -> None:
    view = {**VIEW, "round": {**VIEW["round"], "number": 1, "state": "closed"}}
    assert [r["round"] for r in timeline(view, now=110.0)] == [1]


def test_stragglers_are_the_placed_clients_without_an_update() -> None:
    assert stragglers(VIEW) == {"node0": 2}
    assert stragglers({**VIEW, "round": {**VIEW["round"], "state": "closed"}}) == {}
    assert stragglers({"round": None}) == {}


def test_series_from_track_and_evaluate_answers() -> None:
    tracks = [
        {"clients": {"a": {"mean_loss": 1.0}, "b": {"mean_loss": 0.5}, "c": {"mean_loss": None}}},
        {"clients": {"a": {"mean_loss": None}}},
        None,
    ]
    evals = [{"metrics": {"accuracy": 0.8}}, None, {"metrics": {"accuracy": 0.9, "loss": 0.3}}]
    assert series([1, 2, 3], tracks, evals) == {
        "rounds": [1, 2, 3],
        "loss": [0.75, None, None],
        "accuracy": [0.8, None, 0.9],
    }
    assert series([], [], []) == {"rounds": [], "loss": [], "accuracy": []}
