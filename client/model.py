"""A small CNN for 8x8 digits and its safetensors (de)serialisation.

The model has no BatchNorm and no integer buffers: every tensor in its state dict is float32,
so FedAvg over state dicts is exactly FedAvg over parameters. Weights cross process
boundaries only as safetensors bytes (never pickle).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import nn

from client.data import NUM_CLASSES


class DigitsCNN(nn.Module):
    """conv(1->16) -> conv(16->32) -> maxpool -> fc(512->64) -> fc(64->10); ~38k parameters."""

    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))
        x = self.pool(torch.relu(self.conv2(x)))
        x = torch.relu(self.fc1(x.flatten(1)))
        out: torch.Tensor = self.fc2(x)
        return out


class DigitsSoftmax(nn.Linear):
    """Softmax regression on the 64 pixels: state dict ``{"weight": (10, 64), "bias": (10,)}``.

    That is the layout of FLStore's ``digits-softmax`` evaluator (``cache_engine.evaluators``),
    so contribution workloads (Shapley, leave-one-out) can score this model's updates.
    """

    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.flatten(1))


#: Model architectures by name (``SimulatorConfig.model``, :func:`make_model`).
MODELS: dict[str, type[nn.Module]] = {"cnn": DigitsCNN, "softmax": DigitsSoftmax}


def make_model(seed: int = 0, arch: str = "cnn") -> nn.Module:
    """A freshly initialised ``arch`` model (:data:`MODELS`); the same seed gives
    bit-identical weights.

    The global torch RNG is forked, so calling this does not disturb anyone else's stream.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MODELS[arch]()


def state_dict_to_bytes(state: Mapping[str, torch.Tensor]) -> bytes:
    """Serialise a state dict to safetensors bytes (tensors made contiguous, on CPU)."""
    return st_save({k: v.detach().to("cpu").contiguous() for k, v in state.items()})


def bytes_to_state_dict(data: bytes) -> dict[str, torch.Tensor]:
    """Parse safetensors bytes into a state dict of CPU tensors (copies, writable)."""
    return st_load(bytes(data))


def model_to_bytes(model: nn.Module) -> bytes:
    """The model's weights as safetensors bytes."""
    return state_dict_to_bytes(model.state_dict())


def load_bytes_into(model: nn.Module, data: bytes) -> nn.Module:
    """Load safetensors bytes into ``model`` (strict: names and shapes must match)."""
    model.load_state_dict(bytes_to_state_dict(data), strict=True)
    return model
