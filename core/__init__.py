"""FedFaaS's core: what the node gateways, the functions and the services share.

The bottom layer (``pyproject.toml``'s import contracts): the wire format (:mod:`core.wire`), the
shared-memory object store (:mod:`core.objstore`), FedAvg and the robust rules
(:mod:`core.fedavg`, :mod:`core.robust`, :mod:`core.shards`), server optimizers and FedBuff
(:mod:`core.server_opt`, :mod:`core.fedbuff`), checkpoints (:mod:`core.checkpoints`), privacy
accounting (:mod:`core.privacy`), and the plumbing every process uses: tokens and scopes
(:mod:`core.auth`), secret files (:mod:`core.secretfiles`), command lines from settings
(:mod:`core.cmdline`), bounded shutdown (:mod:`core.shutdown`), the backing services Redis,
MinIO and Prometheus as child processes (:mod:`core.services`), the OpenFaaS provider API client
(:mod:`core.openfaas`), gateway discovery (:mod:`core.discovery`) and ``stack.yml`` parsing
(:mod:`core.stackfile`). It imports no component, no client and not the product shell.
"""
