"""One rank of the parity test: trains the same model with torch's
DistributedDataParallel (Gloo) and with gradd.torch.DistributedDataParallel
side by side in this process, and after every step compares gradients,
parameters and buffers. Prints one JSON line with what it measured.

Args: MODEL GLOO_INIT_FILE STEPS. Rank/world from RANK/WORLD_SIZE...,
daemon from GRADD_SOCKET, job from GRADD_JOB.
"""
import copy
import json
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import gradd.torch
import models
from parity_util import init_gloo, rel_err

CAP_MB = 0.002  # ~2 KB: forces several buckets even for the small CNN


def main():
    name, init_file, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rank, world = init_gloo(init_file)

    # Different initial weights on each rank: both wrappers must broadcast
    # rank 0's state at construction.
    torch.manual_seed(1000 + rank)
    model, make_input, loss_fn = models.build(name)
    ref = TorchDDP(copy.deepcopy(model), bucket_cap_mb=CAP_MB)
    ours = gradd.torch.DistributedDataParallel(
        copy.deepcopy(model), bucket_cap_mb=CAP_MB, first_bucket_cap_mb=CAP_MB
    )
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)

    worst = {"grad": 0.0, "param": 0.0, "buffer": 0.0}
    per_step = []
    grads_differ_locally = False
    for step in range(steps):
        g = torch.Generator().manual_seed(step * 100 + rank)  # each rank its own data
        x = make_input(g)
        y = torch.randint(0, 10, (x.shape[0],), generator=g)
        for ddp, opt in ((ref, opt_ref), (ours, opt_ours)):
            opt.zero_grad()
            loss_fn(ddp(x), y).backward()
        if step == 0:
            # Sanity: the averaged gradient differs from this rank's own one.
            local = copy.deepcopy(ours.module)
            for p in local.parameters():
                p.grad = None
            loss_fn(local(x), y).backward()
            grads_differ_locally = any(
                rel_err(p.grad, q.grad) > 1e-3
                for p, q in zip(local.parameters(), ours.module.parameters())
            )
        step_err = 0.0
        for p, q in zip(ref.module.parameters(), ours.module.parameters()):
            e = rel_err(q.grad, p.grad)
            worst["grad"] = max(worst["grad"], e)
            step_err = max(step_err, e)
        opt_ref.step()
        opt_ours.step()
        for p, q in zip(ref.module.parameters(), ours.module.parameters()):
            e = rel_err(q, p)
            worst["param"] = max(worst["param"], e)
            step_err = max(step_err, e)
        for p, q in zip(ref.module.buffers(), ours.module.buffers()):
            e = rel_err(q, p)
            worst["buffer"] = max(worst["buffer"], e)
            step_err = max(step_err, e)
        per_step.append(step_err)

    flat = torch.cat([p.detach().reshape(-1).double() for p in ours.module.parameters()])
    print(json.dumps({
        "rank": rank,
        "num_buckets": ours.num_buckets,
        "worst": worst,
        "per_step": per_step,
        "grads_differ_locally": grads_differ_locally,
        "grads_in_shared_memory": all(
            p.grad.data_ptr() == ours.client.gradient_address(i)
            for i, p in enumerate(ours.module.parameters())
        ),
        "checksum": flat.sum().item(),
        "param0": flat[:8].tolist(),
    }))
    ours.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
