"""Fixtures of the data-plane tests: the gateway fixtures of the plain module
:mod:`tests.dataplane.gateways`, which other folders import from there."""

from tests.dataplane.gateways import checkpoints_to, gateway_extra, make_gw

__all__ = ["checkpoints_to", "gateway_extra", "make_gw"]
