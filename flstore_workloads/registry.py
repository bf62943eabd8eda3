"""The workload registry: name -> :class:`Workload`."""

from __future__ import annotations

from typing import Any

from . import clustering, contribution, evaluation, provenance, robust, scheduling, tracking
from .base import Workload
from .errors import UnknownWorkload

_ALL: list[Workload[Any]] = [
    Workload(
        "cosine-to-aggregate",
        "cosine of each update to the weighted aggregate; flag the bottom-k",
        "P2",
        "all updates of `round` (or `clients`), globals[round-1], n_samples of the round",
        robust.CosineParams,
        robust.cosine_requirements,
        robust.run_cosine,
    ),
    Workload(
        "multi-krum",
        "Krum scores from exact pairwise distances; select the m lowest, flag the rest",
        "P2",
        "all updates of `round` (or `clients`), globals[round-1]",
        robust.KrumParams,
        robust.krum_requirements,
        robust.run_krum,
    ),
    Workload(
        "foolsgold",
        "FoolsGold weights from cosines of each client's summed updates over a window",
        "P3",
        "updates of rounds first_round..last_round, globals[first_round-1..last_round-1]",
        robust.FoolsGoldParams,
        robust.foolsgold_requirements,
        robust.run_foolsgold,
    ),
    Workload(
        "leave-one-out",
        "phi_i = v(N) - v(N minus i) on the validation set",
        "P2",
        "all updates of `round`, globals[round-1], n_samples, evaluator",
        contribution.LooParams,
        contribution.contribution_requirements,
        contribution.run_loo,
    ),
    Workload(
        "shapley",
        "Shapley values of the round's clients (GTG-Shapley, TMC or exact)",
        "P2",
        "all updates of `round`, globals[round-1], n_samples, evaluator",
        contribution.ShapleyParams,
        contribution.contribution_requirements,
        contribution.run_shapley,
    ),
    Workload(
        "incentives",
        "split a budget in proportion to positive contributions (LOO, GTG or exact)",
        "P2",
        "all updates of `round`, globals[round-1], n_samples, evaluator",
        contribution.IncentiveParams,
        contribution.contribution_requirements,
        contribution.run_incentives,
    ),
    Workload(
        "oort",
        "Oort utility scores and a selection of k clients for `round`",
        "P4",
        "client metadata (n_samples, loss or loss_sq_mean or losses, duration_s) of the window",
        scheduling.OortParams,
        scheduling.oort_requirements,
        scheduling.run_oort,
    ),
    Workload(
        "kmeans",
        "k-means on the updates with silhouettes (k chosen by silhouette if omitted)",
        "P2",
        "all updates of `round` (or `clients`), globals[round-1]",
        clustering.KMeansParams,
        clustering.kmeans_requirements,
        clustering.run_kmeans,
    ),
    Workload(
        "personalize",
        "peer-mixture model for one client (similarity top-k or its k-means cluster)",
        "P2",
        "all updates of `round`, globals[round-1] (and globals[round] if alpha < 1), n_samples",
        clustering.PersonalizeParams,
        clustering.personalize_requirements,
        clustering.run_personalize,
    ),
    Workload(
        "provenance",
        "each client's exact share of the global model's change over a round range",
        "P3",
        "updates of the range (one client suffices), globals[first-1..last], n_samples of every participant",
        provenance.ProvenanceParams,
        provenance.provenance_requirements,
        provenance.run_provenance,
    ),
    Workload(
        "track",
        "hyperparameter/metric series, config diffs, plateau and divergence checks",
        "P4",
        "round metadata (and client metadata) of the last `window` rounds",
        tracking.TrackParams,
        tracking.track_requirements,
        tracking.run_track,
    ),
    Workload(
        "evaluate",
        "accuracy and loss of the global model (or a client's) on the validation set",
        "P1",
        "globals[round] (or the client's update of `round` and globals[round-1]), evaluator",
        evaluation.EvaluateParams,
        evaluation.evaluate_requirements,
        evaluation.run_evaluate,
    ),
]

WORKLOADS: dict[str, Workload[Any]] = {w.name: w for w in _ALL}


def get(name: str) -> Workload[Any]:
    """The registered workload ``name``; raises :class:`UnknownWorkload` listing the known ones."""
    try:
        return WORKLOADS[name]
    except KeyError:
        raise UnknownWorkload(name, sorted(WORKLOADS)) from None
