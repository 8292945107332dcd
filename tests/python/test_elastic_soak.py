"""Multi-node elastic soak (issue 23, "Training that survives failures"): one
job on 3 daemons on loopback (node-0 serves the rendezvous; OS-chosen
ports, each daemon's socket in its own temporary directory), min_nodes 2
and a rank restart grace, PER_NODE trainers per node (the C++ example
trainer, --mode train --min-nodes 2). At random moments one of:

  rank restart  a trainer (on any node) is SIGKILLed and started again
                after 0-2 s (within the grace);
  node loss     a whole node other than node-0 (its daemon and trainers,
                in a random order) is SIGKILLed; the job goes on with the
                other two; after 2-5 s the node (same node id) and its
                trainers are started again and admitted (arrival).

node-0 is never killed: the coordinator must survive (docs/operations.md,
"Limits"); only one node is down at a time (min_nodes 2 of 3), and each
event waits for the job to have recovered from the last one.

Recovery of an event: from the kill (of the node, for its arrival: from its
restart) until every trainer that should be running has synced the job's
state after it and applied a step after that sync ("SYNCED ... t_ns=T",
"STEP s t_ns=T" on CLOCK_MONOTONIC, --print-steps; every event aborts an
iteration and syncs on every live rank). The sync's live world size must
be the whole world, or the world less the lost node's ranks after a node
loss. The summary also lists the RSS of the daemons alive so far after each
event (a per-event leak shows as a steady climb).

At the end: every trainer exits 0 with the same step count, the same
parameters (checksum) and the full live world, with the global rank it
started with (a returning node gets its old ranks) and the job's epoch
equal to the number of re-formations the events make (one per rank
restart, node loss and arrival: no spurious one); the daemons that lived
through the whole run leak nothing (soak_util.Baseline):
  - in the run: read when every trainer has applied WARM_STEPS steps, before
    the first event, and again WARM_STEPS steps after the last event's
    recovery, with the same trainers attached: fds within RUN_FD_SLACK
    (a re-formation closes the old network's sockets on its own threads,
    a moment after the new one works), threads and RSS as soak_util says;
  - idle: read after a first, event-free job on the 3 nodes (pools and
    caches warm) and after the soak's job ended: fds and threads back to
    at most the baseline, RSS as soak_util says.

Duration, events and seed: GRADD_SOAK_SECONDS (default 40),
GRADD_SOAK_EVENTS (4), GRADD_SOAK_SEED (23), GRADD_SOAK_TRAINERS_PER_NODE
(2). `scripts/soak --multinode` runs 10 events over 5 minutes and prints the
summary (also printed here, seen with pytest -s). Each process's log and
each daemon's stays in pytest's tmp_path (printed on a failure).
"""
import bisect
import os
import random
import re
import statistics
import time

import pytest

from conftest import Nodes
from soak_util import Baseline, STEP, SYNCED, finals, proc_stats, read, spawn_trainer, trainer_or_skip

NODES = 3
MIN_NODES = 2
PARAMS = 200_000
STEP_SLEEP_MS = 20
GRACE_MS = 20_000
WARM_STEPS = 20
RUN_FD_SLACK = 0
RECOVERY_TIMEOUT_S = 90
FINAL_RANK = re.compile(r"rank (\d+)/(\d+): FINAL .* epoch=(\d+) ")


class Trainer:
    """One trainer process; reads its STEP and SYNCED lines as they come."""

    def __init__(self, job, node, local, tag):
        self.node, self.local = node, local
        self.rank = node * job.per_node + local
        self.path = os.path.join(job.log_dir, f"{job.name}-n{node}-l{local}-{tag}.log")
        env = {"GRADD_NUM_NODES": str(NODES), "GRADD_NODE_RANK": str(node),
               "GRADD_COORDINATOR": job.nodes.coordinator, "OMP_NUM_THREADS": "1"}
        self.proc = spawn_trainer(job.trainer, job.nodes.nodes[node].socket, job.name, local,
                                  job.per_node, job.steps, job.sleep_ms, GRACE_MS, PARAMS,
                                  self.path, env=env,
                                  extra=["--min-nodes", str(MIN_NODES), "--print-steps"])
        self.offset = 0
        self.partial = b""
        self.steps = []  # t_ns of each applied step
        self.syncs = []  # (t_ns, live world size) of each state sync

    def poll_steps(self):
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            text = line.decode(errors="replace")
            m = STEP.match(text)
            if m:
                self.steps.append(int(m.group(3)))
            m = SYNCED.match(text)
            if m:
                self.syncs.append((int(m.group(3)), int(m.group(2))))

    def recovered_after(self, t_ns):
        """(t_ns of the first step applied after the first state sync after
        t_ns, that sync's live world size); None while there is none: every
        event (rank restart, node loss, arrival) aborts an iteration and
        syncs the state on every live rank before the job goes on."""
        i = bisect.bisect_right(self.syncs, (t_ns, 1 << 30))
        if i == len(self.syncs):
            return None
        synced, live = self.syncs[i]
        j = bisect.bisect_right(self.steps, synced)
        return (self.steps[j], live) if j < len(self.steps) else None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def tail(self):
        return f"--- {os.path.basename(self.path)} (exit {self.proc.poll()}):\n{read(self.path)[-2500:]}"


class Job:
    def __init__(self, trainer, nodes, name, steps, sleep_ms, per_node, log_dir):
        self.trainer, self.nodes, self.name = trainer, nodes, name
        self.steps, self.sleep_ms, self.per_node, self.log_dir = steps, sleep_ms, per_node, log_dir
        self.starts = 0
        self.live = {}  # (node, local) -> Trainer
        self.dead = []
        for node in range(NODES):
            self.start_node(node)

    def start(self, node, local):
        self.starts += 1
        self.live[(node, local)] = Trainer(self, node, local, str(self.starts))

    def start_node(self, node):
        for local in range(self.per_node):
            self.start(node, local)

    def kill(self, key):
        t = self.live.pop(key)
        t.kill()
        self.dead.append(t)

    def check_running(self, what):
        for t in self.live.values():
            assert t.proc.poll() is None, f"{what}: rank {t.rank} exited:\n{t.tail()}\n{self.report()}"

    def report(self):
        return "\n".join(t.tail() for t in self.live.values())

    def wait_recovered(self, t_ns, what, live_world, timeout=RECOVERY_TIMEOUT_S):
        """Waits until every live trainer synced the state after t_ns and
        applied a step after that sync; checks the sync's live world size
        (live_world) and returns the time from t_ns to the last of those
        steps, in ms."""
        deadline = time.monotonic() + timeout
        while True:
            got = []
            for t in self.live.values():
                t.poll_steps()
                got.append(t.recovered_after(t_ns))
            if all(g is not None for g in got):
                lives = {t.rank: g[1] for t, g in zip(self.live.values(), got)}
                assert set(lives.values()) == {live_world}, (
                    f"{what}: live world size at the sync {lives}, expected {live_world}\n"
                    f"{self.report()}")
                return (max(g[0] for g in got) - t_ns) / 1e6
            self.check_running(what)
            assert time.monotonic() < deadline, (
                f"{what}: ranks {[t.rank for t, g in zip(self.live.values(), got) if g is None]} "
                f"did not sync and step within {timeout} s\n{self.report()}")
            time.sleep(0.1)

    def wait_steps(self, n, what, timeout=RECOVERY_TIMEOUT_S):
        """Waits until every live trainer applied n more steps."""
        deadline = time.monotonic() + timeout
        for t in self.live.values():
            t.poll_steps()
        want = {k: len(t.steps) + n for k, t in self.live.items()}
        while True:
            for t in self.live.values():
                t.poll_steps()
            if all(len(t.steps) >= want[k] for k, t in self.live.items()):
                return
            self.check_running(what)
            assert time.monotonic() < deadline, f"{what}: no {n} steps in {timeout} s\n{self.report()}"
            time.sleep(0.1)

    def finish(self, timeout):
        deadline = time.monotonic() + timeout
        for t in self.live.values():
            try:
                t.proc.wait(timeout=max(1, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - TimeoutExpired: reported below
                t.kill()
        return {t.rank: (t.proc.returncode, read(t.path)) for t in self.live.values()}


def _plan(rng, events, seconds, per_node):
    """The events: (at_s, kind, details), at most one node down at a time."""
    kinds = [rng.choice(("rank", "node")) for _ in range(events)]
    if events >= 2 and len(set(kinds)) == 1:
        kinds[rng.randrange(events)] = "node" if kinds[0] == "rank" else "rank"
    times = sorted(rng.uniform(0.05, 0.8) * seconds for _ in range(events))
    # The nodes lost take turns (from a random one): both the last node and
    # one in the middle of the membership are lost and come back.
    turn = rng.randrange(NODES - 1)
    plan = []
    for at, kind in zip(times, kinds):
        if kind == "rank":
            plan.append((at, kind, {"victim": (rng.randrange(NODES), rng.randrange(per_node)),
                                    "pause_s": rng.uniform(0.0, 2.0)}))
        else:
            turn += 1
            plan.append((at, kind, {"node": 1 + turn % (NODES - 1),
                                    "daemon_first": rng.random() < 0.5,
                                    "down_s": rng.uniform(2.0, 5.0)}))
    return plan


def _fmt_stats(s):
    return f"fds {s[0]}, threads {s[1]}, RSS {s[2] / 1024:.1f} MiB"


def test_elastic_soak_job_survives_rank_and_node_failures(gradd_binary, tmp_path):
    trainer = trainer_or_skip(pytest)
    seconds = float(os.environ.get("GRADD_SOAK_SECONDS", "40"))
    events = int(os.environ.get("GRADD_SOAK_EVENTS", "4"))
    seed = int(os.environ.get("GRADD_SOAK_SEED", "23"))
    per_node = int(os.environ.get("GRADD_SOAK_TRAINERS_PER_NODE", "2"))
    world = NODES * per_node
    rng = random.Random(seed)
    plan = _plan(rng, events, seconds, per_node)
    lines = []

    def say(line):  # as it happens (pytest -s), and all again at the end
        lines.append(line)
        print(line, flush=True)

    say(f"elastic soak: {NODES} nodes x {per_node} trainers, min_nodes {MIN_NODES}, "
        f"grace {GRACE_MS} ms, {seconds:g} s, {events} events, seed {seed}")
    failure = None
    nodes = Nodes(gradd_binary, NODES)
    job = None
    try:
        # An event-free job first: warms the daemons up for the idle
        # baseline, and gives the step time on this machine.
        warm = Job(trainer, nodes, "elastic-soak-warmup", 100, STEP_SLEEP_MS, per_node,
                   str(tmp_path))
        res = warm.finish(300)
        assert all(rc == 0 for rc, _ in res.values()), warm.report() + nodes.logs()
        sums = finals(out for _, out in res.values())
        assert len(set(sums)) == 1, sums
        t0 = warm.live[(0, 0)]
        t0.poll_steps()
        step_s = statistics.median(b - a for a, b in zip(t0.steps, t0.steps[1:])) / 1e9
        # Enough steps to run past the events (planned in the first 80 % of
        # the run; the recoveries add to the run, not to the steps) by 40 s:
        # WARM_STEPS after the last one and the leak readings (up to
        # soak_util.SETTLE_S) while it runs.
        steps = int((seconds + 40) / step_s)
        say(f"step {step_s * 1e3:.1f} ms (--step-sleep-ms {STEP_SLEEP_MS}): {steps} steps")
        time.sleep(1.0)  # the job's memory goes back (heap trimming)
        idle_base = {i: Baseline(nodes.nodes[i].proc.pid) for i in range(NODES)}

        job = Job(trainer, nodes, "elastic-soak", steps, STEP_SLEEP_MS, per_node, str(tmp_path))
        job.wait_steps(WARM_STEPS, "warm-up")
        run_base = {i: Baseline(nodes.nodes[i].proc.pid) for i in range(NODES)}
        survivors = set(range(NODES))  # daemons alive the whole run
        recovery = {"rank restart": [], "node loss": [], "node arrival": []}
        rss_by_event = {i: [run_base[i].rss_kb] for i in range(NODES)}
        start = time.monotonic()
        say(f"{'#':>3} {'at':>7}  {'event':<52} recovery")
        for n, (at, kind, ev) in enumerate(plan, 1):
            time.sleep(max(0.0, start + at - time.monotonic()))
            job.check_running(f"before event {n}")
            when = time.monotonic() - start
            if kind == "rank":
                node, local = ev["victim"]
                what = f"event {n} (rank restart of trainer {node * per_node + local} on node-{node})"
                t_kill = time.monotonic_ns()
                job.kill((node, local))
                time.sleep(ev["pause_s"])
                job.start(node, local)
                ms = job.wait_recovered(t_kill, what, world)
                desc = f"rank restart: trainer {node * per_node + local} on node-{node}, " \
                    f"back after {ev['pause_s']:.1f} s"
                say(f"{n:>3} {when:6.1f}s  {desc:<52} {ms:6.0f} ms")
                recovery["rank restart"].append(ms)
            else:
                node = ev["node"]
                order = "daemon first" if ev["daemon_first"] else "trainers first"
                what = f"event {n} (node loss of node-{node}, {order})"
                t_kill = time.monotonic_ns()
                if ev["daemon_first"]:
                    nodes.kill(node)
                for local in range(per_node):
                    job.kill((node, local))
                if not ev["daemon_first"]:
                    nodes.kill(node)
                survivors.discard(node)
                lost_ms = job.wait_recovered(t_kill, what, world - per_node)
                time.sleep(max(0.0, t_kill / 1e9 + ev["down_s"] - time.monotonic()))
                t_back = time.monotonic_ns()
                nodes.restart(node)
                job.start_node(node)
                back_ms = job.wait_recovered(t_back, f"{what}: arrival", world)
                desc = f"node loss: node-{node} ({order}), back after " \
                    f"{(t_back - t_kill) / 1e9:.1f} s"
                say(f"{n:>3} {when:6.1f}s  {desc:<52} {lost_ms:6.0f} ms loss, "
                    f"{back_ms:.0f} ms arrival")
                recovery["node loss"].append(lost_ms)
                recovery["node arrival"].append(back_ms)
            for i in sorted(survivors):
                assert nodes.nodes[i].proc.poll() is None, f"{what}: node-{i} died:\n{nodes.logs()}"
                rss_by_event[i].append(proc_stats(nodes.nodes[i].proc.pid)[2])
        job.wait_steps(WARM_STEPS, "after the last event")
        say("recovery, min / median / max: " + "; ".join(
            f"{k} {min(v):.0f} / {statistics.median(v):.0f} / {max(v):.0f} ms ({len(v)})"
            for k, v in recovery.items() if v))
        say(f"leaks, daemons alive the whole run: "
            f"{', '.join(f'node-{i}' for i in sorted(survivors))}")
        for i in sorted(survivors):
            say(f"  node-{i} RSS (MiB) at the baseline, after each event: "
                + " ".join(f"{kb / 1024:.1f}" for kb in rss_by_event[i]))
        leaks = []
        for i in sorted(survivors):
            assert nodes.nodes[i].proc.poll() is None, f"node-{i} died:\n{nodes.logs()}"
            problems, now = run_base[i].leaks(fd_slack=RUN_FD_SLACK)
            b = run_base[i]
            say(f"  node-{i} running: {_fmt_stats((b.fds, b.threads, b.rss_kb))} -> "
                f"{_fmt_stats(now)}" + (f"  LEAK: {problems}" if problems else ""))
            leaks += [f"node-{i} (in the run): {p}" for p in problems]
        job.check_running("after the leak readings in the run (raise the steps)")

        res = job.finish(seconds + 600)
        outs = {r: out for r, (_, out) in res.items()}
        report = job.report() + "\n" + nodes.logs()
        bad = {r: rc for r, (rc, _) in res.items() if rc != 0}
        assert not bad, f"trainers exited non-zero {bad}:\n{report}"
        fin = dict(zip(outs, finals(outs.values())))
        assert sorted(fin) == list(range(world)), fin
        if len(set(fin.values())) == 1:
            live, s, c = fin[0]
            say(f"job: all {world} trainers exit 0: {s} steps, live world {live}, "
                f"parameters equal (checksum {c})")
        else:
            say("job: " + ", ".join(f"rank {r}: {s} steps, live {live}, checksum {c}"
                                    for r, (live, s, c) in sorted(fin.items())))
        assert len({(s, c) for _, s, c in fin.values()}) == 1, f"final parameters differ: {fin}"
        assert all(s == steps for _, s, _ in fin.values()), fin
        assert all(live == world for live, _, _ in fin.values()), f"live world at the end: {fin}"
        for i in range(NODES):
            assert nodes.nodes[i].proc.poll() is None, f"node-{i} died:\n{nodes.logs()}"
        # Global ranks never change (a returning node gets its old ones:
        # docs/operations.md), and each event is one re-formation: the
        # job's epoch at the end is their count.
        wrong = []
        want_epoch = len(recovery["rank restart"]) + 2 * len(recovery["node loss"])
        for r, (_, out) in sorted(res.items()):
            m = FINAL_RANK.search(out)
            got_rank, got_world, got_epoch = int(m.group(1)), int(m.group(2)), int(m.group(3))
            if got_rank != r or got_world != world:
                wrong.append(f"trainer {r} (node-{r // per_node} local rank {r % per_node}) "
                             f"is global rank {got_rank} of {got_world}")
            if got_epoch != want_epoch:
                wrong.append(f"trainer {r}: epoch {got_epoch} at the end, {want_epoch} "
                             f"re-formations expected (one per rank restart, node loss, arrival)")
        for w in wrong:
            say(f"  WRONG: {w}")

        time.sleep(1.0)
        for i in sorted(survivors):
            problems, now = idle_base[i].leaks()
            b = idle_base[i]
            say(f"  node-{i} idle:    {_fmt_stats((b.fds, b.threads, b.rss_kb))} -> "
                f"{_fmt_stats(now)}" + (f"  LEAK: {problems}" if problems else ""))
            leaks += [f"node-{i} (idle): {p}" for p in problems]
        assert not leaks and not wrong, f"leaks: {leaks}; wrong: {wrong}"
    except BaseException as e:
        failure = e
        raise
    finally:
        if job is not None:
            for t in list(job.live.values()):
                t.kill()
        saved = nodes.save_logs(str(tmp_path))
        say(("FAILED: " + str(failure).split("\n")[0]) if failure else "PASSED")
        say(f"logs: {tmp_path} ({len(saved)} daemon logs)")
        print("\n--- summary\n" + "\n".join(lines))
        nodes.stop()
