"""One rank of the rank restart tests (test_rank_restart.py): a restart-safe
gradd.torch training loop, as client/python/README.md shows it.

Args: STEPS OUT_DIR GRACE_MS. Rank/world from RANK/WORLD_SIZE..., daemon
from GRADD_SOCKET, job from GRADD_JOB.

Data is a function of (step, rank) only, the model starts from seed 0, the
optimizer is SGD with momentum (state that a restarted rank must receive):
a run interrupted by a restart whose aborted batch is retried must end with
exactly the parameters of an uninterrupted run.

GRADD_TEST_DIE_AT_STEP=K: this process SIGKILLs itself in the middle of the
backward of step K (from a gradient hook of the first layer, whose gradient
is computed last: the later layers' buckets are handed over, its own is
not), as a crashed trainer would die. GRADD_TEST_STEP_SLEEP_S=S: S seconds
of sleep after each applied step (time to look at the daemons meanwhile).

Writes OUT_DIR/rank<r>-<pid>.json: every attempt (step, should_commit,
aborted), the parameters right after the first forward's state sync of a
restarted rank and of a survivor's retry (``synced``), the final parameters,
``rejoined``, ``rejoin_iteration``, ``iterations_aborted``. A failure of the
job (not an aborted iteration) is written as ``error`` and exits 3.
"""
import json
import os
import signal
import sys
import time

import torch
from torch import nn

import gradd
from gradd.torch import DistributedDataParallel as DDP


def batch(step, rank):
    g = torch.Generator().manual_seed(7919 * step + rank)
    x = torch.randn(16, 12, generator=g)
    y = torch.randn(16, 4, generator=g)
    return x, y


def flat(module):
    return [p.detach().double().reshape(-1).tolist() for p in module.parameters()]


def main():
    steps, out_dir, grace = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    rank = int(os.environ["RANK"])
    die_at = int(os.environ.get("GRADD_TEST_DIE_AT_STEP", "-1"))
    step_sleep = float(os.environ.get("GRADD_TEST_STEP_SLEEP_S", "0"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                          nn.Linear(32, 4))
    # Tiny buckets: several per iteration, so a rank can die with some handed over.
    ddp = DDP(model, bucket_cap_mb=0.002, first_bucket_cap_mb=0.002,
              rank_restart_grace_ms=grace, wait_timeout=120)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    state = {"step": 0}
    ddp.register_state(opt.state_dict, opt.load_state_dict)
    ddp.register_state(lambda: dict(state), lambda sd: state.update(sd))

    report = {
        "rank": rank, "pid": os.getpid(), "rejoined": ddp.restarted,
        "rejoin_iteration": ddp.restart_iteration, "attempts": [], "synced": None,
        "grace": ddp.rank_restart_grace_ms,
    }
    path = os.path.join(out_dir, f"rank{rank}-{os.getpid()}.json")

    def write():
        with open(path + ".tmp", "w") as f:
            json.dump(report, f)
        os.replace(path + ".tmp", path)

    # The parameters as the module's forward sees them right after the state
    # sync (DDP's forward syncs first): a restarted rank's first forward and
    # a survivor's retry after an aborted iteration.
    snap = {"want": ddp.restarted}

    def pre_hook(module, inputs):
        if snap["want"]:
            snap["want"] = False
            report["synced"] = {"step": state["step"], "params": flat(module)}

    model.register_forward_pre_hook(pre_hook)
    if die_at >= 0:
        def die(grad):
            if state["step"] == die_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return grad

        model[0].weight.register_hook(die)

    try:
        while state["step"] < steps:
            # A restarted rank takes the job's step (and everything else
            # registered) here, before it picks its batch.
            ddp.sync_state()
            step = state["step"]
            x, y = batch(step, rank)
            opt.zero_grad()
            try:
                nn.functional.mse_loss(ddp(x), y).backward()
            except gradd.IterationAbortedError as e:
                report["attempts"].append(
                    {"step": step, "commit": ddp.should_commit(), "aborted": str(e),
                     "next_iteration": ddp.client.iteration})
                snap["want"] = True
                continue
            report["attempts"].append({"step": step, "commit": ddp.should_commit()})
            opt.step()
            state["step"] += 1
            if step_sleep:
                time.sleep(step_sleep)
    except gradd.GraddError as e:
        report["error"] = f"{type(e).__name__}: {e}"
        write()
        sys.exit(3)
    report["iterations_aborted"] = ddp.iterations_aborted
    report["final"] = flat(model)
    write()
    ddp.shutdown()


if __name__ == "__main__":
    main()
