"""``tests.k8s.api.conditions``: the waits of the Kubernetes tier read objects the API server has
only just made, whose status may not hold conditions yet. A fresh CustomResourceDefinition comes
back with ``"conditions": null`` (CI's stop 53 failed on it: ``TypeError: 'NoneType' object is not
iterable`` in the wait for cert-manager's CRDs), a fresh Pod with no ``conditions`` key, a Node
object made by hand with no status at all; each is "not yet", never an error."""

from __future__ import annotations

from tests.k8s.api import conditions


def test_an_object_whose_status_has_no_conditions_yet_has_none() -> None:
    crd = {"kind": "CustomResourceDefinition", "status": {"conditions": None, "storedVersions": []}}
    assert conditions(crd) == {}
    assert conditions({"kind": "Pod", "status": {"phase": "Pending"}}) == {}
    assert conditions({"kind": "Node", "status": None}) == {}
    assert conditions({"kind": "Node"}) == {}
    assert conditions(None) == {}


def test_the_conditions_are_read_by_type() -> None:
    crd = {
        "status": {
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts"},
                {"type": "Established", "status": "False", "reason": "Installing"},
            ]
        }
    }
    assert conditions(crd) == {"NamesAccepted": "True", "Established": "False"}
