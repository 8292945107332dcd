"""Models and checks shared by the gradd.torch integration tests
(test_torch_tutorials.py, test_torch_subgroups.py, test_torch_checkpoint.py):
PyTorch's DDP tutorial models, and training torch's DDP (Gloo) and gradd's
side by side with the values compared after every step."""
import copy

import torch
import torch.distributed as dist
from torch import nn

from parity_util import rel_err

TOL = 1e-5


class ToyModel(nn.Module):
    """The model of PyTorch's "Getting Started with DDP" tutorial."""

    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


class ToyMpModel(nn.Module):
    """The tutorial's model-parallel model: two submodules, each on its own
    device (here both CPU, so device_ids=None as the tutorial says)."""

    def __init__(self, dev0, dev1):
        super().__init__()
        self.dev0, self.dev1 = dev0, dev1
        self.net1 = nn.Linear(10, 10).to(dev0)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5).to(dev1)

    def forward(self, x):
        x = self.relu(self.net1(x.to(self.dev0)))
        return self.net2(x.to(self.dev1))


def init_gloo(rank, world, port):
    """As the tutorial: MASTER_ADDR / MASTER_PORT, then init_process_group."""
    import os

    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def data(step, rank, salt=0):
    g = torch.Generator().manual_seed(1000 * salt + 10 * step + rank)
    return torch.randn(20, 10, generator=g), torch.randn(20, 5, generator=g)


def max_err(ref_module, ours_module, grads=True):
    """Largest relative difference of parameters (and gradients) and buffers."""
    err = 0.0
    for p, q in zip(ref_module.parameters(), ours_module.parameters()):
        err = max(err, rel_err(q, p))
        if grads and p.grad is not None:
            assert q.grad is not None
            err = max(err, rel_err(q.grad, p.grad))
    for a, b in zip(ref_module.buffers(), ours_module.buffers()):
        err = max(err, rel_err(b, a))
    return err


def train_side_by_side(ref, ours, steps, rank, salt=0, lr=0.01):
    """Trains torch's DDP `ref` and gradd's `ours` on the same data (each
    rank its own) with SGD; returns the per-step largest relative error."""
    opts = [torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9) for m in (ref, ours)]
    loss_fn = nn.MSELoss()
    errs = []
    for step in range(steps):
        x, y = data(step, rank, salt)
        for model, opt in zip((ref, ours), opts):
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        errs.append(max_err(ref.module, ours.module))
    return errs


def seeded(build, rank):
    """A model whose initial weights differ per rank (DDP must broadcast
    rank 0's), and a copy for the other wrapper."""
    torch.manual_seed(100 + rank)
    model = build()
    return model, copy.deepcopy(model)


def checksum(module):
    return [round(p.detach().double().sum().item(), 9) for p in module.parameters()]
