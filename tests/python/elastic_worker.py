"""One rank of the node loss and arrival tests (test_elastic_nodes.py): the
restart-safe gradd.torch loop of examples/pytorch/train.py --restart-safe,
on a multi-node job with min_nodes.

Args: STEPS OUT_DIR MIN_NODES. Rank/world/node from RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GRADD_COORDINATOR, daemon from
GRADD_SOCKET, job from GRADD_JOB.

Data is a function of (step, rank) only, the model starts from seed 0, the
optimizer is plain SGD (lr 0.05): what the job computes is fully determined
by which ranks took part in each applied step, which every rank records
(``live`` of each attempt), so the test can recompute the parameters
without gradd (test_elastic_nodes.reference).

GRADD_TEST_DIVIDE_BY_INITIAL=1: the job averages over its initial world
size (divide_by_initial_world_after_reformation=True), not the live one.

GRADD_TEST_PAUSE_AT_STEP=K: before step K's forward this process writes
OUT_DIR/paused-<rank> and sleeps (the test then SIGKILLs it and its node's
daemon: the node dies between two of its iterations, so step K is the first
step the others run without it). GRADD_TEST_STEP_SLEEP_S=T: T seconds of
"compute" per step (so that a node can arrive while the job runs).

Writes OUT_DIR/rank<r>-<pid>.json: every attempt (step, live world size,
epoch, aborted), the step it synced at, the final parameters. A failure of
the job (not an aborted iteration) is written as ``error`` and exits 3.
"""
import json
import os
import sys
import time

import torch
from torch import nn

import gradd
from gradd.torch import DistributedDataParallel as DDP

LR = 0.05


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 4))


def batch(step, rank):
    g = torch.Generator().manual_seed(7919 * step + rank)
    return torch.randn(8, 12, generator=g), torch.randn(8, 4, generator=g)


def flat(module):
    return [p.detach().double().reshape(-1).tolist() for p in module.parameters()]


def main():
    steps, out_dir, min_nodes = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    rank = int(os.environ["RANK"])
    pause_at = int(os.environ.get("GRADD_TEST_PAUSE_AT_STEP", "-1"))
    step_sleep = float(os.environ.get("GRADD_TEST_STEP_SLEEP_S", "0"))
    divide = os.environ.get("GRADD_TEST_DIVIDE_BY_INITIAL") == "1"
    model = make_model()
    report = {"rank": rank, "pid": os.getpid(), "attempts": [], "synced_at": []}
    path = os.path.join(out_dir, f"rank{rank}-{os.getpid()}.json")

    def write():
        with open(path + ".tmp", "w") as f:
            json.dump(report, f)
        os.replace(path + ".tmp", path)

    try:
        ddp = DDP(model, bucket_cap_mb=0.001, first_bucket_cap_mb=0.001,
                  min_nodes=min_nodes, divide_by_initial_world_after_reformation=divide,
                  wait_timeout=30, attach_timeout=60)
        opt = torch.optim.SGD(ddp.parameters(), lr=LR)
        state = {"step": 0}
        ddp.register_state(lambda: dict(state), lambda sd: state.update(sd))
        report.update(rejoined=ddp.restarted, min_nodes=ddp.min_nodes,
                      world_size=ddp.world_size)
        while state["step"] < steps:
            if ddp.sync_state():
                report["synced_at"].append(state["step"])
            step = state["step"]
            if step == pause_at:
                open(os.path.join(out_dir, f"paused-{rank}"), "w").close()
                time.sleep(3600)
            if step_sleep:
                time.sleep(step_sleep)
            x, y = batch(step, rank)
            opt.zero_grad()
            try:
                nn.functional.mse_loss(ddp(x), y).backward()
            except gradd.IterationAbortedError as e:
                report["attempts"].append({"step": step, "aborted": str(e),
                                           "live": ddp.live_world_size, "epoch": ddp.epoch})
                continue
            # The live world of the iteration just completed (a re-formation
            # after it aborts the next one, and is read there).
            report["attempts"].append({"step": step, "live": ddp.live_world_size,
                                       "epoch": ddp.epoch})
            opt.step()
            state["step"] += 1
    except gradd.GraddError as e:
        report["error"] = f"{type(e).__name__}: {e}"
        write()
        sys.exit(3)
    report["final"] = flat(model)
    write()
    ddp.shutdown()


if __name__ == "__main__":
    main()
