"""One rank of the CUDA parity test: the same model on GPU 0 wrapped by
torch's DistributedDataParallel (Gloo, which takes CUDA tensors; NCCL
refuses two ranks on one GPU) and by gradd.torch's, trained side by side;
after every step gradients, parameters and buffers are compared. Prints one
JSON line.

Args: MODEL DTYPE GLOO_INIT_FILE STEPS (DTYPE: float32, float16, bfloat16).
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

CAP_MB = 0.002


def main():
    name, dtype_name, init_file, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    dtype = getattr(torch, dtype_name)
    rank, world = init_gloo(init_file)
    dev = torch.device("cuda", 0)
    torch.manual_seed(1000 + rank)
    model, make_input, loss_fn = models.build(name)
    model = model.to(dev, dtype)
    ref = TorchDDP(copy.deepcopy(model), device_ids=[0], bucket_cap_mb=CAP_MB)
    ours = gradd.torch.DistributedDataParallel(
        copy.deepcopy(model), device_ids=[0], bucket_cap_mb=CAP_MB, first_bucket_cap_mb=CAP_MB
    )
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9)
    per_step = []
    for step in range(steps):
        g = torch.Generator().manual_seed(step * 100 + rank)
        x = make_input(g).to(dev, dtype)
        y = torch.randint(0, 10, (x.shape[0],), generator=g).to(dev)
        for ddp, opt in ((ref, opt_ref), (ours, opt_ours)):
            opt.zero_grad()
            loss_fn(ddp(x).float(), y).backward()
        err = 0.0
        for p, q in zip(ref.module.parameters(), ours.module.parameters()):
            err = max(err, rel_err(q.grad, p.grad))
        opt_ref.step()
        opt_ours.step()
        for p, q in zip(ref.module.parameters(), ours.module.parameters()):
            err = max(err, rel_err(q, p))
        for p, q in zip(ref.module.buffers(), ours.module.buffers()):
            err = max(err, rel_err(q, p))
        per_step.append(err)
    torch.cuda.synchronize()
    print(json.dumps({
        "rank": rank,
        "per_step": per_step,
        "grads_on_device": all(p.grad.is_cuda for p in ours.module.parameters()),
        "grads_are_views": all(
            p.grad.data_ptr() == ours.client.gradient_address(i)
            for i, p in enumerate(ours.module.parameters())
        ),
    }))
    ours.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
