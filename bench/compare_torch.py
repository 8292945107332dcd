#!/usr/bin/python3
"""gradd vs torch.distributed (Gloo) allreduce, in one invocation.

Runs gradd-bench (--format=json) and then torch.distributed's Gloo allreduce
with the same number of processes, sizes, warm-up and timed iterations, one
after the other on the same machine, and prints both side by side:

    /usr/bin/python3 bench/compare_torch.py --trainers 2
    /usr/bin/python3 bench/compare_torch.py --nodes 2 --trainers 2   # 4 torch ranks

Both sides measure the same thing: per iteration, every rank passes a
barrier (not timed), stamps CLOCK_MONOTONIC, runs the collective, stamps
again; the iteration's time is (last rank's end) - (last rank's start).
For torch the collective is what DDP's default comm hook does to a bucket:
all_reduce(SUM) of one float32 tensor followed by div_(world_size). Each
torch process uses one intra-op thread (and OMP_NUM_THREADS=1).

--rounds N (default 2) alternates the two sides N times (gradd, torch,
gradd, torch, ...) and keeps, per size and per side, the round with the
lower p50: on a shared or noisy machine a burst of load from elsewhere
then does not decide the ratio. Every round runs the full iteration count.

--collective compares gradd's collectives of arbitrary data instead:
gradd-collective-bench --format=json (Client::Allreduce, sum, float32,
between --trainers processes attached to one daemon) against torch's plain
all_reduce(SUM) of one float32 tensor on Gloo (no div_), same process
count, sizes, warm-up, iterations, rounds and timing:

    /usr/bin/python3 bench/compare_torch.py --collective --trainers 2

Use Debian's /usr/bin/python3 (python3-torch); a pyenv/venv python usually
has no torch.
"""

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

# One thread per process, set before torch is imported (here and in the
# spawned children, which inherit the environment).
os.environ["OMP_NUM_THREADS"] = "1"
os.environ.setdefault("MKL_NUM_THREADS", "1")

REPO = pathlib.Path(__file__).resolve().parent.parent
UNITS = {"": 1, "b": 1, "k": 1024, "kib": 1024, "m": 1 << 20, "mib": 1 << 20,
         "g": 1 << 30, "gib": 1 << 30, "kb": 10**3, "mb": 10**6, "gb": 10**9}


def parse_size(text):
    t = text.strip().lower()
    i = 0
    while i < len(t) and (t[i].isdigit() or t[i] == "."):
        i += 1
    if i == 0 or t[i:] not in UNITS:
        raise argparse.ArgumentTypeError(f"bad size {text!r}")
    size = int(round(float(t[:i]) * UNITS[t[i:]]))
    return size - size % 4


def format_size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or n % 1024:
            return f"{n}{unit}"
        n //= 1024
    return f"{n}TiB"


def percentile(samples, p):
    s = sorted(samples)
    if not s:
        return 0.0
    k = max(0, min(len(s) - 1, -(-len(s) * p // 100) - 1))
    return s[int(k)]


# --- torch side ----------------------------------------------------------------

def _torch_worker(rank, world, init_file, sizes, warmup, iters, out_dir,
                  divide=True):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}",
                            rank=rank, world_size=world)
    stamps = {}
    for size in sizes:
        t = torch.empty(size // 4, dtype=torch.float32)
        rows = []
        for i in range(warmup + iters):
            t.fill_(float(rank + 1 + i % 8))
            dist.barrier()
            t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            dist.all_reduce(t)
            if divide:
                t.div_(world)
            t1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            if i >= warmup:
                rows.append((t0, t1))
            want = sum(r + 1 + i % 8 for r in range(world))
            if divide:
                want /= world
            got = float(t[-1])
            if abs(got - want) > 1e-5 * abs(want):
                raise RuntimeError(f"torch rank {rank}: size {size} iteration "
                                   f"{i}: {got} != {want}")
        stamps[size] = rows
        del t
    with open(os.path.join(out_dir, f"torch{rank}.json"), "w") as f:
        json.dump({str(k): v for k, v in stamps.items()}, f)
    dist.barrier()
    dist.destroy_process_group()


def run_torch(world, sizes, warmup, iters, divide=True):
    """all_reduce(SUM) (+ div_(world) if divide) on Gloo; p50/p90/mean."""
    import torch.multiprocessing as mp

    tmp = tempfile.mkdtemp(prefix="gradd-compare.")
    try:
        init_file = os.path.join(tmp, "rendezvous")
        mp.spawn(_torch_worker,
                 args=(world, init_file, sizes, warmup, iters, tmp, divide),
                 nprocs=world, join=True)
        per_rank = []
        for r in range(world):
            with open(os.path.join(tmp, f"torch{r}.json")) as f:
                per_rank.append({int(k): v for k, v in json.load(f).items()})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    results = {}
    for size in sizes:
        times = []
        for i in range(iters):
            start = max(rank[size][i][0] for rank in per_rank)
            end = max(rank[size][i][1] for rank in per_rank)
            times.append((end - start) / 1e3)
        results[size] = {"p50_us": percentile(times, 50),
                         "p90_us": percentile(times, 90),
                         "mean_us": statistics.fmean(times)}
    return results


# --- gradd side ----------------------------------------------------------------

def run_gradd(args, sizes):
    """gradd-bench, or with --collective gradd-collective-bench (one node)."""
    if args.collective:
        cmd = [args.collective_bench, f"--trainers={args.trainers}"]
    else:
        cmd = [args.gradd_bench, f"--trainers={args.trainers}",
               f"--nodes={args.nodes}"]
    cmd += ["--sizes=" + ",".join(str(s) for s in sizes),
            f"--iters={args.iters}", f"--warmup={args.warmup}", "--format=json"]
    if args.gradd:
        cmd.append(f"--gradd={args.gradd}")
    name = os.path.basename(cmd[0])
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    rows = {}
    for line in proc.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            row = json.loads(line)
            rows[row["size_bytes"]] = row
    if proc.returncode != 0:
        print(f"# {name} exited with status {proc.returncode}; gradd "
              "columns are n/a", file=sys.stderr)
    return rows, proc.returncode


def keep_best(best, rows):
    """Per size, keeps the row (a dict with p50_us) with the lower p50."""
    for size, row in rows.items():
        if size not in best or row["p50_us"] < best[size]["p50_us"]:
            best[size] = row


def print_results(args, sizes, gradd, torch_results, title, bound):
    """Both sides per size: JSON lines, or the table (p50, ratio, p90, and
    gradd's bound fraction when `bound`)."""
    if args.format == "json":
        for size in sizes:
            g = gradd.get(size, {})
            t = torch_results[size]
            line = {"size_bytes": size} if bound else {"mode": "collective", "size_bytes": size}
            line.update({"gradd_p50_us": g.get("p50_us"), "gradd_p90_us": g.get("p90_us")})
            if bound:
                line["gradd_bound_fraction"] = g.get("bound_fraction")
            line.update({
                "torch_p50_us": t["p50_us"], "torch_p90_us": t["p90_us"],
                "ratio": (t["p50_us"] / g["p50_us"]) if g else None})
            if bound:
                line["nodes"] = args.nodes
            line["trainers"] = args.trainers
            print(json.dumps(line))
        return
    print(title)
    print("# time = last rank's start -> last rank's end, p50 over "
          "iterations; ratio = torch / gradd (higher: gradd faster)")
    print(f"# {'size':>10} {'gradd p50(us)':>14} {'torch p50(us)':>14} "
          f"{'ratio':>8} {'gradd p90(us)':>14} {'torch p90(us)':>14}"
          + (f" {'gradd bound':>12}" if bound else ""))
    for size in sizes:
        g = gradd.get(size)
        t = torch_results[size]
        if g:
            print(f"  {format_size(size):>10} {g['p50_us']:>14.1f} "
                  f"{t['p50_us']:>14.1f} {t['p50_us'] / g['p50_us']:>7.1f}x "
                  f"{g['p90_us']:>14.1f} {t['p90_us']:>14.1f}"
                  + (f" {g['bound_fraction']:>12.3f}" if bound else ""))
        else:
            print(f"  {format_size(size):>10} {'n/a':>14} "
                  f"{t['p50_us']:>14.1f} {'n/a':>8} {'n/a':>14} "
                  f"{t['p90_us']:>14.1f}" + (f" {'n/a':>12}" if bound else ""))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trainers", type=int, default=2,
                   help="local trainer processes per node (default 2)")
    p.add_argument("--nodes", type=int, default=1,
                   help="gradd node daemons; torch runs nodes*trainers ranks")
    p.add_argument("--sizes", default="4KiB,64KiB,1MiB,25MiB,128MiB",
                   help="comma-separated sizes (B, KiB, MiB, GiB, KB, MB)")
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--gradd-bench", default=str(REPO / "build/bench/gradd-bench"),
                   help="gradd-bench binary (default: build/bench/gradd-bench)")
    p.add_argument("--collective", action="store_true",
                   help="gradd-collective-bench (Client::Allreduce of arbitrary "
                        "data) vs plain dist.all_reduce(SUM), no div_; one node")
    p.add_argument("--collective-bench",
                   default=str(REPO / "build/bench/gradd-collective-bench"),
                   help="gradd-collective-bench binary (with --collective; "
                        "default: build/bench/gradd-collective-bench)")
    p.add_argument("--gradd", default="",
                   help="gradd daemon binary (default: the bench's)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--rounds", type=int, default=2,
                   help="alternating rounds; each side keeps its best p50 per size")
    args = p.parse_args()
    if args.rounds < 1:
        sys.exit("compare_torch: --rounds must be >= 1")
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    world = args.nodes * args.trainers

    if args.collective:
        if args.nodes != 1:
            sys.exit("compare_torch: --collective runs on one node "
                     "(gradd-collective-bench has no --nodes)")
        if not os.access(args.collective_bench, os.X_OK):
            sys.exit("compare_torch: no gradd-collective-bench at "
                     f"{args.collective_bench} (run scripts/setup, or pass "
                     "--collective-bench)")
    elif not os.access(args.gradd_bench, os.X_OK):
        sys.exit(f"compare_torch: no gradd-bench at {args.gradd_bench} "
                 "(run scripts/setup, or pass --gradd-bench)")

    gradd, torch_results, gradd_rc = {}, {}, 0
    for _ in range(args.rounds):
        rows, rc = run_gradd(args, sizes)
        gradd_rc = gradd_rc or rc
        keep_best(gradd, rows)
        keep_best(torch_results, run_torch(world, sizes, args.warmup, args.iters,
                                           divide=not args.collective))

    if args.collective:
        title = (f"# gradd Client::Allreduce ({args.trainers} trainer(s), one daemon) "
                 f"vs torch.distributed Gloo all_reduce(SUM) ({args.trainers} "
                 f"processes), float32, {args.warmup} warm-up + {args.iters} timed "
                 f"iterations, best p50 of {args.rounds} alternating round(s) per side")
    else:
        title = (f"# gradd ({args.nodes} node(s) x {args.trainers} trainer(s)) vs "
                 f"torch.distributed Gloo allreduce+div ({world} processes), "
                 f"float32, {args.warmup} warm-up + {args.iters} timed iterations, "
                 f"best p50 of {args.rounds} alternating round(s) per side")
    print_results(args, sizes, gradd, torch_results, title, bound=not args.collective)
    return 0 if gradd_rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
