"""One rank of the forward-overlap tests (test_overlap.py): the same model
trained three ways side by side in this process, on each rank's own data:

* ref: torch's DistributedDataParallel (Gloo) + torch.optim.SGD stepped
  after backward;
* plain: gradd.torch's DDP + the same torch.optim.SGD after backward (every
  bucket waited for at the end of backward);
* over: gradd.torch's DDP with ``_register_fused_optim(SGD, ...,
  overlap_forward=True)``: no optimizer.step(); the next forward waits for
  and steps each submodule's buckets.

Prints one JSON line: whether plain and over ended bitwise equal, the
largest relative difference to torch's, how many buckets the forward
pre-hooks (rather than the end of the forward) finished.

Args: GLOO_INIT_FILE STEPS. Rank/world from RANK/WORLD_SIZE..., daemon from
GRADD_SOCKET, job from GRADD_JOB.
"""
import copy
import json
import sys

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import gradd.torch
from parity_util import init_gloo, rel_err

CAP_MB = 0.004  # ~4 KB: several buckets, one or two layers each
SGD = dict(lr=0.05, momentum=0.9, weight_decay=1e-4)


def deep_mlp(layers=8, width=24):
    mods = []
    for k in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*mods, nn.Linear(width, 3))


def main():
    init_file, steps = sys.argv[1], int(sys.argv[2])
    rank, world = init_gloo(init_file)
    torch.manual_seed(1000 + rank)  # the DDPs broadcast rank 0's weights
    model = deep_mlp()
    caps = dict(bucket_cap_mb=CAP_MB, first_bucket_cap_mb=CAP_MB)
    ref = TorchDDP(copy.deepcopy(model), bucket_cap_mb=CAP_MB)
    plain = gradd.torch.DistributedDataParallel(copy.deepcopy(model), **caps)
    over = gradd.torch.DistributedDataParallel(copy.deepcopy(model), **caps)
    opt_ref = torch.optim.SGD(ref.parameters(), **SGD)
    opt_plain = torch.optim.SGD(plain.parameters(), **SGD)
    over._register_fused_optim(torch.optim.SGD, **SGD, overlap_forward=True)
    loss_fn = nn.CrossEntropyLoss()
    mid_equal = None
    for step in range(steps):
        g = torch.Generator().manual_seed(step * 100 + rank)
        x = torch.randn(16, 24, generator=g)
        y = torch.randint(0, 3, (16,), generator=g)
        for ddp, opt in ((ref, opt_ref), (plain, opt_plain)):
            opt.zero_grad()
            loss_fn(ddp(x), y).backward()
            opt.step()
        over.zero_grad()  # deferred while the last iteration is pending
        loss_fn(over(x), y).backward()
        if step == steps // 2:
            # Reading through the DDP finishes the pending iteration.
            mid_equal = all(torch.equal(a, b) for a, b in
                            zip(plain.state_dict().values(), over.state_dict().values()))
    over_params = [p.detach().clone() for p in over.parameters()]  # finishes
    bitwise = all(torch.equal(p, q) for p, q in zip(plain.module.parameters(), over_params))
    grads_bitwise = all(torch.equal(p.grad, q.grad) for p, q in
                        zip(plain.module.parameters(), over.module.parameters()))
    err = max(rel_err(q, p) for p, q in zip(ref.module.parameters(), over_params))
    moved = any(not torch.equal(p, q) for p, q in zip(model.parameters(), over_params))
    stats = dict(over._overlap.stats)
    print(json.dumps(dict(rank=rank, world=world, bitwise=bitwise, grads_bitwise=grads_bitwise,
                          mid_equal=mid_equal, err=err, moved=moved, buckets=over.num_buckets,
                          **stats)))
    for d in (plain, over):
        d.shutdown()


if __name__ == "__main__":
    main()
