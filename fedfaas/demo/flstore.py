"""The three questions the demo asks the request tracker after training, over HTTP as a user
would (``client.sdk.flstore_query``: ``POST /v1/queries?wait=true``), answered by FLStore from
the rounds the gateways checkpointed: who is malicious, what each client contributed, whom to
pick next."""

from __future__ import annotations

from typing import Any

from client.sdk import flstore_query


def three_questions(
    tracker_url: str,
    job: str,
    last_round: int,
    select: int,
    planted: str | None,
    token: str,
    ca_file: str | None = None,
) -> dict[str, Any]:
    """Ask who is malicious (Multi-Krum and cosine to the aggregate on ``last_round``), each
    client's contribution (GTG-Shapley on ``last_round``) and which ``select`` clients to pick
    for the next round (Oort over the rounds' client metadata, among the clients not flagged).
    ``token`` is the tracker's analyst token, ``ca_file`` the platform's CA (an https
    tracker). Returns the answers by name."""
    out: dict[str, Any] = {}
    krum = flstore_query(
        tracker_url,
        "multi-krum",
        job,
        rounds=[last_round],
        params={"f": 1},
        token=token,
        ca_file=ca_file,
    )
    cos = flstore_query(
        tracker_url, "cosine-to-aggregate", job, rounds=[last_round], token=token, ca_file=ca_file
    )
    flagged = list(krum["result"]["flagged"])
    out["malicious"] = {
        "round": last_round,
        "planted": planted,
        "flagged": flagged,
        "krum_scores": krum["result"]["scores"],
        "cosine_flagged": list(cos["result"]["flagged"]),
        "cosine": cos["result"]["cosine"],
        "found": planted is not None and flagged == [planted],
        "seconds": krum["latency_s"] + cos["latency_s"],
    }
    # at most 200 permutations: a few seconds for 20 clients, well inside the tracker's
    # per-function timeout on a busy machine, and the ranking is long settled by then
    shap = flstore_query(
        tracker_url,
        "shapley",
        job,
        rounds=[last_round],
        params={"method": "gtg", "max_permutations": 200},
        token=token,
        ca_file=ca_file,
    )
    values: dict[str, float] = shap["result"]["values"]
    out["shapley"] = {
        "round": last_round,
        "method": "gtg",
        "values": values,
        "lowest": min(values, key=values.__getitem__),
        "v_empty": shap["result"]["v_empty"],
        "v_full": shap["result"]["v_full"],
        "permutations": shap["result"]["permutations"],
        "converged": shap["result"]["converged"],
        "seconds": shap["latency_s"],
    }
    # Oort chooses among the clients Multi-Krum did not flag
    candidates = [c for c in sorted(values) if c not in flagged]
    params: dict[str, Any] = {"round": last_round + 1, "k": select}
    if len(candidates) >= select:
        params["candidates"] = candidates
    oort = flstore_query(tracker_url, "oort", job, params=params, token=token, ca_file=ca_file)
    out["oort"] = {
        "round": last_round + 1,
        "k": select,
        "candidates": params.get("candidates"),
        "selected": list(oort["result"]["selected"]),
        "ranking": list(oort["result"]["ranking"]),
        "seconds": oort["latency_s"],
    }
    return out
