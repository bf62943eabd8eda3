"""A job driven through the SDK (:mod:`client`) from the node's network namespace, for the tests
of the chart on a node: each client uploads a random update of the softmax model with its own
weight, and the round's model must be the float64 FedAvg of the updates sent, each once.

Every SDK call runs on the namespace's thread (:meth:`tests.k8s.netns.PrivateNamespace.call`):
its connections are the namespace's, where a user's machine on the node's network would be.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from client.job import Assignment, Job
from client.model import make_model, model_to_bytes
from client.node import FLClient
from client.submit import submit_job
from core import fedavg
from tests.k8s.netns import PrivateNamespace

#: the softmax model's initial weights (small: a round moves kilobytes)
MODEL = model_to_bytes(make_model(0, "softmax"))


def _arrays() -> dict[str, np.ndarray]:
    from safetensors.numpy import load

    return load(MODEL)


def random_update(seed: int) -> tuple[bytes, dict[str, np.ndarray], int]:
    """An update of the model (safetensors bytes, its arrays) and a weight, from ``seed``."""
    from safetensors.numpy import save

    rng = np.random.default_rng(seed)
    arrays = {k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in _arrays().items()}
    return save(arrays), arrays, 1 + seed % 7


class NodeJob:
    """A job of ``clients`` on the control plane at ``control_plane``, created with the admin
    token; ``options`` go to :func:`client.submit_job`."""

    def __init__(
        self,
        ns: PrivateNamespace,
        control_plane: str,
        admin: str,
        name: str,
        clients: list[str],
        **options: Any,
    ) -> None:
        self.ns, self.name, self.clients = ns, name, clients
        self.job: Job = ns.call(
            submit_job,
            control_plane,
            name,
            MODEL,
            admin_token=admin,
            clients=clients,
            rounds=options.pop("rounds", 1),
            **options,
        )
        #: client -> (bytes, arrays, weight) of its update of the round
        self.sent: dict[str, tuple[bytes, dict[str, np.ndarray], int]] = {}

    def view(self) -> dict[str, Any]:
        """The control plane's view of the job."""
        return self.ns.call(self.job.view)

    def assignment(self, client: str, rnd: int = 1) -> Assignment:
        """Where ``client`` uploads its update of ``rnd`` (once the round is open)."""
        return self.ns.call(self.job.assignment, client, round=rnd, timeout=120)

    def upload(self, client: str, seed: int, rnd: int = 1) -> Assignment:
        """``client``'s update of ``rnd`` (from ``seed``) to the gateway the control plane
        assigns it, as the SDK's round client sends it; the assignment used."""
        data, arrays, weight = random_update(seed)

        def send() -> Assignment:
            with self.job.client(client, round=rnd, timeout=120) as rc:
                rc.upload(rnd, data, weight)
                return rc.assignment

        a = self.ns.call(send)
        self.sent[client] = (data, arrays, weight)
        return a

    def send_again(self, client: str, rnd: int = 1) -> Assignment:
        """What a client does when its assignment's ``resend`` grew (its accepted update died
        with the job's root node): the same update again, to the gateway now assigned
        (as :func:`client.flower.run_client` does)."""
        a = self.assignment(client, rnd)
        assert a.resend > 0, a
        data, _, weight = self.sent[client]

        def send() -> None:
            token = self.job.token_of(client)
            with FLClient(
                a.gateway_url,
                self.name,
                client,
                token,
                timeout=120,
                ca_file=self.job.ca_file,  # the job's CA, as the SDK's own clients take it
                tls_name=a.tls_name,
            ) as fl:
                fl.upload(rnd, data, weight)

        self.ns.call(send)
        return a

    def wait(self, rnd: int = 1, timeout: float = 300) -> dict[str, Any]:
        """The round's record in the job's history, once it ended."""
        return self.ns.call(self.job.wait, rnd, timeout=timeout)

    def assert_fedavg(self, rnd: int = 1) -> float:
        """The round's published model is the float64 FedAvg of every update sent (each
        once), within 1e-6 relative; the largest relative error."""
        from safetensors.numpy import load

        model = self.ns.call(self.job.model, version=rnd, timeout=180)
        got = load(model.data)
        weights = [w for _, _, w in self.sent.values()]
        worst = 0.0
        for key, value in got.items():
            want = fedavg.fedavg_reference([a[key] for _, a, _ in self.sent.values()], weights)
            err = fedavg.rel_error(value, want)
            assert err <= 1e-6, (key, err)
            worst = max(worst, err)
        return worst
