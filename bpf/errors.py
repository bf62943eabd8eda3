"""Errors of the ``bpf`` package: one base class, subclasses carry the facts."""

from __future__ import annotations


class RouterError(Exception):
    """Base class for every error raised by the sidecar router and its frames."""


class FrameError(RouterError, ValueError):
    """A frame could not be built or decoded (wrong size, unknown kind, field out of range)."""


class RegistrationRefused(RouterError):
    """The router refused an endpoint's registration.

    Attributes
    ----------
    reason : str
        Why (peer uid not allowed, bad hello, router stopping, ...).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(f"registration refused: {reason}")
        self.reason = reason


class EndpointClosed(RouterError):
    """The endpoint (or the router behind it) is closed."""


class EbpfUnavailable(RouterError):
    """The eBPF sidecar cannot load here.

    Attributes
    ----------
    reason : str
        What is missing (root, bcc, kernel headers, kernel feature) and how to fix it.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
