"""Baselines for FLStore queries: ObjStore-Agg (MinIO per query) and Cache-Agg (Redis per query)."""

from bench.baselines.server import MinioSource, ObjectSource, RedisSource, create_app

__all__ = ["MinioSource", "ObjectSource", "RedisSource", "create_app"]
