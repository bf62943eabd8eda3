"""Harnesses that only the tests and the benchmarks use; no service imports them.

- :mod:`bench.harness.flstore_stack`: the FLStore serving side (runtime, cache engine, request
  tracker) as child processes on loopback, each command line rendered from its settings class.
- :mod:`bench.harness.synthetic`: synthetic and real (digits) FL histories written to a cold store.
- :mod:`bench.harness.flstore_trace`: paper-shaped request traces and a pure cache-policy simulator.
- :mod:`bench.harness.lifl_sim`: a pure model of one aggregation round through a planned hierarchy
  (LIFL Fig. 8).
- :mod:`bench.harness.round_window`: one FL round measured the same way for FedFaaS and Flower
  (window marks, first bytes on the server's port, summed VmHWM, the memory guard, failure
  records, the clients' shared weights).
- :mod:`bench.harness.sdk_client`: one benchmark FL client as a light process (SDK upload).
- :mod:`bench.harness.cgroups`: cgroup v1 groups for each side of a benchmark (its processes
  born in them, pinned to a cpuset; the group's memory peak, CPU-seconds and threads).
- :mod:`bench.harness.fedfaas_round`: one FedFaaS round measured as the baselines' are, and
  the design's memory floor from its settings.
- :mod:`bench.harness.flower_env`: Flower's own environment (the newest Flower), made once and
  cached; :mod:`bench.harness.flower_app`: the ServerApp and ClientApp the Flower baseline runs;
  :mod:`bench.harness.flower_legacy`: Flower 1.32.1's ``start_server``/``start_client`` round.
- :mod:`bench.harness.compare`: every system's round repeated, interleaved, on the same CPUs;
  medians, ranges and ratios of medians.
"""
