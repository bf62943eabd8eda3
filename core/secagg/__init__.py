"""Secure aggregation (SecAgg+, Bell et al. 2020): the server learns only the sum of the
clients' updates, never one of them.

Each client clips and quantizes its update into Z_2^32 (:mod:`core.secagg.quantize`), adds a
self mask and one pairwise mask per neighbour (:mod:`core.secagg.masks`), both expanded with
ChaCha20 from seeds; pairwise seeds come from X25519 key agreement (:mod:`core.secagg.keys`).
Masked vectors are sums in Z_2^32 (uint32 addition wraps), so they fold eagerly like FedAvg
partials (:mod:`core.secagg.fold`). Each client Shamir-shares its self-mask seed and its key seed among its neighbours
(:mod:`core.secagg.shares`, pycryptodome's Shamir over GF(2^128)), so that the top can remove
the masks of clients that dropped after sharing and the self masks of those that stayed.
The neighbour graph (:mod:`core.secagg.graph`) has ``k`` neighbours per client: ``k = n - 1``
is the original SecAgg. :mod:`core.secagg.participant` (a client) and
:mod:`core.secagg.coordinator` (the server) hold both sides' state, pure
logic without I/O; :mod:`core.secagg.config` checks a job's parameters.
"""
