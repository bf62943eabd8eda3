"""Harnesses that only the tests and the benchmarks use; no service imports them.

- :mod:`bench.harness.flstore_stack`: the FLStore serving side (runtime, cache engine, request
  tracker) as child processes on loopback, each command line rendered from its settings class.
- :mod:`bench.harness.synthetic`: synthetic and real (digits) FL histories written to a cold store.
- :mod:`bench.harness.flstore_trace`: paper-shaped request traces and a pure cache-policy simulator.
- :mod:`bench.harness.lifl_sim`: a pure model of one aggregation round through a planned hierarchy
  (LIFL Fig. 8).
"""
