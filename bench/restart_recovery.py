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

--multinode adds, on daemons on loopback (node-0 serves the rendezvous; one
trainer of --mib MiB per node, each node's own daemon):

  node drop      3 nodes, min_nodes 2: SIGKILLs node 2's daemon and trainer;
                 recovery = the kill -> rank 0's next applied step (the
                 survivors notice the broken network, wait for node 2 until
                 it has been silent for reformation_silence_ms (1 s; at most
                 reformation_settle_ms), re-form on 2 nodes, abort and retry the
                 step after the state sync). The node is started again between
                 rounds (not timed).
  2-node rank restart
                 2 nodes, grace set: SIGKILLs node 1's trainer and starts it
                 again at once; recovery as for "rank restart".
  full restart (3 nodes)
                 every trainer killed and a new job started on the 3 nodes.

These need the daemon side of node loss and arrival (min_nodes).

  /usr/bin/python3 bench/restart_recovery.py --multinode [--reformation-settle-ms 1000]
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
    def __init__(self, args, socket, job, rank, grace_ms, steps, local_world=None, env=None,
                 extra=()):
        self.rank = rank
        self.steps = []  # (step, t_ns)
        self.lines = []
        self.cond = threading.Condition()
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [
                args.trainer, "--socket", socket, "--job", job,
                "--local-rank", str(rank if local_world is None else 0),
                "--local-world-size", str(args.trainers if local_world is None else local_world),
                "--mode", "train", "--iterations", str(steps),
                "--params", str(int(args.mib * (1 << 20) / 4)),
                "--rank-restart-grace-ms", str(grace_ms), "--print-steps", *extra,
            ],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            env=full_env,
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


class Cluster:
    """N daemons on loopback (node-0: the rendezvous coordinator), each
    node's daemon killable and restartable with the same node id."""

    def __init__(self, args, tmp, n):
        self.args, self.tmp = args, tmp
        self.config = os.path.join(tmp, "gradd.yaml")
        with open(self.config, "w") as f:
            f.write("rendezvous:\n  formation_timeout_ms: 60000\n  collective_timeout_ms: 30000\n"
                    f"  reformation_settle_ms: {args.reformation_settle_ms}\n")
        self.token = os.path.join(tmp, "node-token")
        fd = os.open(self.token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(24).hex() + "\n")
        self.procs, self.sockets, self.logs = [None] * n, [None] * n, []
        port_file = os.path.join(tmp, "coordinator.port")
        self.coordinator = None
        self.start(0, ["--rendezvous-listen", "127.0.0.1:0", "--rendezvous-port-file", port_file])
        deadline = time.monotonic() + 30
        while self.coordinator is None:
            try:
                with open(port_file) as f:
                    port = int(f.read().strip() or 0)
                if port > 0:
                    self.coordinator = f"127.0.0.1:{port}"
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                sys.exit("the coordinator wrote no port")
            time.sleep(0.02)
        for i in range(1, n):
            self.start(i)

    def start(self, i, extra=None):
        if extra is None:
            extra = ["--coordinator", self.coordinator]
        d = os.path.join(self.tmp, f"node-{i}")
        os.makedirs(d, exist_ok=True)
        self.sockets[i] = os.path.join(d, "gradd.sock")
        for stale in (self.sockets[i], self.sockets[i] + ".session"):
            if os.path.exists(stale):
                os.unlink(stale)
        log = open(os.path.join(d, "gradd.log"), "ab")
        self.logs.append(log)
        self.procs[i] = subprocess.Popen(
            [self.args.gradd, "--socket", self.sockets[i], "--node-id", f"node-{i}",
             "--config", self.config, "--rendezvous-token-file", self.token, *extra],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while not os.path.exists(self.sockets[i] + ".session"):
            if self.procs[i].poll() is not None or time.monotonic() > deadline:
                sys.exit(f"gradd node-{i} did not start")
            time.sleep(0.02)

    def kill(self, i):
        self.procs[i].kill()
        self.procs[i].wait()

    def trainer(self, job, node, grace_ms, min_nodes=0):
        n = len(self.procs)
        env = {"GRADD_NUM_NODES": str(n), "GRADD_NODE_RANK": str(node),
               "GRADD_COORDINATOR": self.coordinator}
        extra = ["--min-nodes", str(min_nodes)] if min_nodes else []
        return Trainer(self.args, self.sockets[node], job, node, grace_ms, 1_000_000,
                       local_world=1, env=env, extra=extra)

    def stop(self):
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
        for log in self.logs:
            log.close()


def node_drop_round(args, cluster, n):
    ts = [cluster.trainer(f"recovery-drop-{n}", i, 0, min_nodes=2) for i in range(3)]
    try:
        ts[0].wait_steps(args.warmup, 300)
        base = step_ms(ts[0])
        t_kill = time.monotonic_ns()
        cluster.kill(2)
        ts[2].kill()
        _, t_step = ts[0].wait_step_after(t_kill, 120)
        return (t_step - t_kill) / 1e6, base
    finally:
        for t in ts:
            t.kill()
        if cluster.procs[2].poll() is not None:
            cluster.start(2)


def two_node_restart_round(args, cluster, n):
    job = f"recovery-2n-restart-{n}"
    ts = [cluster.trainer(job, i, 60000) for i in range(2)]
    try:
        ts[0].wait_steps(args.warmup, 300)
        base = step_ms(ts[0])
        t_kill = time.monotonic_ns()
        ts[1].kill()
        ts[1] = cluster.trainer(job, 1, 60000)
        _, t_step = ts[0].wait_step_after(t_kill, 120)
        return (t_step - t_kill) / 1e6, base
    finally:
        for t in ts:
            t.kill()


def multinode_full_restart_round(args, cluster, n, nodes):
    ts = [cluster.trainer(f"recovery-{nodes}n-full-{n}-a", i, 0) for i in range(nodes)]
    try:
        ts[0].wait_steps(args.warmup, 300)
        base = step_ms(ts[0])
        t_kill = time.monotonic_ns()
        for t in ts:
            t.kill()
        ts = [cluster.trainer(f"recovery-{nodes}n-full-{n}-b", i, 0) for i in range(nodes)]
        _, t_step = ts[0].wait_step_after(t_kill, 120)
        return (t_step - t_kill) / 1e6, base
    finally:
        for t in ts:
            t.kill()


def run_multinode(args):
    """Node drop (3 -> 2) and 2-node rank restart, each next to a full
    restart on the same nodes."""
    tmp = tempfile.mkdtemp(prefix="gradd-recovery-mn-")
    results = {"node_drop": [], "full_restart_3n": [], "rank_restart_2n": []}
    bases = []
    try:
        os.makedirs(os.path.join(tmp, "three"))
        three = Cluster(args, os.path.join(tmp, "three"), 3)
        try:
            for n in range(args.rounds):
                ms, base = node_drop_round(args, three, n)
                results["node_drop"].append(ms)
                bases.append(base)
                ms, base = multinode_full_restart_round(args, three, n, 3)
                results["full_restart_3n"].append(ms)
        finally:
            three.stop()
        os.makedirs(os.path.join(tmp, "two"))
        two = Cluster(args, os.path.join(tmp, "two"), 2)
        try:
            for n in range(args.rounds):
                ms, base = two_node_restart_round(args, two, n)
                results["rank_restart_2n"].append(ms)
        finally:
            two.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    summary = {
        k: {"min_ms": min(v), "median_ms": statistics.median(v), "max_ms": max(v), "rounds": v}
        for k, v in results.items()
    }
    summary["step_ms"] = statistics.median(bases)
    summary["mib"] = args.mib
    summary["reformation_settle_ms"] = args.reformation_settle_ms
    if args.format == "json":
        print(json.dumps(summary))
        return
    print(f"multi-node on loopback: one trainer per node, {args.mib:g} MiB of parameters, "
          f"{args.rounds} rounds, reformation_settle_ms {args.reformation_settle_ms}; ordinary step "
          f"(3 nodes) {summary['step_ms']:.1f} ms")
    print(f"{'recovery (kill -> next applied step)':40s} {'min':>9s} {'median':>9s} {'max':>9s}")
    for k, label in (("node_drop", "node drop 3 -> 2 (min_nodes 2)"),
                     ("full_restart_3n", "full restart, 3 nodes (no ckpt load)"),
                     ("rank_restart_2n", "rank restart, 2 nodes (grace)")):
        s = summary[k]
        print(f"{label:40s} {s['min_ms']:8.1f}ms {s['median_ms']:8.1f}ms {s['max_ms']:8.1f}ms")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(os.path.dirname(__file__), "..", "build"))
    ap.add_argument("--trainers", type=int, default=2)
    ap.add_argument("--mib", type=float, default=25)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=20, help="steps before the kill")
    ap.add_argument("--format", default="text", choices=["text", "json"])
    ap.add_argument("--multinode", action="store_true",
                    help="node drop (3 daemons -> 2) and rank restart on 2 daemons instead")
    ap.add_argument("--reformation-settle-ms", type=int, default=1000,
                    help="--multinode: the daemons' rendezvous.reformation_settle_ms")
    args = ap.parse_args()
    if args.trainers < 2:
        ap.error("--trainers must be at least 2 (rank 1 is the one killed)")
    args.gradd = os.path.join(args.build_dir, "server", "gradd")
    args.trainer = os.path.join(args.build_dir, "examples", "gradd_example_trainer")
    for p in (args.gradd, args.trainer):
        if not os.access(p, os.X_OK):
            sys.exit(f"{p} is missing: build first (scripts/setup)")
    if args.multinode:
        run_multinode(args)
        return
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
