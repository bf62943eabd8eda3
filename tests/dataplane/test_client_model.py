"""Model, safetensors round trip and local training (client.model, client.train)."""

from __future__ import annotations

import torch

from client.data import federated_digits
from client.model import (
    DigitsCNN,
    bytes_to_state_dict,
    load_bytes_into,
    make_model,
    model_to_bytes,
    state_dict_to_bytes,
)
from client.train import TrainConfig, evaluate, fedavg_state_dicts, train_local


def test_same_seed_gives_identical_weights_and_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b = make_model(5), make_model(5)
    assert torch.rand(1) == before
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb)
    assert not torch.equal(make_model(6).fc2.weight, a.fc2.weight)


def test_safetensors_round_trip_is_bit_exact_and_not_pickle() -> None:
    model = make_model(0)
    data = model_to_bytes(model)
    assert not data.startswith(b"\x80")  # no pickle protocol header
    header_len = int.from_bytes(data[:8], "little")
    assert data[8:9] == b"{" and header_len < len(data)
    back = bytes_to_state_dict(data)
    assert sorted(back) == sorted(model.state_dict())
    for k, v in model.state_dict().items():
        assert back[k].dtype == v.dtype == torch.float32
        assert torch.equal(back[k], v)
        assert back[k].view(torch.int32).equal(v.view(torch.int32))
    assert state_dict_to_bytes(back) == data
    fresh = load_bytes_into(DigitsCNN(), data)
    assert torch.equal(fresh.fc1.weight, model.fc1.weight)


def test_local_training_lowers_loss_and_raises_accuracy_on_the_clients_data() -> None:
    torch.set_num_threads(1)
    shard = federated_digits(4, alpha=100.0, seed=0).clients[0]
    model = make_model(0)
    before = evaluate(model, shard.x, shard.y)
    res = train_local(model, shard.x, shard.y, TrainConfig(epochs=5), seed=1)
    after = evaluate(model, shard.x, shard.y)
    assert res.num_samples == shard.num_samples and res.steps > 0
    assert after.loss < before.loss
    assert after.accuracy > before.accuracy + 0.3


def test_two_rounds_of_in_process_fedavg_beat_chance_on_the_held_out_set() -> None:
    torch.set_num_threads(1)
    fd = federated_digits(8, alpha=0.5, seed=0)
    glob = make_model(0)
    for rnd in range(3):
        states, weights = [], []
        for i, c in enumerate(fd.clients):
            m = load_bytes_into(DigitsCNN(), model_to_bytes(glob))
            train_local(m, c.x, c.y, TrainConfig(), seed=rnd * 100 + i)
            states.append(m.state_dict())
            weights.append(float(c.num_samples))
        glob.load_state_dict(fedavg_state_dicts(states, weights))
    assert evaluate(glob, fd.test_x, fd.test_y).accuracy > 0.5


def test_fedavg_reference_weights_by_sample_count() -> None:
    a = {"w": torch.zeros(3)}
    b = {"w": torch.ones(3)}
    out = fedavg_state_dicts([a, b], [1.0, 3.0])
    assert torch.allclose(out["w"], torch.full((3,), 0.75))
