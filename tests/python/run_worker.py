"""A worker for test_run.py, started by `gradd run`: PyTorch's DDP tutorial
(ToyModel, MSELoss, SGD) in a loop of steps whose data depends only on the
step and the rank, with the two lines gradd needs: the import of
gradd.torch's DistributedDataParallel in place of torch's, and the loop's
header, ``for step in ddp_model.steps(optimizer, steps)`` in place of
``for step in range(steps)`` (it wraps the optimizer in place,
gradd.torch.OptimizerWrapper).

Environment (the test's): GRADD_TEST_OUT (directory for the report),
GRADD_TEST_STEPS, GRADD_TEST_DIE_AT_STEP / GRADD_TEST_RAISE_AT_STEP (on
rank GRADD_TEST_VICTIM, first start only: SIGKILL itself / raise in that
step), GRADD_TEST_DIE_ALWAYS (SIGKILL itself at that step on every start),
GRADD_TEST_STEP_SLEEP (seconds per step)."""
import json
import os
import signal
import time

import torch
import torch.nn as nn
import torch.optim as optim

from gradd.torch import DistributedDataParallel as DDP  # changed line 1


class ToyModel(nn.Module):  # torch's DDP tutorial's model
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(20, 10, generator=g), torch.randn(20, 5, generator=g)


def env_int(name, default=-1):
    return int(os.environ.get(name, default))


def main():
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    restart_count = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    out = os.environ["GRADD_TEST_OUT"]
    steps = env_int("GRADD_TEST_STEPS", 10)
    victim = env_int("GRADD_TEST_VICTIM")
    sleep = float(os.environ.get("GRADD_TEST_STEP_SLEEP", "0"))
    with open(os.path.join(out, f"pid-{rank}-{restart_count}"), "w") as f:
        json.dump({"pid": os.getpid(), "socket": os.environ["GRADD_SOCKET"]}, f)
    print(f"rank {rank} starting (restart {restart_count})", flush=True)

    torch.manual_seed(0)
    model = ToyModel()
    ddp_model = DDP(model)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.01, momentum=0.9)
    for step in ddp_model.steps(optimizer, steps):  # changed line 2
        x, y = batch(step, rank)
        optimizer.zero_grad()
        outputs = ddp_model(x)
        if rank == victim and step == env_int("GRADD_TEST_DIE_AT_STEP") and (
                restart_count == 0 or os.environ.get("GRADD_TEST_DIE_ALWAYS")):
            print(f"rank {rank}: SIGKILL at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == victim and step == env_int("GRADD_TEST_RAISE_AT_STEP") and restart_count == 0:
            raise ValueError(f"rank {rank} fails on purpose at step {step}")
        loss_fn(outputs, y).backward()
        optimizer.step()
        if sleep:
            time.sleep(sleep)

    wrapper = optimizer._gradd_wrapper  # the test's report only
    report = {
        "rank": rank,
        "pid": os.getpid(),
        "restart_count": restart_count,
        "rejoined": ddp_model.restarted,
        "skipped": wrapper.skipped,
        "step_count": wrapper.step_count,
        "grace": ddp_model.rank_restart_grace_ms,
        "job_id": ddp_model.job_id,
        "params": [p.detach().double().flatten().tolist() for p in model.parameters()],
        "params_hex": [float(v).hex() for p in model.parameters() for v in p.detach().flatten()],
        "env": {k: os.environ.get(k) for k in (
            "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
            "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR",
            "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
            "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE",
            "GRADD_JOB", "GRADD_SOCKET", "GRADD_RANK_RESTART_GRACE_MS", "GRADD_MIN_NODES")},
    }
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    print(f"rank {rank} done: {wrapper.step_count} steps, {wrapper.skipped} skipped",
          flush=True)
    ddp_model.shutdown()


if __name__ == "__main__":
    main()
