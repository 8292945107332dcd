#!/usr/bin/python3
"""What a communication hook that runs in the trainer costs, by the group it
communicates over (gradd/_hook_group.py): torch's Gloo group vs the job's
gradd group (the torch.distributed backend "gradd" through the node's
daemon), side by side in one invocation, 2 ranks on one node.

Part 1, per bucket: a user-written hook (allreduce, then divide in a
``.then``) on one flat float32 bucket of each size, over
  gloo        torch's default Gloo group (what the hook used before),
  gradd       the group gradd.torch hands the hook (HookProcessGroup: the
              job's ProcessGroupGradd, futures completed on a pool thread),
  gradd_raw   the ProcessGroupGradd itself (no completion hop; what gradd's
              own collectives on this path use).
Median microseconds per hook call (launch to result; the modes interleaved
call by call), and algbw.

Part 2, per training step (an MLP of --hidden width, batch 16, one thread
per rank): gradd.torch with torch's allreduce_hook (the daemon runs it),
with the user hook over the gradd group (state None), with the user hook
over a Gloo group (a second Gloo group as its state), and torch's DDP with
the user hook over Gloo. Median step time; rounds alternate.

    PYTHONPATH=build/client/python /usr/bin/python3 bench/trainer_hooks.py \\
        --gradd build/server/gradd [--sizes-kib 16,256,1024,4096,25600] [--json]

Benchmarks are not tests: nothing here asserts.
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HOOK_MODES = ("gloo", "gradd", "gradd_raw")
STEP_MODES = ("daemon_allreduce", "user_hook_gradd", "user_hook_gloo", "torch_ddp_user_hook")


def allreduce_then_divide(state, bucket):
    import torch.distributed as dist

    world = dist.get_world_size(state)
    fut = dist.all_reduce(bucket.buffer(), group=state, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].div_(world))


def worker(args):
    import torch
    import torch.distributed as dist

    import gradd.torch
    from gradd import _hook_group, distributed
    from gradd._trainer_hooks import GradBucket

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"file://{args.init}", rank=rank,
                            world_size=world)
    results = {"hook": {}, "step": {}}

    # -- part 1 -----------------------------------------------------------
    raw = distributed._c10d.create(
        rank, world, job_id=f"{os.environ['GRADD_JOB']}/bench-hooks",
        socket=os.environ["GRADD_SOCKET"], local_rank=rank, local_world_size=world,
        node_rank=0, num_nodes=1, coordinator="")
    groups = {"gloo": dist.group.WORLD, "gradd": _hook_group.HookProcessGroup(raw),
              "gradd_raw": raw}
    for kib in args.sizes_kib:
        buf = torch.ones(kib * 256)
        bucket = GradBucket(0, 1, buf, [])
        reps = max(5, min(50, int(200_000 / kib)))
        times = {mode: [] for mode in HOOK_MODES}
        for i in range(reps + 3):
            for mode in HOOK_MODES:  # interleaved: the same machine load for each
                dist.barrier()
                t0 = time.perf_counter()
                allreduce_then_divide(groups[mode], bucket).wait()
                if i >= 3:
                    times[mode].append(time.perf_counter() - t0)
        results["hook"][str(kib)] = {m: statistics.median(t) * 1e6 for m, t in times.items()}
    groups["gradd"].close()

    # -- part 2 -----------------------------------------------------------
    nn = torch.nn
    h = args.hidden

    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(256, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(),
                             nn.Linear(h, 10))

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    other_gloo = dist.new_group(backend="gloo")
    x = torch.randn(16, 256)
    y = torch.randint(0, 10, (16,))
    for rnd in range(args.rounds):
        for mode in STEP_MODES:
            if mode == "torch_ddp_user_hook":
                ddp = torch.nn.parallel.DistributedDataParallel(model())
                ddp.register_comm_hook(None, allreduce_then_divide)
            else:
                ddp = gradd.torch.DistributedDataParallel(model())
                if mode == "daemon_allreduce":
                    ddp.register_comm_hook(None, default_hooks.allreduce_hook)
                elif mode == "user_hook_gradd":
                    ddp.register_comm_hook(None, allreduce_then_divide)
                else:
                    ddp.register_comm_hook(other_gloo, allreduce_then_divide)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
            times = []
            for i in range(args.steps + 2):
                dist.barrier()
                t0 = time.perf_counter()
                opt.zero_grad()
                nn.functional.cross_entropy(ddp(x), y).backward()
                opt.step()
                if i >= 2:
                    times.append(time.perf_counter() - t0)
            results["step"].setdefault(mode, []).append(statistics.median(times) * 1e3)
            if hasattr(ddp, "shutdown"):
                ddp.shutdown()
            del ddp, opt
    print("RESULT " + json.dumps(results), flush=True)
    dist.barrier()
    os._exit(0)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gradd", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   "..", "build", "server", "gradd"))
    p.add_argument("--sizes-kib", default="16,256,1024,4096,25600")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--init", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.sizes_kib = [int(s) for s in str(args.sizes_kib).split(",")]
    if args.worker:
        worker(args)
        return

    tmp = tempfile.mkdtemp(prefix="gradd-hookbench-")
    sock = os.path.join(tmp, "gradd.sock")
    daemon = subprocess.Popen([args.gradd, "--socket", sock], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(sock + ".session"):
            if time.monotonic() > deadline or daemon.poll() is not None:
                sys.exit("gradd did not start")
            time.sleep(0.05)
        procs = []
        for rank in range(2):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE="2", GRADD_SOCKET=sock, GRADD_JOB="hookbench",
                       OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker",
                 "--init", os.path.join(tmp, "init"), "--sizes-kib",
                 ",".join(map(str, args.sizes_kib)), "--hidden", str(args.hidden),
                 "--steps", str(args.steps), "--rounds", str(args.rounds)],
                env=env, stdout=subprocess.PIPE, text=True))
        outs = [pr.communicate(timeout=1800)[0] for pr in procs]
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)
    ranks = [json.loads(next(l for l in o.splitlines() if l.startswith("RESULT "))[7:])
             for o in outs]
    # The slower rank's figure for each entry.
    hook = {kib: {m: max(r["hook"][kib][m] for r in ranks) for m in HOOK_MODES}
            for kib in ranks[0]["hook"]}
    step = {m: min(max(r["step"][m][i] for r in ranks) for i in range(args.rounds))
            for m in STEP_MODES}
    if args.json:
        print(json.dumps({"hook_us": hook, "step_ms": step}, indent=1))
        return
    print("per hook call (allreduce + divide), 2 ranks, median microseconds")
    print(f"{'size':>10} " + " ".join(f"{m:>11}" for m in HOOK_MODES) +
          f" {'gradd/gloo':>11} {'algbw gradd':>12}")
    for kib, row in hook.items():
        nbytes = int(kib) * 1024
        print(f"{int(kib):>7} KiB " + " ".join(f"{row[m]:>11.0f}" for m in HOOK_MODES) +
              f" {row['gradd'] / row['gloo']:>11.2f} {nbytes / row['gradd'] / 1e3:>8.2f} GB/s")
    print(f"\nper training step (MLP 256-{args.hidden}-{args.hidden}-10, batch 16), best "
          f"of {args.rounds} rounds of the median of {args.steps} steps, milliseconds")
    for m in STEP_MODES:
        print(f"{m:>22} {step[m]:>8.2f}")


if __name__ == "__main__":
    main()
