"""``python -m bench.baselines --backend minio|redis --port P --minio H:P [--redis URL]``."""

from bench.baselines.server import main

main()
