#!/usr/bin/python3
"""Data-parallel PyTorch training through the node's gradd daemon.

gradd.torch.DistributedDataParallel is a drop-in for torch's: no
init_process_group, the daemon averages the gradients. Start a daemon, then
one process per rank with torchrun's environment variables:

    build/server/gradd --socket /tmp/gradd/gradd.sock &
    for r in 0 1; do
      RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 \\
      MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 GRADD_SOCKET=/tmp/gradd/gradd.sock \\
      PYTHONPATH=build/client/python \\
      /usr/bin/python3 examples/pytorch/train.py --steps 100 &
    done; wait

(torchrun --nproc_per_node=2 --master_port=29500 --redirects 1 --tee 1
--log_dir /tmp/torchrun-logs examples/pytorch/train.py sets the same
variables; Debian's torch 1.13 torchrun crashes on Python 3.11 before it
starts the workers unless it is given --redirects/--tee of 1 or 2: 0 and 3
crash too. Across machines see docs/operations.md, "Multi-node jobs".) The job id defaults to torch-MASTER_ADDR:MASTER_PORT,
so all ranks of one launch meet in the daemon; GRADD_JOB overrides it.

Each rank trains a small MLP regression on its own shard of a synthetic data
set; rank 0 prints the loss, every rank prints a checksum of its parameters at
the end, which must be the same on all ranks.
"""
import argparse
import os

import torch
from torch import nn

from gradd.torch import DistributedDataParallel as DDP


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--bucket-cap-mb", type=float, default=25)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rank = int(os.environ.get("RANK", "0"))

    torch.manual_seed(0)
    teacher = nn.Linear(64, 8)  # the function to learn
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 8))
    ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb)  # broadcasts rank 0's weights
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    data = torch.Generator().manual_seed(1 + rank)  # each rank its own shard

    if rank == 0:
        print(f"job {ddp.job_id}: {ddp.world_size} ranks, {ddp.num_buckets} bucket(s), "
              f"{sum(p.numel() for p in model.parameters())} parameters", flush=True)
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, 64, generator=data)
        with torch.no_grad():
            y = teacher(x)
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # returns with gradients averaged over all ranks
        opt.step()
        if rank == 0 and (step % 20 == 0 or step == 1):
            print(f"step {step:4d}  loss {loss.item():.5f}", flush=True)

    checksum = sum(p.double().sum().item() for p in model.parameters())
    print(f"rank {rank}: parameter checksum {checksum:.10f}", flush=True)
    ddp.shutdown()


if __name__ == "__main__":
    main()
