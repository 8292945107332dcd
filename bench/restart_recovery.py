#!/usr/bin/env python3
"""Recovery time after a trainer's death (issue 23), against a full restart.

Starts a real gradd daemon and L trainers of one job (the C++ example
trainer's restart-safe training mode, examples/cpp/trainer.cc --mode train,
about --mib MiB of float32 parameters), then, per round:

  rank restart   SIGKILLs local rank 1 in the middle of the run and starts
                 it again at once with the same job id and rank
                 (rank_restart_grace_ms set); recovery = the kill -> the
                 survivors' next applied step (the iteration the rank died
                 in is aborted and retried, the rejoined rank receives the
                 parameters and the step counter from a survivor first).
  full restart   what the same failure costs without it: every trainer is
                 killed and the job started again from scratch (new
                 processes, attach, plan, shared memory); recovery = the
                 kill -> the new job's first applied step. Loading a
                 checkpoint and redoing the steps since it come on top and
                 are not counted.

Both sides run in the same invocation, alternating rounds; the figures are
min / median / max over the rounds, in milliseconds, with the job's
ordinary step time beside them. Times are CLOCK_MONOTONIC (the trainers'
"STEP s t_ns=..." lines and this script's kill time).

  /usr/bin/python3 bench/restart_recovery.py [--build-dir build]
      [--trainers 2] [--mib 25] [--rounds 5] [--format=text|json]

Single node only: rank restart across daemons and node loss are not
implemented yet (issue 23 points 1 multi-node and 3).
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

STEP = re.compile(r"rank (\d+): STEP (\d+) t_ns=(\d+)")


class Trainer:
    def __init__(self, args, socket, job, rank, grace_ms, steps):
        self.rank = rank
        self.steps = []  # (step, t_ns)
        self.lines = []
        self.cond = threading.Condition()
        self.proc = subprocess.Popen(
            [
                args.trainer, "--socket", socket, "--job", job,
                "--local-rank", str(rank), "--local-world-size", str(args.trainers),
                "--mode", "train", "--iterations", str(steps),
                "--params", str(int(args.mib * (1 << 20) / 4)),
                "--rank-restart-grace-ms", str(grace_ms), "--print-steps",
            ],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace")
            m = STEP.match(line)
            with self.cond:
                if m:
                    self.steps.append((int(m.group(2)), int(m.group(3))))
                else:
                    self.lines.append(line)
                self.cond.notify_all()

    def wait_step_after(self, t_ns, timeout):
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for s, t in self.steps:
                    if t > t_ns:
                        return s, t
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise RuntimeError(
                        f"rank {self.rank}: no step after the kill within {timeout} s:\n"
                        + "".join(self.lines[-20:])
                    )
                self.cond.wait(min(left, 0.5))

    def wait_steps(self, n, timeout):
        deadline = time.monotonic() + timeout
        with self.cond:
            while len(self.steps) < n:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise RuntimeError(f"rank {self.rank}: {len(self.steps)} steps:\n" + "".join(self.lines[-20:]))
                self.cond.wait(min(left, 0.5))

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def step_ms(trainer):
    ts = [t for _, t in trainer.steps[-20:]]
    if len(ts) < 2:
        return float("nan")
    return (ts[-1] - ts[0]) / (len(ts) - 1) / 1e6


def rank_restart_round(args, socket, n):
    job = f"recovery-restart-{n}"
    ts = [Trainer(args, socket, job, r, 60000, 1_000_000) for r in range(args.trainers)]
    try:
        ts[0].wait_steps(args.warmup, 300)
        base = step_ms(ts[0])
        victim = 1
        t_kill = time.monotonic_ns()
        ts[victim].kill()
        ts[victim] = Trainer(args, socket, job, victim, 60000, 1_000_000)
        _, t_step = ts[0].wait_step_after(t_kill, 120)
        return (t_step - t_kill) / 1e6, base
    finally:
        for t in ts:
            t.kill()


def full_restart_round(args, socket, n):
    ts = [Trainer(args, socket, f"recovery-full-{n}-a", r, 0, 1_000_000) for r in range(args.trainers)]
    try:
        ts[0].wait_steps(args.warmup, 300)
        base = step_ms(ts[0])
        t_kill = time.monotonic_ns()
        for t in ts:
            t.kill()
        ts = [Trainer(args, socket, f"recovery-full-{n}-b", r, 0, 1_000_000) for r in range(args.trainers)]
        _, t_step = ts[0].wait_step_after(t_kill, 120)
        return (t_step - t_kill) / 1e6, base
    finally:
        for t in ts:
            t.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(os.path.dirname(__file__), "..", "build"))
    ap.add_argument("--trainers", type=int, default=2)
    ap.add_argument("--mib", type=float, default=25)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=20, help="steps before the kill")
    ap.add_argument("--format", default="text", choices=["text", "json"])
    args = ap.parse_args()
    if args.trainers < 2:
        ap.error("--trainers must be at least 2 (rank 1 is the one killed)")
    args.gradd = os.path.join(args.build_dir, "server", "gradd")
    args.trainer = os.path.join(args.build_dir, "examples", "gradd_example_trainer")
    for p in (args.gradd, args.trainer):
        if not os.access(p, os.X_OK):
            sys.exit(f"{p} is missing: build first (scripts/setup)")
    tmp = tempfile.mkdtemp(prefix="gradd-recovery-")
    socket = os.path.join(tmp, "gradd.sock")
    log = open(os.path.join(tmp, "gradd.log"), "wb")
    daemon = subprocess.Popen([args.gradd, "--socket", socket], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(socket + ".session"):
            if daemon.poll() is not None or time.monotonic() > deadline:
                sys.exit("gradd did not start")
            time.sleep(0.02)
        results = {"rank_restart": [], "full_restart": []}
        bases = []
        for n in range(args.rounds):
            ms, base = rank_restart_round(args, socket, n)
            results["rank_restart"].append(ms)
            bases.append(base)
            ms, base = full_restart_round(args, socket, n)
            results["full_restart"].append(ms)
            bases.append(base)
        summary = {
            k: {"min_ms": min(v), "median_ms": statistics.median(v), "max_ms": max(v), "rounds": v}
            for k, v in results.items()
        }
        summary["step_ms"] = statistics.median(bases)
        summary["trainers"] = args.trainers
        summary["mib"] = args.mib
        if args.format == "json":
            print(json.dumps(summary))
        else:
            print(f"{args.trainers} trainers, {args.mib:g} MiB of parameters, one daemon, "
                  f"{args.rounds} rounds; ordinary step {summary['step_ms']:.1f} ms")
            print(f"{'recovery (kill -> next applied step)':40s} {'min':>9s} {'median':>9s} {'max':>9s}")
            for k, label in (("rank_restart", "rank restart (grace)"),
                             ("full_restart", "full restart (no checkpoint load)")):
                s = summary[k]
                print(f"{label:40s} {s['min_ms']:8.1f}ms {s['median_ms']:8.1f}ms {s['max_ms']:8.1f}ms")
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=10)
        except subprocess.TimeoutExpired:
            daemon.kill()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
