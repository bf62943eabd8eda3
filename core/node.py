"""Names the processes of one node agree on.

:data:`ROUTER_SOCKET_ENV` tells an ``aggregator`` replica where its node's router listens. The
node gateway reads the same name (``GatewaySettings.router_socket``, prefix
``FEDFAAS_GATEWAY_``), the chart sets it for both, and the embedded runtime sets it per replica
for the node it places the replica on (``RuntimeSettings.nodes``), with :data:`NODE_ENV`, the
node's name.
"""

from __future__ import annotations

#: where an aggregator replica finds its node's router (a Unix socket path)
ROUTER_SOCKET_ENV = "FEDFAAS_GATEWAY_ROUTER_SOCKET"

#: the name of the node a replica was placed on
NODE_ENV = "FEDFAAS_NODE"
