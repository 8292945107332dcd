"""One rank of the autotune test: trains the same MLP with torch's
DistributedDataParallel (Gloo) and with gradd.torch.DistributedDataParallel
whose bucket cap the daemon tunes (bucket_cap_mb="auto", or left to a daemon
configured with `bucket_cap_mb: auto`), side by side; after every step
compares gradients and parameters. Prints one JSON line.

Args: GLOO_INIT_FILE STEPS CAP ("auto" or "default"). Rank/world from
RANK/WORLD_SIZE, daemon from GRADD_SOCKET, job from GRADD_JOB.
"""
import copy
import json
import sys

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import gradd.torch
from parity_util import init_gloo, rel_err


def main():
    init_file, steps, cap = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rank, _ = init_gloo(init_file)
    torch.manual_seed(1000 + rank)
    # 6 layers of 64x64 (16 KiB of weights each): the daemon's candidate
    # caps (the test's config) give different plans.
    model = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(64, 64), nn.Tanh())],
                          nn.Linear(64, 10))
    ref = TorchDDP(copy.deepcopy(model))
    kw = {"bucket_cap_mb": "auto"} if cap == "auto" else {}
    # A first bucket of 16 KiB (torch's is 1 MiB, which would hold the whole
    # model); the layout does not change the averages.
    ours = gradd.torch.DistributedDataParallel(
        copy.deepcopy(model), first_bucket_cap_mb=0.015625, **kw)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9)
    worst = 0.0
    layouts = []
    for step in range(steps):
        g = torch.Generator().manual_seed(step * 100 + rank)
        x = torch.randn(16, 64, generator=g)
        y = torch.randint(0, 10, (16,), generator=g)
        for ddp, opt in ((ref, opt_ref), (ours, opt_ours)):
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
        for p, q in zip(ref.module.parameters(), ours.module.parameters()):
            worst = max(worst, rel_err(q.grad, p.grad))
            # Every gradient is still a view into the shared buckets.
            assert q.grad.data_ptr() == ours.client.gradient_address(
                [id(t) for t in ours._params].index(id(q)))
        opt_ref.step()
        opt_ours.step()
        for p, q in zip(ref.module.parameters(), ours.module.parameters()):
            worst = max(worst, rel_err(q, p))
        layouts.append(ours.num_buckets)
    print(json.dumps({
        "rank": rank,
        "worst": worst,
        "layouts": layouts,
        "next_plan_switch": ours.client.next_plan_switch,
        "rebuilt": ours.client.has_rebuilt_buckets,
        "checksum": float(sum(p.double().sum() for p in ours.module.parameters())),
    }))
    ours.shutdown()


if __name__ == "__main__":
    main()
