"""From a query to the objects it needs, and from held objects to a workload's data.

A query is ``{workload, job, rounds, clients, params}``. ``rounds``/``clients`` fill the workload's
``round``/``rounds``/``client``/``clients`` parameters when those are not already in ``params``.
The workload (``flstore_workloads``) states its :class:`Requirements`; this module maps them onto
:class:`ObjectKey` s against the catalog, and turns the objects a cache function (or a baseline
server) holds into a ``WorkloadData``. Used identically by the cache function, the engine, the
tracker and the baselines, so all of them answer the same queries with the same code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from cache_engine.catalog import Catalog
from cache_engine.errors import EngineError
from cache_engine.keys import ObjectKey, global_model, meta, update, valid_name


class QueryError(EngineError):
    """A query that cannot be served as asked (a 4xx)."""

    status, code = 400, "bad_query"


class UnknownJob(QueryError):
    status, code = 404, "unknown_job"


class RoundNotWritten(QueryError):
    status, code = 404, "round_not_written"


class UnknownClient(QueryError):
    status, code = 404, "unknown_client"


class BadParams(QueryError):
    status, code = 422, "invalid_params"


@dataclass
class Query:
    """A parsed query."""

    workload: str
    job: str
    rounds: list[int] = field(default_factory=list)
    clients: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The query as a JSON object: its fields by name."""
        return asdict(self)


@dataclass
class Plan:
    """What a query needs: its keys, the tailored policy and the workload's full params."""

    query: Query
    keys: list[ObjectKey]
    policy: str
    params: dict[str, Any]
    evaluator: bool = False


def _workload(name: str) -> Any:
    import flstore_workloads as workloads

    return workloads.get(name)


def merged_params(wl: Any, q: Query) -> dict[str, Any]:
    """``q.params`` with ``round(s)``/``client(s)`` filled from the query's top-level fields."""
    fields = set(getattr(wl.params_model, "model_fields", {}))
    p = dict(q.params)
    if q.rounds:
        if "round" in fields and "round" not in p:
            if len(q.rounds) != 1:
                raise BadParams(f"workload {q.workload!r} takes one round; got {q.rounds}")
            p["round"] = q.rounds[0]
        elif "rounds" in fields and "rounds" not in p:
            p["rounds"] = list(q.rounds)
    if q.clients:
        if len(q.clients) == 1 and "client" in fields and "client" not in p:
            p["client"] = q.clients[0]
        elif "clients" in fields and "clients" not in p:
            p["clients"] = list(q.clients)
        elif "client" in fields and "client" not in p:
            if len(q.clients) != 1:
                raise BadParams(f"workload {q.workload!r} takes one client; got {q.clients}")
            p["client"] = q.clients[0]
    return p


def plan(q: Query, catalog: Catalog) -> Plan:
    """Validate ``q`` against the workload registry and the catalog; list the keys it needs.

    Raises
    ------
    flstore_workloads.WorkloadError
        Unknown workload or invalid parameters (they carry ``status`` and ``to_dict``).
    QueryError
        Unknown job, a round not yet written, a client not in a round.
    """
    if not valid_name(q.job):
        raise BadParams(f"job {q.job!r} is not a valid job name")
    wl = _workload(q.workload)
    params = merged_params(wl, q)
    req = wl.requirements(params)
    written = set(catalog.rounds(q.job))
    if not written:
        raise UnknownJob(f"job {q.job!r} has no written rounds", job=q.job)
    keys: list[ObjectKey] = []

    def need_round(r: int, what: str) -> None:
        if r not in written:
            raise RoundNotWritten(
                f"round {r} of job {q.job!r} is not written yet ({what}); written rounds: "
                f"{min(written)}..{max(written)}",
                job=q.job,
                round=r,
            )

    for r in req.update_rounds:
        need_round(r, "updates")
        present = list(catalog.clients(q.job, r))
        cl = list(req.clients) if req.clients is not None else present
        unknown = [c for c in cl if c not in present]
        if unknown:
            raise UnknownClient(
                f"client(s) {unknown} sent no update in round {r} of job {q.job!r}",
                job=q.job,
                round=r,
                clients=unknown,
            )
        one = params.get("client")
        if isinstance(one, str) and one not in present:
            raise UnknownClient(
                f"client {one!r} sent no update in round {r} of job {q.job!r}",
                job=q.job,
                round=r,
                clients=[one],
            )
        keys += [update(q.job, c, r) for c in cl]
    for v in req.global_versions:
        need_round(v, "global model")
        keys.append(global_model(q.job, v))
    for r in sorted(set(req.client_meta_rounds) | set(req.round_meta_rounds)):
        need_round(r, "metadata")
        keys.append(meta(q.job, r))
    return Plan(q, list(dict.fromkeys(keys)), req.policy, params, bool(req.evaluator))


def fields_by_kind(objects: Mapping[ObjectKey, Any]) -> dict[str, Any]:
    """Held objects sorted into ``WorkloadData``'s fields: ``updates[r][client]``,
    ``globals[v]``, ``client_meta[r]`` and ``round_meta[r]``."""
    updates: dict[int, dict[str, Any]] = {}
    globals_: dict[int, Any] = {}
    client_meta: dict[int, dict[str, Any]] = {}
    round_meta: dict[int, dict[str, Any]] = {}
    for k, v in objects.items():
        if k.kind == "update":
            updates.setdefault(k.round, {})[k.client] = v
        elif k.kind == "global":
            globals_[k.round] = v
        else:
            client_meta[k.round] = dict(v.get("client_meta", {}))
            round_meta[k.round] = dict(v.get("round_meta", {}))
    return {
        "updates": updates,
        "globals": globals_,
        "client_meta": client_meta,
        "round_meta": round_meta,
    }


def workload_data(
    objects: Mapping[ObjectKey, Any],
    evaluator: Any = None,
    gram_cache: Any = None,
    utility_cache: Any = None,
) -> Any:
    """Build a ``WorkloadData`` from held objects (vectors for models, dicts for metadata).

    ``gram_cache`` (a ``flstore_workloads.GramCache``) and ``utility_cache`` (a
    ``flstore_workloads.utility.UtilityCache``) are for holders that keep the same sealed
    vectors across queries (cache functions); a server that decodes fresh objects per query
    gains nothing from them.
    """
    from flstore_workloads import WorkloadData

    return WorkloadData(
        **fields_by_kind(objects),
        evaluator=evaluator,
        gram_cache=gram_cache,
        utility_cache=utility_cache,
    )


def run_workload(
    name: str,
    params: Mapping[str, Any],
    objects: Mapping[ObjectKey, Any],
    evaluator: Any = None,
    gram_cache: Any = None,
    utility_cache: Any = None,
) -> dict[str, Any]:
    """Run workload ``name`` on ``objects`` (the same code in functions and baselines)."""
    res: dict[str, Any] = _workload(name).run(
        workload_data(objects, evaluator, gram_cache, utility_cache), dict(params)
    )
    return res


def run_sliced(
    name: str,
    params: Mapping[str, Any],
    models: Sequence[ObjectKey],
    dim: int,
    metas: Mapping[ObjectKey, Any],
    evaluator: Any,
    parts: Any,
    utility_cache: Any = None,
) -> dict[str, Any]:
    """Run workload ``name`` as the reducer of a query over models held in coordinate parts
    (``flstore_workloads.sliced``): ``models`` (whole keys, ``dim`` floats each) stand in as
    references, ``parts`` does their math where the parts are; ``metas`` are held here."""
    from flstore_workloads.sliced import SlicedData, VectorRef

    objects: dict[ObjectKey, Any] = {k: VectorRef(k.id, dim) for k in models}
    objects.update(metas)
    data = SlicedData(
        **fields_by_kind(objects), evaluator=evaluator, utility_cache=utility_cache, parts=parts
    )
    res: dict[str, Any] = _workload(name).run(data, dict(params))
    return res


def parse_query(body: Mapping[str, Any]) -> Query:
    """Parse and type-check a raw query body; raises :class:`BadParams`."""
    if not isinstance(body, Mapping):
        raise BadParams("the query must be a JSON object")
    extra = set(body) - {"workload", "job", "rounds", "clients", "params"}
    if extra:
        raise BadParams(
            f"unknown query field(s) {sorted(extra)}; allowed: workload, job, rounds, "
            "clients, params"
        )
    wl, job = body.get("workload"), body.get("job")
    if not isinstance(wl, str) or not wl:
        raise BadParams("'workload' must be a non-empty string")
    if not isinstance(job, str) or not job:
        raise BadParams("'job' must be a non-empty string")
    rounds = body.get("rounds")
    rounds = [] if rounds is None else rounds
    if isinstance(rounds, int) and not isinstance(rounds, bool):
        rounds = [rounds]
    if not isinstance(rounds, list) or not all(
        isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in rounds
    ):
        raise BadParams("'rounds' must be a list of round numbers >= 0")
    clients = body.get("clients")
    clients = [] if clients is None else clients
    if isinstance(clients, str):
        clients = [clients]
    if not isinstance(clients, list) or not all(
        isinstance(c, str) and valid_name(c) for c in clients
    ):
        raise BadParams("'clients' must be a list of client ids")
    params = body.get("params")
    params = {} if params is None else params
    if not isinstance(params, dict):
        raise BadParams("'params' must be a JSON object")
    return Query(wl, job, list(rounds), list(clients), dict(params))


def keys_json(keys: Sequence[ObjectKey]) -> list[str]:
    return [k.id for k in keys]
