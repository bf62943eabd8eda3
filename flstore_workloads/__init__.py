"""FLStore non-training workloads as pure functions over in-memory FL data.

Inputs are flat float32 vectors (client updates, global models; possibly read-only views, never
written), per-client and per-round metadata dicts, and an optional :class:`Evaluator` (a validation
set). Each :class:`Workload` validates its parameters, states what data a query needs
(:meth:`Workload.requirements`, mapped by the cache engine to a policy P1-P4) and returns a
JSON-serialisable dict. See ``README.md`` beside this file for the registry table.

Example
-------
>>> import flstore_workloads as workloads
>>> data = workloads.WorkloadData(updates={1: {...}}, globals={0: g0}, client_meta={1: {...}})
>>> workloads.get("multi-krum").run(data, {"round": 1, "f": 1})  # doctest: +SKIP
"""

from ._linalg import GramCache
from .base import Workload
from .data import Evaluator, MetricsEvaluator, Requirements, WorkloadData
from .errors import DataMismatch, InvalidParams, MissingData, UnknownWorkload, WorkloadError
from .evaluation import TorchEvaluator, flatten_module, load_flat
from .registry import WORKLOADS, get

__all__ = [
    "WORKLOADS",
    "DataMismatch",
    "Evaluator",
    "GramCache",
    "InvalidParams",
    "MetricsEvaluator",
    "MissingData",
    "Requirements",
    "TorchEvaluator",
    "UnknownWorkload",
    "Workload",
    "WorkloadData",
    "WorkloadError",
    "flatten_module",
    "get",
    "load_flat",
]
