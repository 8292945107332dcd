"""One rank of test_graddctl.py: gradd.torch.DistributedDataParallel for
STEPS steps, MODE "unused": with find_unused_parameters over a model whose
`unused` layer never takes part (no bucket rebuild then, as in torch);
MODE "rebuild": every layer used, no find_unused_parameters (the buckets
are rebuilt after the first step). Then prints one
JSON line (its pid, the job id and its own `_get_ddp_logging_data()`) and
stays attached until its stdin closes, so the test can ask the daemon about
the job with graddctl while it runs.

Args: MODE STEPS. Rank/world from RANK/WORLD_SIZE..., daemon from GRADD_SOCKET,
job from GRADD_JOB.
"""
import json
import os
import sys

import torch
from torch import nn

import gradd.torch


class PartlyUsed(nn.Module):
    def __init__(self, use_all):
        super().__init__()
        self.use_all = use_all
        self.embed = nn.Linear(12, 16)
        self.unused = nn.Linear(16, 4)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.embed(x))
        return self.head(h) + self.unused(h) if self.use_all else self.head(h)


def main():
    mode, steps = sys.argv[1], int(sys.argv[2])
    rank = int(os.environ["RANK"])
    torch.manual_seed(1000 + rank)
    ddp = gradd.torch.DistributedDataParallel(
        PartlyUsed(use_all=mode == "rebuild"), bucket_cap_mb=0.001,
        first_bucket_cap_mb=0.0005, find_unused_parameters=mode == "unused")
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(steps):
        g = torch.Generator().manual_seed(step * 100 + rank)
        x = torch.randn(8, 12, generator=g)
        y = torch.randint(0, 4, (8,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    names = [n for n, _ in ddp.module.named_parameters()]
    print(json.dumps({"pid": os.getpid(), "job_id": ddp.job_id, "params": names,
                      "logging": ddp._get_ddp_logging_data()}), flush=True)
    sys.stdin.read()  # until the test is done asking


if __name__ == "__main__":
    main()
