"""Small nets with heads other than a softmax one, as people write them: a multi-label CNN (independent
labels, functional ReLU and pooling) whose label biases make known labels positive, and a regressor with one
output (a score to predict, say an age)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: The multi-label net's label biases: sigmoids of about 0.88, 0.12, 0.73 and 0.05 on a grey photo.
BIASES = (2.0, -2.0, 1.0, -3.0)


class MultiLabelNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, stride=2)
        self.fc = nn.Linear(16, len(BIASES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.features(x)).mean(dim=(2, 3)))


def make_multilabel() -> nn.Module:
    torch.manual_seed(0)
    net = MultiLabelNet()
    with torch.no_grad():
        net.fc.weight.mul_(0.05)
        net.fc.bias.copy_(torch.tensor(BIASES))
    return net


def make_regressor() -> nn.Module:
    torch.manual_seed(0)
    return Regressor()


class SoftmaxNet(nn.Module):
    """A classifier that ends in its softmax, as exported for deployment: its outputs are probabilities."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))
        self.fc = nn.Linear(8, 5)
        self.softmax = nn.Softmax(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.softmax(self.fc(torch.relu(self.features(x)).mean(dim=(2, 3))))


class TwoOutputs(nn.Module):
    """A model returning a tuple: 5 bounded scores first, then the 10 logits they are cut from."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.fc(torch.relu(self.features(x)).mean(dim=(2, 3)))
        return torch.tanh(y[:, :5]), y


def make_softmax() -> nn.Module:
    torch.manual_seed(0)
    net = SoftmaxNet()
    with torch.no_grad():
        net.fc.bias.copy_(torch.tensor([0.0, 1.5, -1.0, 0.5, 0.2]))
    return net


def make_two_outputs() -> nn.Module:
    torch.manual_seed(0)
    return TwoOutputs()


class NamedOutputs(TwoOutputs):
    """:class:`TwoOutputs` returning a dict, neither of its keys one hookviz reads as class scores."""

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
        bounded, scores = super().forward(x)
        return {"bounded": bounded, "scores": scores}


def make_named_outputs() -> nn.Module:
    torch.manual_seed(0)
    return NamedOutputs()
