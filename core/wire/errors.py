"""What a body that does not meet the wire format raises (all :class:`WireError`, a ``ValueError``)."""

from __future__ import annotations


class WireError(ValueError):
    """Base of every wire-format error; ``code`` is the stable error code of the HTTP API."""

    code = "bad_update"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class MalformedHeader(WireError):
    """The safetensors header is not valid JSON of the expected shape."""

    code = "malformed_safetensors"


class HeaderTooLarge(WireError):
    """The safetensors header is larger than the configured bound."""

    code = "header_too_large"


class SpecMismatch(WireError):
    """The tensors do not match the job's model spec (names, shapes or dtypes)."""

    code = "spec_mismatch"


class SizeMismatch(WireError):
    """The body length disagrees with the header or the Content-Length."""

    code = "size_mismatch"


class Truncated(WireError):
    """The body ended before all tensor bytes arrived."""

    code = "truncated_body"


class NonFinite(WireError):
    """The update holds NaN or Inf."""

    code = "non_finite"
