"""Models shared by the parity workers and the in-process tests."""
import torch
from torch import nn


def mlp():
    return nn.Sequential(
        nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)
    )


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 16, 3), nn.BatchNorm2d(16), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.features(x))


def build(name):
    """(model, input maker, loss) for `name`."""
    if name == "mlp":
        return mlp(), (lambda g: torch.randn(16, 32, generator=g)), nn.CrossEntropyLoss()
    if name == "cnn_bn":
        return SmallCNN(), (lambda g: torch.randn(8, 3, 12, 12, generator=g)), nn.CrossEntropyLoss()
    if name == "float64":
        return (
            mlp().double(),
            (lambda g: torch.randn(16, 32, generator=g, dtype=torch.float64)),
            nn.CrossEntropyLoss(),
        )
    raise ValueError(name)
