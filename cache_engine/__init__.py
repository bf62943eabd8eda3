"""FLStore cache engine: location table, policies P1-P4 (+ baselines), placement, cold store."""

from cache_engine.catalog import Catalog, MemoryCatalog
from cache_engine.cold_store import ColdStore, MinioColdStore, flatten
from cache_engine.keys import ObjectKey
from cache_engine.policies import POLICIES, Decision, Policy, make_policy
from cache_engine.table import LocationTable, RedisLocationTable

__all__ = [
    "POLICIES",
    "Catalog",
    "ColdStore",
    "Decision",
    "LocationTable",
    "MemoryCatalog",
    "MinioColdStore",
    "ObjectKey",
    "Policy",
    "RedisLocationTable",
    "flatten",
    "make_policy",
]
