"""Privacy accounting of DP-FedAvg jobs (central differential privacy; the mechanism is
``core.robust``'s ``dp-fedavg`` rule, run on the root gateway).

Each round of such a job is a sampled Gaussian mechanism: the sum of the clipped deltas has
sensitivity ``C`` (one client added or removed) and gets noise ``N(0, (z C)^2)``, so its noise
multiplier is ``z``, and a client takes part with probability ``q``. The rounds compose; the
epsilon spent after them, for the job's ``delta``, comes from Google's ``dp-accounting``
library (its Renyi-DP accountant over ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``, one
per round), as in DP-FedAvg (McMahan et al., ICLR 2018).

``q`` is the control plane's: clients selected for the round over the job's eligible clients
when the selection is uniform at random. That selection draws a fixed number without
replacement, which the accountant treats as Poisson sampling of the same rate: the usual
approximation (DP-FedAvg's own). A job whose clients are chosen otherwise (Oort) gets no
amplification: ``q = 1``.

Pure functions: no I/O.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Sequence


def epsilon(noise_multiplier: float, rates: Sequence[float], delta: float) -> float:
    """Epsilon spent, at ``delta``, by one sampled Gaussian mechanism per entry of ``rates``
    (each round's sampling rate), all with ``noise_multiplier``. 0 for no round, ``inf``
    without noise."""
    if not rates:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    # imported here: the library takes most of a second to import, which a control plane
    # without DP jobs need not pay at start-up
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    acc = RdpAccountant()  # the library's default Renyi orders
    absl = logging.getLogger("absl")
    level = absl.level
    # the library says, once per event, that it leaves out a low order whose series does not
    # converge (q around 0.2-0.3 with z near 1); its answer is still the bound over the rest
    absl.setLevel(logging.ERROR)
    try:
        for q, count in sorted(Counter(min(1.0, float(q)) for q in rates).items()):
            event = dp_accounting.PoissonSampledDpEvent(
                q, dp_accounting.GaussianDpEvent(noise_multiplier)
            )
            acc.compose(event, count)  # rounds compose in any order: one event per rate
        return float(acc.get_epsilon(delta))
    finally:
        absl.setLevel(level)
