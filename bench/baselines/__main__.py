"""``python -m bench.baselines --backend minio|redis --port P --minio H:P [--redis URL]``
(MinIO's keys from ``FEDFAAS_BASELINE_MINIO_ACCESS_KEY`` / ``_SECRET_KEY``)."""

from bench.baselines.server import main

main()
