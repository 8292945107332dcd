#!/usr/bin/python3
"""Data-parallel PyTorch training through the node's gradd daemon.

gradd.torch.DistributedDataParallel is a drop-in for torch's: no
init_process_group, the daemon averages the gradients. Launch it with
`gradd run` (torchrun's flags and environment; it starts a daemon for the
launch when none runs on the node, and stops it at the end):

    gradd run --nproc-per-node 2 examples/pytorch/train.py --steps 100
    # from the build tree, without the wheel's `gradd` command:
    PYTHONPATH=build/client/python /usr/bin/python3 -m gradd.run \\
        --nproc-per-node 2 examples/pytorch/train.py --steps 100

(Any launcher that sets torchrun's variables works too: RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR/MASTER_PORT or GRADD_JOB, and
GRADD_SOCKET for a daemon off its default path. Across machines see
docs/operations.md, "Multi-node jobs".) gradd run draws a fresh job id for
each launch (GRADD_JOB); without it the id defaults to
torch-MASTER_ADDR:MASTER_PORT, so all ranks of one launch meet in the daemon.

Each rank trains a small MLP regression on its own shard of a synthetic data
set (each step's batch a function of the step and the rank); rank 0 prints
the loss, every rank prints a checksum of its parameters at the end, which
must be the same on all ranks.

--restart-safe: the rank restart loop (client/python/README.md, "Rank
restart"), written out by hand; gradd.torch.OptimizerWrapper does the same
inside the optimizer (tests/python/run_worker.py is torch's DDP tutorial
loop with it). With a grace and an explicit job id -- which `gradd run
--max-restarts N` sets (GRADD_RANK_RESTART_GRACE_MS, GRADD_JOB) -- a rank
whose process is killed is started again by the launcher alone, with the
same RANK / LOCAL_RANK / GRADD_JOB: it re-attaches, receives the
parameters, the optimizer state and the step from the others, and the
others retry the batch of the iteration its death aborted:

    gradd run --nproc-per-node 2 --max-restarts 3 \\
        examples/pytorch/train.py --steps 2000 --restart-safe

(kill -9 one of the trainers: the launcher restarts it, the other pauses and
goes on.)

--min-nodes N (or GRADD_MIN_NODES; with --restart-safe and GRADD_JOB): a
multi-node job goes on when a node dies as long as N nodes are left, and
takes it back when its daemon and trainers start again (docs/operations.md,
"Training that survives a trainer's death"). Each loss or arrival aborts one
iteration on every rank, handled by the same loop; rank 0 prints the live
world size when it changes.
"""
import argparse
import os

import torch
from torch import nn

import gradd
from gradd.torch import DistributedDataParallel as DDP


def batch(step, rank, size, teacher):
    """The batch of `step` on `rank`: the same whenever it is drawn (a
    retried or restarted step sees the same data)."""
    g = torch.Generator().manual_seed(1_000_003 * step + rank)
    x = torch.randn(size, 64, generator=g)
    with torch.no_grad():
        y = teacher(x)
    return x, y


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--bucket-cap-mb", type=float, default=25)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--restart-safe", action="store_true",
                    help="the rank restart loop (needs an explicit job id: GRADD_JOB)")
    ap.add_argument("--rank-restart-grace-ms", type=int, default=None,
                    help="the job's rank restart grace (default: "
                         "$GRADD_RANK_RESTART_GRACE_MS, else the daemon's)")
    ap.add_argument("--min-nodes", type=int, default=None,
                    help="node loss and arrival: the fewest nodes the job goes on "
                         "with (default: $GRADD_MIN_NODES, else the daemon's; use "
                         "with --restart-safe)")
    ap.add_argument("--divide-by-initial-world-size", action="store_true",
                    help="after a node is lost, average over the initial world size "
                         "(DDP's divide_by_initial_world_after_reformation; the C++ "
                         "trainer's flag and ClientOptions' name)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rank = int(os.environ.get("RANK", "0"))

    torch.manual_seed(0)
    teacher = nn.Linear(64, 8)  # the function to learn
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 8))
    # Broadcasts rank 0's weights (a restarted rank: gets the job's at its
    # first sync instead).
    ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb,
              rank_restart_grace_ms=args.rank_restart_grace_ms,
              min_nodes=args.min_nodes,
              divide_by_initial_world_after_reformation=args.divide_by_initial_world_size)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)

    if rank == 0 or ddp.restarted:
        # graddctl counts the plan's buckets, gradd's used-parameter map
        # (find_unused_parameters) among them; num_buckets only the model's.
        used_map = ddp.client.num_buckets > ddp.num_buckets
        print(f"job {ddp.job_id}: {ddp.world_size} ranks, {ddp.num_buckets} bucket(s)"
              f"{' + the used-parameter map' if used_map else ''}, "
              f"{sum(p.numel() for p in model.parameters())} parameters"
              + (f"; rank {rank} restarted at iteration {ddp.restart_iteration}"
                 if ddp.restarted else ""), flush=True)
    if args.restart_safe:
        train_restart_safe(args, ddp, opt, teacher, rank)
    else:
        for step in range(1, args.steps + 1):
            x, y = batch(step, rank, args.batch, teacher)
            opt.zero_grad()
            loss = nn.functional.mse_loss(ddp(x), y)
            loss.backward()  # returns with gradients averaged over all ranks
            opt.step()
            if rank == 0 and (step % 20 == 0 or step == 1):
                print(f"step {step:4d}  loss {loss.item():.5f}", flush=True)

    checksum = sum(p.double().sum().item() for p in model.parameters())
    print(f"rank {rank}: parameter checksum {checksum:.10f}", flush=True)
    ddp.shutdown()


def train_restart_safe(args, ddp, opt, teacher, rank):
    """The rank restart pattern: what a restarted rank must get from the
    others is registered (the optimizer's momentum, the step), the batch is
    picked after the state sync, and an iteration aborted by a restart is
    retried without the optimizer step."""
    state = {"step": 1}
    ddp.register_state(opt.state_dict, opt.load_state_dict)
    ddp.register_state(lambda: dict(state), state.update)
    live = ddp.live_world_size
    while state["step"] <= args.steps:
        ddp.sync_state()  # a restarted rank takes the job's step here
        step = state["step"]
        x, y = batch(step, rank, args.batch, teacher)
        opt.zero_grad()
        try:
            loss = nn.functional.mse_loss(ddp(x), y)
            loss.backward()
        except gradd.IterationAbortedError as e:
            # A rank restarted, or a node was lost or came back: nobody
            # applies this iteration. Retry it.
            print(f"rank {rank}: step {step} aborted ({e}); retrying", flush=True)
            continue
        if ddp.live_world_size != live:
            live = ddp.live_world_size
            if rank == 0 or ddp.restarted:
                print(f"rank {rank}: {live} of {ddp.world_size} ranks taking part "
                      f"(epoch {ddp.epoch})", flush=True)
        opt.step()
        state["step"] += 1
        if rank == 0 and (step % 20 == 0 or step == 1):
            print(f"step {step:4d}  loss {loss.item():.5f}", flush=True)


if __name__ == "__main__":
    main()
