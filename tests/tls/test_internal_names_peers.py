"""Two node gateways whose internal routes take only the certificates that name a part listed
(``tls_internal_names``): node b's partial crosses to the root a on the internal route, b
presenting its own certificate (``server``, both gateways' certificate here), and both nodes
serve the flat FedAvg (the test of tests/dataplane, collected here with the names set).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.dataplane.gateways import make_gw
from tests.dataplane.test_gateway_rounds import (
    test_two_nodes_send_one_partial_across_and_agree_with_flat_fedavg,
)
from tests.tls.certs import Certs, certs, settings_of

pytestmark = pytest.mark.integration

#: the fixtures and the test collected here (``gateway_extra`` below turns TLS and the names on)
COLLECTED = [make_gw, certs, test_two_nodes_send_one_partial_across_and_agree_with_flat_fedavg]


@pytest.fixture()
def gateway_extra(certs: Certs) -> dict[str, Any]:
    return settings_of(certs.server, tls_internal_names="control-plane, server")
