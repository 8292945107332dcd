#!/usr/bin/python3
"""autotune_sweep: fixed bucket caps against `bucket_cap_mb="auto"` (the
daemon's autotune, issue 36 point 4) on the emulated network, same run.

Run as root (it builds scripts/netbench's cluster: network namespaces on a
bridge, every link shaped with tc to --rate):

    sudo PYTHONPATH=build/client/python bench/autotune_sweep.py \\
        [--gradd build/server/gradd] [--layout 2x2] [--rate 1gbit] \\
        [--caps 1,4,10,25,64] [--steps 8] [--rounds 2] [--json]

What it runs: bench/compare_ddp.py's model (--model: deep, 25 Linear
1024-1024 layers, 26.2 M float32 parameters, the default; or mlp,
1024-4096-4096-1024, whose few large tensors give the same buckets for
every cap; batch 16, one thread per trainer) with
gradd.torch across the emulated nodes, once per fixed cap and once with
"auto", in --rounds alternating rounds (the order rotates each round), all
jobs on the same daemons (one per node, started once). Fixed caps run
--warmup steps, then --steps timed; auto runs --auto-warmup steps first
(default: enough for the tuning to settle: 2 + caps x (1 + 3) + 1), so its
timed steps measure the cap it settled on, and the daemons' log says which
(`autotune settled on a ... cap`), printed beside it.

Prints per setting the slowest rank's steps/s, best and min-max over the
rounds, and auto / the best fixed setting. --no-netns runs the nodes on
loopback without shaping (no root needed; a smoke test, not the network).

Benchmarks are not tests: nothing here asserts on speed.
"""
import argparse
import importlib.machinery
import importlib.util
import json
import os
import pathlib
import re
import shutil
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import compare_ddp  # noqa: E402


def load_netbench():
    """scripts/netbench as a module (its Cluster; it has no .py suffix)."""
    loader = importlib.machinery.SourceFileLoader("netbench", str(REPO / "scripts/netbench"))
    spec = importlib.util.spec_from_loader("netbench", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def ddp_args(args, nodes, trainers, cluster, cores):
    """compare_ddp's options for its daemons and workers."""
    return argparse.Namespace(
        procs=trainers, nodes=nodes, steps=args.steps, warmup=args.warmup, batch=16,
        threads=1, bucket_cap_mb=25, momentum=0.0, timeout=args.timeout,
        node_exec=cluster.node_exec if cluster else "",
        master_addr=cluster.addresses[0] if cluster else "127.0.0.1",
        gloo_ifname="eth0" if cluster else "", comm_hook="", reduce_threads=cores,
        malloc="thp", gradd=args.gradd, socket="", model=args.model, partition_mb=0,
        daemon_config_extra="", scheduling="")


def settled(log_text, job):
    """(cap text, iteration) autotune settled on for `job`, from the log."""
    m = re.search(rf"job '{re.escape(job)}' autotune settled on a (\S+ MiB) bucket cap "
                  rf"after iteration (\d+)", log_text)
    return (m.group(1), int(m.group(2))) if m else (None, None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gradd", help="gradd binary (default: $GRADD_BINARY, build/server/gradd)")
    ap.add_argument("--layout", default="2x2", help="NODESxTRAINERS (default 2x2)")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--caps", default="1,4,10,25,64", help="fixed caps in MiB")
    ap.add_argument("--model", choices=sorted(compare_ddp.MODELS), default="deep",
                    help="compare_ddp's model; mlp's few large tensors give one plan for "
                         "every cap (auto settles at once), deep's 25 layers several")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--auto-warmup", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--no-netns", action="store_true",
                    help="loopback, unshaped (no root; a smoke test)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    caps = [float(c) for c in args.caps.split(",")]
    settings = [str(c) for c in caps] + ["auto"]
    if args.auto_warmup is None:
        args.auto_warmup = 2 + len(caps) * (1 + 3) + 1
    nodes, trainers = (int(v) for v in args.layout.lower().split("x"))
    netbench = load_netbench()
    rate = netbench.parse_rate(args.rate)
    cluster = None
    if not args.no_netns:
        if os.geteuid() != 0:
            raise SystemExit("run as root (network namespaces), or --no-netns")
        cluster = netbench.Cluster(nodes, rate).create()
    cores = netbench.node_cores(nodes)
    cargs = ddp_args(args, nodes, trainers, cluster, cores)
    tmp = tempfile.mkdtemp(prefix="gradd-autotune-sweep-")
    daemons, logs = [], []
    runs = {s: [] for s in settings}
    steps = {s: [] for s in settings}  # the slowest rank's timed steps (s)
    jobs = {s: [] for s in settings}
    load = os.getloadavg()[0]
    try:
        daemons, sockets, logs = compare_ddp.start_daemons(cargs, tmp)
        pythonpath = os.environ.get("PYTHONPATH") or os.path.join(compare_ddp.build_dir(),
                                                                 "client/python")
        for rnd in range(args.rounds):
            order = settings[rnd % len(settings):] + settings[:rnd % len(settings)]
            for s in order:
                job = f"sweep-{s.replace('.', '_')}-{rnd}"
                cargs.bucket_cap_mb = "auto" if s == "auto" else float(s)
                cargs.warmup = args.auto_warmup if s == "auto" else args.warmup
                env = {"GRADD_JOB": job, "PYTHONPATH": pythonpath}
                t0 = time.monotonic()
                steps_per_s, params, _, step_s, _ = compare_ddp.run_mode(
                    "gradd", cargs, env, sockets)
                runs[s].append(steps_per_s)
                steps[s].extend(step_s)
                jobs[s].append(job)
                print(f"# round {rnd} {s:>6}: {steps_per_s:.3f} steps/s "
                      f"({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
    finally:
        compare_ddp.stop_daemons(daemons, logs)
        log_text = ""
        for node in range(nodes):
            path = os.path.join(tmp, f"gradd{node}-default.log")
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    log_text += f.read()
        shutil.rmtree(tmp, ignore_errors=True)
        if cluster is not None:
            cluster.destroy()
    load_after = os.getloadavg()[0]

    best_fixed = max((max(runs[s]), s) for s in settings if s != "auto")
    rows = []
    for s in settings:
        r = runs[s]
        t = sorted(steps[s])
        row = {"setting": s, "steps_per_s": max(r), "min": min(r), "max": max(r), "runs": r,
               "step_ms_p50": 1e3 * t[len(t) // 2] if t else None,
               "step_ms_min": 1e3 * t[0] if t else None,
               "step_ms_max": 1e3 * t[-1] if t else None}
        if s == "auto":
            row["settled"] = [settled(log_text, j) for j in jobs[s]]
        rows.append(row)
    auto = max(runs["auto"])
    summary = {
        "model": args.model, "layout": args.layout, "rate_bps": rate, "netns": cluster is not None,
        "steps": args.steps, "warmup": args.warmup, "auto_warmup": args.auto_warmup,
        "rounds": args.rounds, "load_before": load, "load_after": load_after,
        "rows": rows, "best_fixed": best_fixed[1],
        "auto_over_best_fixed": auto / best_fixed[0],
    }
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"compare_ddp {compare_ddp.MODELS[args.model]} ({params / 1e6:.1f} M params), "
          f"{args.layout} at {args.rate}"
          f"{'' if cluster else ' (loopback, unshaped)'}, {args.steps} timed steps, "
          f"{args.rounds} rounds; load average {load:.2f} before, {load_after:.2f} after")
    print(f"{'cap':>8} {'steps/s':>9} {'min-max':>15} {'step ms p50 (min-max)':>24}  settled")
    for row in rows:
        note = ""
        if row["setting"] == "auto":
            note = ", ".join(f"{c} after it. {i}" if c else "not settled"
                             for c, i in row["settled"])
        step = (f"{row['step_ms_p50']:.0f} ({row['step_ms_min']:.0f}-{row['step_ms_max']:.0f})"
                if row["step_ms_p50"] is not None else "-")
        print(f"{row['setting']:>8} {row['steps_per_s']:>9.3f} "
              f"{row['min']:>7.3f}-{row['max']:<7.3f} {step:>24}  {note}")
    print(f"auto / best fixed ({best_fixed[1]} MiB): {summary['auto_over_best_fixed']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
