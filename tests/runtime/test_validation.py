"""Unit tests: name rule, scaling labels (CE limits on and off), scale clamping."""

from __future__ import annotations

import pytest

from runtime.errors import InvalidDeployment, InvalidScale
from runtime.validation import (
    clamp_replicas,
    max_replicas,
    min_replicas,
    split_namespace,
    validate_labels,
    validate_name,
)


@pytest.mark.parametrize("name", ["a", "echo", "flstore-cache-0", "a1-b2", "0abc", "a" * 63])
def test_rfc1123_names_are_accepted(name: str) -> None:
    validate_name(name)


@pytest.mark.parametrize("name", ["", "A", "a_b", "a.b", "-a", "a-", "a" * 64, "é"])
def test_other_names_are_rejected(name: str) -> None:
    with pytest.raises(InvalidDeployment):
        validate_name(name)


def test_ce_limits_reject_more_than_five_replicas_and_pro_labels() -> None:
    many = {"com.openfaas.scale.min": "6", "com.openfaas.scale.max": "10"}
    validate_labels(many, "f", ce_limits=False)
    with pytest.raises(InvalidDeployment, match="<= 5 in OpenFaaS CE"):
        validate_labels(many, "f", ce_limits=True)
    with pytest.raises(InvalidDeployment, match="not available in OpenFaaS CE"):
        validate_labels({"com.openfaas.scale.target": "50"}, "f", ce_limits=True)
    validate_labels({"com.openfaas.scale.target": "50"}, "f", ce_limits=False)


@pytest.mark.parametrize(
    "labels",
    [
        {"com.openfaas.scale.min": "0"},
        {"com.openfaas.scale.min": "x"},
        {"com.openfaas.scale.min": "3", "com.openfaas.scale.max": "2"},
        {"com.openfaas.scale.factor": "0"},
        {"com.openfaas.scale.zero": "TRUE"},
    ],
)
def test_bad_scaling_labels_are_rejected_in_both_modes(labels: dict[str, str]) -> None:
    for ce in (False, True):
        with pytest.raises(InvalidDeployment):
            validate_labels(labels, "f", ce_limits=ce)


def test_min_and_max_come_from_labels_with_defaults() -> None:
    assert min_replicas({}) == 1
    assert min_replicas({"com.openfaas.scale.min": "3"}) == 3
    assert max_replicas({}, ce_limits=False, default_max=20) == 20
    assert max_replicas({}, ce_limits=True, default_max=20) == 5
    assert max_replicas({"com.openfaas.scale.max": "8"}, ce_limits=False, default_max=20) == 8


def test_scale_requests_are_clamped_and_zero_is_refused() -> None:
    labels = {"com.openfaas.scale.max": "4"}
    assert clamp_replicas("f", 9, labels, ce_limits=False, default_max=20) == 4
    assert clamp_replicas("f", 3, labels, ce_limits=False, default_max=20) == 3
    assert clamp_replicas("f", 30, {}, ce_limits=False, default_max=20) == 20
    assert clamp_replicas("f", 9, {}, ce_limits=True, default_max=20) == 5
    with pytest.raises(InvalidScale, match="cannot be set to 0 in OpenFaaS CE"):
        clamp_replicas("f", 0, labels, ce_limits=False, default_max=20)


def test_namespace_suffix_splits_at_the_last_dot() -> None:
    assert split_namespace("echo") == ("echo", "")
    assert split_namespace("echo.openfaas-fn") == ("echo", "openfaas-fn")
    assert split_namespace("a.b.c") == ("a.b", "c")
