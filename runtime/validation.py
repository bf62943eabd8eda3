"""Pure checks on deployments and scale requests (no I/O), after faas-netes CE's rules."""

from __future__ import annotations

import re
from collections.abc import Mapping

from runtime.errors import InvalidDeployment, InvalidScale

# RFC-1123 DNS label, as faas-provider's ValidateDeployRequest checks it.
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
NAME_MAX = 63

MIN_LABEL = "com.openfaas.scale.min"
MAX_LABEL = "com.openfaas.scale.max"
FACTOR_LABEL = "com.openfaas.scale.factor"
ZERO_LABEL = "com.openfaas.scale.zero"
CE_MAX_REPLICAS = 5
# Labels that faas-netes CE answers with 400 ("not available in CE").
CE_PRO_ONLY = (
    "com.openfaas.scale.target",
    "com.openfaas.scale.type",
    "com.openfaas.scale.zero-duration",
)


def validate_name(name: str) -> None:
    """Raise :class:`InvalidDeployment` unless ``name`` is an RFC-1123 label (no dots, capitals, _)."""
    if not name:
        raise InvalidDeployment(name, "service is required: give the function a name")
    if len(name) > NAME_MAX or not NAME_RE.match(name):
        raise InvalidDeployment(
            name,
            f"(RFC1123) invalid function name {name!r}: use at most {NAME_MAX} lower-case letters, "
            "digits and '-', starting and ending with a letter or digit",
        )


def _int_label(labels: Mapping[str, str], key: str, service: str) -> int | None:
    if key not in labels:
        return None
    raw = str(labels[key]).strip()
    try:
        value = int(raw)
    except ValueError:
        raise InvalidDeployment(service, f"label {key} must be an integer, got {raw!r}") from None
    return value


def validate_labels(labels: Mapping[str, str], service: str, *, ce_limits: bool) -> None:
    """Check the ``com.openfaas.scale.*`` labels; CE's limits only when ``ce_limits`` is set."""
    lo = _int_label(labels, MIN_LABEL, service)
    hi = _int_label(labels, MAX_LABEL, service)
    for key, value in ((MIN_LABEL, lo), (MAX_LABEL, hi)):
        if value is None:
            continue
        if value < 1:
            raise InvalidDeployment(
                service, f"label {key} must be >= 1 (no scale to zero), got {value}"
            )
        if ce_limits and value > CE_MAX_REPLICAS:
            raise InvalidDeployment(
                service, f"label {key} must be <= {CE_MAX_REPLICAS} in OpenFaaS CE, got {value}"
            )
    if lo is not None and hi is not None and lo > hi:
        raise InvalidDeployment(service, f"label {MIN_LABEL}={lo} is above {MAX_LABEL}={hi}")
    factor = _int_label(labels, FACTOR_LABEL, service)
    if factor is not None and not 1 <= factor <= 100:
        raise InvalidDeployment(
            service, f"label {FACTOR_LABEL} must be between 1 and 100, got {factor}"
        )
    if str(labels.get(ZERO_LABEL, "")).strip().lower() == "true":
        raise InvalidDeployment(
            service, f"label {ZERO_LABEL}=true: scale to zero is not available on this runtime"
        )
    if ce_limits:
        for key in CE_PRO_ONLY:
            if key in labels:
                raise InvalidDeployment(service, f"label {key} is not available in OpenFaaS CE")


def min_replicas(labels: Mapping[str, str]) -> int:
    """Initial replica count: ``com.openfaas.scale.min``, default 1."""
    value = _int_label(labels, MIN_LABEL, "")
    return max(1, value) if value is not None else 1


def max_replicas(labels: Mapping[str, str], *, ce_limits: bool, default_max: int) -> int:
    """Upper bound for scaling: the ``scale.max`` label, else ``default_max`` (5 under CE limits)."""
    value = _int_label(labels, MAX_LABEL, "")
    bound = value if value is not None else default_max
    if ce_limits:
        bound = min(bound, CE_MAX_REPLICAS)
    return max(1, bound)


def clamp_replicas(
    name: str, requested: int, labels: Mapping[str, str], *, ce_limits: bool, default_max: int
) -> int:
    """The replica count a scale request results in.

    0 is refused as CE refuses it; anything else is clamped to ``[1, max]`` like the CE gateway's
    ``MakeHorizontalScalingHandler`` (with ``max`` from the ``scale.max`` label).
    """
    if requested == 0:
        raise InvalidScale(name, requested, "replicas cannot be set to 0 in OpenFaaS CE")
    if requested < 0:
        raise InvalidScale(name, requested, f"replicas must be a positive integer, got {requested}")
    return min(requested, max_replicas(labels, ce_limits=ce_limits, default_max=default_max))


def split_namespace(name: str) -> tuple[str, str]:
    """Split ``fn.namespace`` at the last dot (gateway ``GetNamespace``); ``""`` when absent."""
    if "." in name:
        fn, _, ns = name.rpartition(".")
        return fn, ns
    return name, ""
