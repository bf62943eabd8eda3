"""``python -m bench.baselines --backend minio|redis --port P --minio H:P [--redis URL]``
(MinIO's and Redis's users from ``--minio-credentials-file`` / ``--redis-credentials-file``)."""

from bench.baselines.server import main

main()
