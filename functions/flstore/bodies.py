"""The cache function's request bodies, checked: what is wrong with one is a ValueError (400)."""

from __future__ import annotations

from typing import Any

from cache_engine.keys import ObjectKey


def parse_keys(body: dict[str, Any]) -> list[ObjectKey]:
    raw = body.get("objects")
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise ValueError("'objects' must be a list of object ids '<job>/<round>/<client|kind>'")
    try:
        return [ObjectKey.parse(x) for x in raw]
    except (ValueError, TypeError) as exc:
        raise ValueError(f"bad object id in 'objects': {exc}") from None


def parse_offers(raw: Any) -> list[dict[str, str]]:
    if raw is None:
        return []
    ok = isinstance(raw, list) and all(
        isinstance(h, dict) and all(isinstance(h.get(f), str) for f in ("socket", "ticket"))
        for h in raw
    )
    if not ok:
        raise ValueError("'handoff' must be a list of {socket, ticket, node}, from the engine")
    return list(raw)


def parse_slices(body: dict[str, Any]) -> tuple[int, list[dict[str, Any]], dict[str, Any] | None]:
    sl = body.get("slices")
    ranges = sl.get("ranges") if isinstance(sl, dict) else None
    dim = sl.get("dim") if isinstance(sl, dict) else None
    ok = (
        isinstance(dim, int)
        and dim > 0
        and isinstance(ranges, list)
        and ranges
        and all(
            isinstance(r, dict)
            and isinstance(r.get("function"), str)
            and isinstance(r.get("bounds"), list)
            and len(r["bounds"]) == 2
            for r in ranges
        )
    )
    if not ok:
        raise ValueError(
            "'slices' must be {dim, ranges: [{bounds, part, function, endpoint}], source}, "
            "from the cache engine"
        )
    source = sl.get("source") if isinstance(sl, dict) else None
    return int(dim), list(ranges), source if isinstance(source, dict) else None  # type: ignore[arg-type]
