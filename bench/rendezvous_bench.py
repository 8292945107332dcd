#!/usr/bin/env python3
"""The rendezvous on the built-in store against the rendezvous on etcd
(issue 34), side by side in one run, 3 nodes.

Both backends run on this machine at once, each as 3 real gradd daemons on
loopback (tests/python/conftest.py's Nodes), one gradd.torch trainer per
node (tests/python's elastic_worker.py and restart_worker.py, unchanged,
with a few hundred parameters), node i holding global rank i:

  builtin  node-0's daemon serves the rendezvous store from its memory;
           liveness: beats every 200 ms, a node silent for
           rendezvous.reformation_silence_ms is lost; a closer decides an epoch.
  etcd     a real etcd (Debian's etcd-server, tests/python/etcd_cluster.py)
           on loopback over mutual TLS; no daemon is special; liveness:
           each daemon's etcd lease (rendezvous.etcd.lease_ttl_ms); an
           epoch is decided by a compare-and-swap transaction.

The daemon and the Python client are copied out of the build tree first
and run from the copy, so a rebuild there during the run changes nothing.
The trainers stamp CLOCK_MONOTONIC (the bench's own clock) on stdout right
before gradd.torch's attach call, right after it returns (the daemon
answers an attach once the job has formed across its nodes: rendezvous,
Gloo context, plan) and after every applied optimizer step.

The rounds alternate between the backends (builtin, etcd, builtin, ...),
so a burst of load from elsewhere hits both alike. After every round the
bench waits until no daemon holds a job and the rendezvous calls are back
at the no-job rate (it says so on stderr when that takes over
--quiet-warn-s), so no round's leftovers land in the next. Per round and
backend:

  formation      3 trainers of a fresh elastic job (min_nodes 2) start
                 together. "last attach -> formed on all nodes": the last
                 trainer's return from attach - the last trainer's call
                 (from the moment every node has asked to the moment every
                 node holds the formed job; the trainers' Python start-up
                 is not in it). "-> first step on all": the last trainer's
                 first applied step - the same last call (adds rank 0's
                 state broadcast and the first allreduce).
  idle           that job's trainers stop before their 3rd step
                 (GRADD_TEST_PAUSE_AT_STEP) and stay there: an elastic job
                 formed on 3 nodes with nothing to do, watched --idle-s.
  job end        its 3 trainers SIGKILLed; calls counted until the daemons
                 are quiet again (as after every round).
  node loss      a fresh elastic job (min_nodes 2) steps (--step-sleep-ms
                 per step); node-2's trainer stops before step K (--warmup;
                 GRADD_TEST_PAUSE_AT_STEP, as test_elastic_nodes.py does)
                 and node-2's daemon and trainer are SIGKILLed there (the
                 daemon first). The survivors are then inside step K's
                 allreduce, which cannot finish without node-2, so step K
                 is never one already in flight: recovery = the kill ->
                 step K applied on both survivors (the later of the two):
                 the loss noticed, the 2 nodes re-formed, the state synced,
                 step K retried. Then --tail-steps more steps and a clean
                 end. node-2 is the node lost on both backends (on the
                 built-in store node-0's loss ends every job; only etcd
                 survives that, tests/python/test_etcd_faults.py); its
                 daemon is started again after the round (not timed).
  rank restart   a fresh job with rank_restart_grace_ms (--grace-ms;
                 restart_worker.py, no min_nodes) steps; after --warmup
                 steps node-1's trainer (not its daemon) is SIGKILLed and
                 started again at once with the same job id and rank. The
                 survivors cannot step without rank 1 (the grace holds
                 them), so the step measured is their first one applied
                 after the new trainer's attach call (the later of the
                 two survivors). "kill -> next step": includes the new
                 trainer's Python and torch start-up; "new attach -> next
                 step": what the daemons serve (the job's nodes re-formed
                 for the rejoin, the state synced to the new trainer, the
                 aborted step retried). Then a clean end.

Rendezvous calls are counted where the store is:
  builtin  node-0's own count of requests to its rendezvous service,
           gradd_rendezvous_requests_total (by method), from its /metrics;
  etcd     etcd's /metrics on its client URL (over mutual TLS, the test
           client certificate): grpc_server_started_total by grpc_method,
           every RPC started, unary or stream (gradd opens one
           LeaseKeepAlive stream per keep-alive); the daemons' own
           gradd_etcd_requests_total (3 nodes) is printed beside it.
"Per formation" (trainers started -> all paused after 2 steps, which
call nothing) and "per job end" leave out the lease keep-alives (a
daemon makes them whether it has jobs or not, 3 per TTL) and anything
else the daemons do with no job at all (measured first, over --idle-s,
and shown as its own row). The idle job's row is every call per second
while it idles, keep-alives included.

Figures are min / median / max over --rounds rounds. Every process
(daemons, trainers, etcd) and every temporary directory is removed at the
end, on error and on Ctrl-C / SIGTERM / SIGHUP. Exits 1 if a round failed
(its line says why; the daemons' logs go to stderr).

  /usr/bin/python3 bench/rendezvous_bench.py [--rounds 5] [--quick]
      [--idle-s 10] [--lease-ttl-ms 2000] [--reformation-silence-ms 1000]
      [--reformation-settle-ms 10000] [--step-sleep-ms 20] [--grace-ms 30000]
      [--warmup 10] [--tail-steps 20] [--etcd-members 1]
      [--backends builtin,etcd] [--only formation,node-loss,rank-restart]
      [--format text|json] [--quiet] [--build-dir build]
"""
import argparse
import contextlib
import importlib
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from rendezvous_report import NODES, fmt_methods, print_table, summarize

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests", "python")

EVENT = re.compile(r"^BENCH (ATTACH|FORMED|STEP) t_ns=(\d+)$")


# ------------------------------------------------------------------ worker
def worker_main(kind, argv):
    """A trainer: tests/python/<kind>_worker.py as it is, with three stamps
    on stdout (CLOCK_MONOTONIC, as time.monotonic_ns() here in the
    bench): before and after the attach call gradd.torch makes, and after
    every applied optimizer step (both workers call SGD.step exactly once
    per applied step, never for an aborted one)."""
    sys.path.insert(0, TESTS)
    import torch
    import gradd._C

    def say(what):
        sys.stdout.write(f"BENCH {what} t_ns={time.monotonic_ns()}\n")
        sys.stdout.flush()

    attach = gradd._C.attach

    def timed_attach(*a, **kw):
        say("ATTACH")
        client = attach(*a, **kw)
        say("FORMED")
        return client

    gradd._C.attach = timed_attach  # gradd.torch calls it as _C.attach
    step = torch.optim.SGD.step

    def timed_step(self, *a, **kw):
        out = step(self, *a, **kw)
        say("STEP")
        return out

    torch.optim.SGD.step = timed_step
    module = importlib.import_module(f"{kind}_worker")
    sys.argv = [module.__file__, *argv]
    module.main()


# ------------------------------------------------------------------ bench
class RoundFailed(RuntimeError):
    pass


class BackendLost(RoundFailed):
    """The backend cannot go on (its store's daemon died): no more rounds."""


class Interrupted(BaseException):
    """SIGINT, SIGTERM or SIGHUP: the run stops and cleans up."""


class Signals:
    """Turns SIGINT/SIGTERM/SIGHUP into Interrupted, except inside
    shield(): there (starting a daemon, an etcd, a trainer) the signal
    waits until the new process is registered for the cleanup, so that
    nothing started is ever out of its reach."""

    def __init__(self):
        self.depth, self.pending = 0, None
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._handler)

    def _handler(self, signum, frame):
        if self.depth:
            self.pending = signum
            return
        raise Interrupted(signal.Signals(signum).name)

    @contextlib.contextmanager
    def shield(self):
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if not self.depth and self.pending is not None:
                signum, self.pending = self.pending, None
                raise Interrupted(signal.Signals(signum).name)


class Trainer:
    """One trainer process of this bench (worker_main above), on node
    `rank` of `nodes`; its stamps are read from its stdout."""

    def __init__(self, args, nodes, job, rank, kind, worker_args, env):
        self.rank = rank
        self.attach, self.formed, self.steps = [], [], []
        self.lines = []
        self.cond = threading.Condition()
        from conftest import trainer_env
        full = trainer_env(nodes, rank, job)
        full["PYTHONPATH"] = os.pathsep.join(
            p for p in (args.python_dir, os.environ.get("PYTHONPATH")) if p)
        full.update(env)
        with args.signals.shield():
            self.proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker", kind, *worker_args],
                env=full, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True)
            args.trainers.append(self)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            m = EVENT.match(line)
            with self.cond:
                if m:
                    {"ATTACH": self.attach, "FORMED": self.formed,
                     "STEP": self.steps}[m.group(1)].append(int(m.group(2)))
                else:
                    self.lines.append(line)
                    del self.lines[:-40]
                self.cond.notify_all()
        self.proc.stdout.close()
        with self.cond:
            self.cond.notify_all()

    def tail(self):
        with self.cond:
            return "\n".join(self.lines[-25:])

    def wait(self, what, check, timeout):
        """Waits until check() (called under the lock) returns a value."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                got = check()
                if got is not None:
                    return got
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self.reader.is_alive()):
                    why = (f"exited with {self.proc.returncode}"
                           if self.proc.poll() is not None else f"not within {timeout:.0f} s")
                    raise RoundFailed(f"rank {self.rank}: {what}: {why}; its output:\n"
                                      f"{self.tail()}")
                self.cond.wait(min(left, 0.5))

    def wait_steps(self, n, timeout):
        return self.wait(f"{n} steps", lambda: self.steps[n - 1] if len(self.steps) >= n
                         else None, timeout)

    def step_after(self, t_ns, timeout):
        return self.wait("a step after the kill",
                         lambda: next((t for t in self.steps if t > t_ns), None), timeout)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def parse_counters(text, family, label):
    """{label value: summed value} of every series of `family` in a
    Prometheus text page."""
    out = {}
    pattern = re.compile(rf'^{family}\{{(.*)\}} (\S+)$')
    for line in text.splitlines():
        m = pattern.match(line)
        if not m:
            continue
        lm = re.search(rf'(?:^|,){label}="([^"]*)"', m.group(1))
        if lm:
            out[lm.group(1)] = out.get(lm.group(1), 0.0) + float(m.group(2))
    return out


def diff(after, before):
    return {k: after.get(k, 0.0) - before.get(k, 0.0)
            for k in set(after) | set(before) if after.get(k, 0.0) != before.get(k, 0.0)}


class Backend:
    """One backend's 3 daemons (and its etcd), and where its rendezvous
    calls are counted."""

    def __init__(self, args, name):
        from conftest import Nodes

        self.args, self.name = args, name
        self.etcd = None
        if name == "etcd":
            from etcd_cluster import EtcdCluster

            with args.signals.shield():  # EtcdCluster stops itself on failure
                self.etcd = EtcdCluster(members=args.etcd_members)
                args.etcd_clusters.append(self.etcd)
            # etcd's /metrics is on its client URL, behind the same mTLS.
            self._tls = ssl.create_default_context(cafile=self.etcd.ca_file)
            self._tls.load_cert_chain(self.etcd.cert_file, self.etcd.key_file)
        with args.signals.shield():  # so does Nodes
            self.nodes = Nodes(args.gradd, NODES, backend=name, etcd=self.etcd,
                               reformation_settle_ms=args.reformation_settle_ms,
                               reformation_silence_ms=args.reformation_silence_ms,
                               lease_ttl_ms=args.lease_ttl_ms, formation_timeout_ms=60000)
            args.node_sets.append(self.nodes)

    def _metrics(self, i):
        # A daemon just started again (node-2, after a node loss) writes its
        # metrics port a moment after its socket: give it a few seconds.
        deadline = time.monotonic() + 10
        text = self.nodes.metrics(i)
        while not text and time.monotonic() < deadline:
            time.sleep(0.1)
            text = self.nodes.metrics(i)
        if not text:
            raise RoundFailed(f"{self.name}: node-{i}'s /metrics did not answer:\n"
                              f"{self.nodes.nodes[i].log()[-3000:]}")
        return text

    def calls(self):
        """Rendezvous calls so far by method, where the store counts them."""
        if self.etcd is None:
            return parse_counters(self._metrics(0), "gradd_rendezvous_requests_total", "method")
        total = {}
        for i, endpoint in enumerate(self.etcd.endpoints):
            if not self.etcd.alive(i):
                continue
            try:
                with urllib.request.urlopen(f"https://{endpoint}/metrics", timeout=5,
                                            context=self._tls) as r:
                    page = r.read().decode()
            except OSError as e:
                raise RoundFailed(f"etcd member {i}'s /metrics ({endpoint}): {e}") from None
            for line in page.splitlines():
                m = re.match(r'^grpc_server_started_total\{(.*)\} (\S+)$', line)
                if m and 'grpc_service="etcdserverpb.' in m.group(1):
                    method = re.search(r'grpc_method="([^"]*)"', m.group(1)).group(1)
                    total[method] = total.get(method, 0.0) + float(m.group(2))
        return total

    def daemon_calls(self):
        """etcd: the daemons' own count of their etcd calls (all nodes)."""
        if self.etcd is None:
            return {}
        total = {}
        for i in range(NODES):
            for k, v in parse_counters(self._metrics(i), "gradd_etcd_requests_total",
                                       "method").items():
                total[k] = total.get(k, 0.0) + v
        return total

    def jobs(self):
        """Jobs active on the 3 daemons together (gradd_jobs)."""
        total = 0.0
        for i in range(NODES):
            for line in self._metrics(i).splitlines():
                if line.startswith("gradd_jobs "):
                    total += float(line.split()[1])
        return total

    def check_alive(self):
        """Restarts a daemon that died on its own (and says so); raises
        BackendLost when that was the built-in store's node-0."""
        for i, d in enumerate(self.nodes.nodes):
            if d.proc.poll() is not None:
                print(f"[{self.name}] node-{i}'s daemon had exited ({d.proc.returncode}); its "
                      f"log ends:\n{d.log()[-3000:]}", file=sys.stderr)
                if self.etcd is None and i == 0:
                    raise BackendLost(f"node-0's daemon, the rendezvous store, exited with "
                                      f"{d.proc.returncode}")
                with self.args.signals.shield():
                    self.nodes.dead.append((i, d))
                    self.nodes.restart(i)

    def logs(self):
        text = self.nodes.logs()
        if self.etcd is not None:
            text += "\n" + self.etcd.logs()
        return text


def start_job(args, b, job, kind, env_by_rank, steps=1000000):
    """One trainer per node: elastic_worker.py (min_nodes 2) or
    restart_worker.py (--grace-ms), `steps` steps, then a clean shutdown."""
    third = "2" if kind == "elastic" else str(args.grace_ms)
    return [Trainer(args, b.nodes, job, r, kind, [str(steps), args.out, third], env_by_rank(r))
            for r in range(NODES)]


def kill_all(trainers):
    for t in trainers:
        t.kill()


def wait_exit(trainers, job, timeout=120):
    """Waits for the trainers to end their steps; each must exit 0."""
    deadline = time.monotonic() + timeout
    for t in trainers:
        try:
            rc = t.proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise RoundFailed(f"{job}: rank {t.rank} did not finish within {timeout} s:\n"
                              f"{t.tail()}") from None
        t.reader.join(10)
        if rc != 0:
            raise RoundFailed(f"{job}: rank {t.rank} exited with {rc}:\n{t.tail()}")


def wait_paused(args, trainers, job, timeout=120):
    deadline = time.monotonic() + timeout
    for t in trainers:
        path = os.path.join(args.out, f"paused-{t.rank}")
        while not os.path.exists(path):
            if t.proc.poll() is not None or time.monotonic() > deadline:
                raise RoundFailed(f"{job}: rank {t.rank} did not reach its pause:\n{t.tail()}")
            time.sleep(0.02)
        os.unlink(path)


def baseline(args, b):
    """Calls per second of the daemons with no job."""
    c0, t0 = b.calls(), time.monotonic()
    time.sleep(args.idle_s)
    c1, t1 = b.calls(), time.monotonic()
    return {k: v / (t1 - t0) for k, v in diff(c1, c0).items()}


# A daemon's etcd lease is kept alive whether it has jobs or not: its
# keep-alives are in the per-second rows, never in a formation's or a job
# end's count.
PER_DAEMON = ("LeaseKeepAlive",)


def less_baseline(calls, rate, seconds):
    """A window's calls, less the daemons' lease keep-alives and less what
    the no-job rate (the daemons with no job) would have made in it."""
    out = {}
    for k in set(calls) | set(rate):
        if k in PER_DAEMON:
            continue
        v = calls.get(k, 0.0) - rate.get(k, 0.0) * seconds
        if abs(v) >= 0.5:
            out[k] = v
    return out


def quiesce(args, b, rate, what, timeout=120.0):
    """Waits until no daemon holds a job and the rendezvous calls are back
    at the no-job rate (a 1 s window within it, plus 2 calls); returns
    (the calls before that window, its start time, seconds waited). A
    round's leftovers never count against the next one this way, and a
    daemon that keeps calling after its job has ended shows here."""
    start = time.monotonic()
    expected = sum(rate.values())
    last = "no job-free second yet"
    while True:
        jobs = b.jobs()
        if jobs == 0:
            c_a, t_a = b.calls(), time.monotonic()
            time.sleep(1.0)
            c_b, t_b = b.calls(), time.monotonic()
            last = f"last second {fmt_methods(diff(c_b, c_a))}"
            if sum(diff(c_b, c_a).values()) <= expected * (t_b - t_a) + 2:
                waited = t_a - start
                if waited > args.quiet_warn_s:
                    print(f"[{b.name}] after {what}: {waited:.1f} s until no job and no "
                          f"rendezvous calls beyond the no-job rate", file=sys.stderr)
                return c_a, t_a, waited
        else:
            time.sleep(0.1)
        if time.monotonic() - start > timeout:
            raise RoundFailed(f"{b.name}: after {what}, still a job or rendezvous calls "
                              f"{timeout:.0f} s on (jobs {jobs:g}; {last})")


def formation_round(args, b, n, rate):
    """See the module doc: formation, idle, job end."""
    job = f"rdv-form-{b.name}-{n}"
    pause = {"GRADD_TEST_PAUSE_AT_STEP": "2"}
    c0, d0, t0 = b.calls(), b.daemon_calls(), time.monotonic()
    trainers = start_job(args, b, job, "elastic", lambda r: pause)
    try:
        wait_paused(args, trainers, job)
        c1, d1, t1 = b.calls(), b.daemon_calls(), time.monotonic()
        for t in trainers:
            if not t.attach or not t.formed or not t.steps:
                raise RoundFailed(f"{job}: rank {t.rank} stamped no attach/step:\n{t.tail()}")
        last_call = max(t.attach[0] for t in trainers)
        formed_ms = (max(t.formed[0] for t in trainers) - last_call) / 1e6
        first_step_ms = (max(t.steps[0] for t in trainers) - last_call) / 1e6
        time.sleep(args.idle_s)
        c2, d2, t2 = b.calls(), b.daemon_calls(), time.monotonic()
        kill_all(trainers)
        c3, t3, _ = quiesce(args, b, rate, f"{job}'s end")
    finally:
        kill_all(trainers)
    return {
        "formed_ms": formed_ms,
        "first_step_ms": first_step_ms,
        "formation_calls": less_baseline(diff(c1, c0), rate, t1 - t0),
        "formation_calls_daemons": less_baseline(diff(d1, d0), {}, 0),
        "idle_calls_per_s": {k: v / (t2 - t1) for k, v in diff(c2, c1).items()},
        "idle_calls_daemons_per_s": {k: v / (t2 - t1) for k, v in diff(d2, d1).items()},
        "end_calls": less_baseline(diff(c3, c2), rate, t3 - t2),
        "end_s": t3 - t2,
    }


def node_loss_round(args, b, n, rate):
    """node-2's trainer stops before step K (GRADD_TEST_PAUSE_AT_STEP, as
    test_elastic_nodes.py does) and is SIGKILLed there with its daemon: the
    survivors are then inside step K's allreduce, which cannot complete
    without node-2, so their step K (their K+1-th applied step) is the
    first one after the re-formation, never one that was in flight. The
    survivors then run --tail-steps more steps and end the job cleanly."""
    job = f"rdv-loss-{b.name}-{n}"
    k = args.warmup
    sleep = {"GRADD_TEST_STEP_SLEEP_S": str(args.step_sleep_ms / 1000)}
    lost = NODES - 1
    trainers = start_job(args, b, job, "elastic", lambda r: dict(
        sleep, **({"GRADD_TEST_PAUSE_AT_STEP": str(k)} if r == lost else {})),
        steps=k + args.tail_steps)
    try:
        wait_paused(args, trainers[lost:], job)
        t_kill = time.monotonic_ns()
        with args.signals.shield():
            b.nodes.kill(lost)
        trainers[lost].kill()
        t_step = max(t.wait_steps(k + 1, 120) for t in trainers[:lost])
        if t_step <= t_kill:
            raise RoundFailed(f"{job}: step {k} was applied before node-{lost} was killed")
        before = trainers[0].steps[1:k]  # step 0 waits for the first allreduce's set-up
        step_ms = (before[-1] - before[0]) / (len(before) - 1) / 1e6
        wait_exit(trainers[:lost], job)
    finally:
        kill_all(trainers)
        if b.nodes.nodes[lost].proc.poll() is not None:
            with args.signals.shield():
                b.nodes.restart(lost)
    quiesce(args, b, rate, f"{job}'s end")
    return {"node_loss_ms": (t_step - t_kill) / 1e6, "step_ms": step_ms}


def rank_restart_round(args, b, n, rate):
    """node-1's trainer is SIGKILLed mid-run and started again at once.
    The step measured is the survivors' first one applied after the new
    trainer's attach call: the job cannot step without rank 1 (its grace
    holds it), so every step applied after that call waited for the
    rejoin, and a step already in flight at the kill is never taken for
    it. All three then run to --warmup + --tail-steps and end cleanly."""
    job = f"rdv-restart-{b.name}-{n}"
    victim = 1
    steps = args.warmup + args.tail_steps
    env = {"GRADD_TEST_STEP_SLEEP_S": str(args.step_sleep_ms / 1000)}
    trainers = start_job(args, b, job, "restart", lambda r: env, steps=steps)
    try:
        for t in trainers:
            t.wait_steps(args.warmup, 120)
        t_kill = time.monotonic_ns()
        trainers[victim].kill()
        trainers[victim] = Trainer(args, b.nodes, job, victim, "restart",
                                   [str(steps), args.out, str(args.grace_ms)], env)
        new = trainers[victim]
        t_attach = new.wait("its attach", lambda: new.attach[0] if new.attach else None, 120)
        t_step = max(t.step_after(t_attach, 120) for t in trainers if t.rank != victim)
        wait_exit(trainers, job)
    finally:
        kill_all(trainers)
    quiesce(args, b, rate, f"{job}'s end")
    return {"restart_ms": (t_step - t_kill) / 1e6,
            "rejoin_ms": (t_step - t_attach) / 1e6}


ROUNDS = (("formation", formation_round), ("node loss", node_loss_round),
          ("rank restart", rank_restart_round))


def run(args):
    backends = {}
    for name in args.backends:
        backends[name] = Backend(args, name)
    results = {name: [] for name in backends}
    failures = {name: [] for name in backends}
    rates = {}
    for name, b in backends.items():
        rates[name] = baseline(args, b)
        if not args.quiet:
            print(f"[{name}] no job: {sum(rates[name].values()):.2f} calls/s "
                  f"{fmt_methods(rates[name], 2)}", file=sys.stderr)
    lost = set()
    for n in range(args.rounds):
        for name, b in backends.items():
            if name in lost:
                continue
            rec = {}
            for what, fn in ROUNDS:
                if what not in args.only:
                    continue
                try:
                    b.check_alive()
                    rec.update(fn(args, b, n, rates[name]))
                except BackendLost as e:
                    failures[name].append(f"round {n} {what}: {e}; no more rounds")
                    print(f"[{name}] round {n}: {e}; no more rounds", file=sys.stderr)
                    lost.add(name)
                    break
                except RoundFailed as e:
                    failures[name].append(f"round {n} {what}: {e}")
                    print(f"[{name}] round {n} {what} FAILED: {e}\n--- daemons\n{b.logs()}",
                          file=sys.stderr)
            if not args.quiet:
                print(f"[{name}] round {n}: " + ", ".join(
                    f"{k} {v:.1f}" for k, v in rec.items() if isinstance(v, float)),
                    file=sys.stderr)
            results[name].append(rec)
    return results, rates, failures


# ------------------------------------------------------------------ main
def snapshot(args):
    """Copies the daemon and the Python client out of the build tree into
    the run's directory and runs those: a rebuild in the build tree during
    the run (a shared machine) then neither changes the binary of a daemon
    started again mid-run (node-2, every node loss round) nor hands a
    trainer a half-written library."""
    d = os.path.join(args.out, "build")
    os.makedirs(os.path.join(d, "python"))
    gradd = os.path.join(d, "gradd")
    shutil.copy2(args.gradd, gradd)
    shutil.copytree(os.path.join(args.python_dir, "gradd"), os.path.join(d, "python", "gradd"),
                    symlinks=False, ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, PYTHONPATH=os.path.join(d, "python"))
    check = subprocess.run([sys.executable, "-c", "import gradd.torch"], env=env,
                           capture_output=True, timeout=120)
    if check.returncode != 0:
        raise SystemExit(f"the Python client copied from {args.python_dir} does not import "
                         f"(a build running there?):\n{check.stderr.decode(errors='replace')}")
    args.gradd, args.python_dir = gradd, os.path.join(d, "python")


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2], sys.argv[3:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true",
                    help="2 rounds, 4 s idle windows")
    ap.add_argument("--idle-s", type=float, default=10.0,
                    help="seconds the idle job (and the daemons with no job) are watched")
    ap.add_argument("--lease-ttl-ms", type=int, default=2000,
                    help="etcd: rendezvous.etcd.lease_ttl_ms (2000 is the lowest allowed)")
    ap.add_argument("--reformation-silence-ms", type=int, default=1000,
                    help="builtin: rendezvous.reformation_silence_ms (1000: the daemon's default)")
    ap.add_argument("--reformation-settle-ms", type=int, default=10000,
                    help="both: rendezvous.reformation_settle_ms (above the liveness bounds, so "
                         "that they, not the settle, end a loss's wait)")
    ap.add_argument("--step-sleep-ms", type=int, default=20,
                    help="sleep per step in the node loss and rank restart jobs")
    ap.add_argument("--grace-ms", type=int, default=30000, help="rank_restart_grace_ms")
    ap.add_argument("--warmup", type=int, default=10, help="steps on every node before a kill")
    ap.add_argument("--tail-steps", type=int, default=20,
                    help="steps after the kill, before the job ends cleanly")
    ap.add_argument("--quiet-warn-s", type=float, default=5.0,
                    help="say so when the daemons take longer than this to go quiet "
                         "after a round")
    ap.add_argument("--etcd-members", type=int, default=1)
    ap.add_argument("--backends", default="builtin,etcd",
                    help="comma-separated: builtin, etcd (default both)")
    ap.add_argument("--only", default="formation,node loss,rank restart",
                    help="comma-separated rounds to run: formation (with idle and job end), "
                         "node loss, rank restart (default all)")
    ap.add_argument("--format", default="text", choices=["text", "json"])
    ap.add_argument("--quiet", action="store_true", help="no per-round progress on stderr")
    args = ap.parse_args()
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    args.only = {w.strip().replace("-", " ") for w in args.only.split(",") if w.strip()}
    if not args.backends or set(args.backends) - {"builtin", "etcd"}:
        ap.error("--backends takes builtin and/or etcd")
    if not args.only or args.only - {w for w, _ in ROUNDS}:
        ap.error("--only takes formation, node loss (node-loss), rank restart (rank-restart)")
    if args.quick:
        args.rounds = min(args.rounds, 2)
        args.idle_s = min(args.idle_s, 4.0)
    args.build_dir = os.path.abspath(args.build_dir)
    args.gradd = os.path.join(args.build_dir, "server", "gradd")
    args.python_dir = os.path.join(args.build_dir, "client", "python")
    if not os.access(args.gradd, os.X_OK):
        sys.exit(f"{args.gradd} is missing: build first (scripts/setup)")
    if not os.path.isdir(os.path.join(args.python_dir, "gradd")):
        sys.exit(f"{args.python_dir}/gradd is missing: build the Python client first")
    sys.path.insert(0, TESTS)
    from etcd_cluster import have_etcd, etcd_binary

    if not have_etcd():
        sys.exit(f"{etcd_binary()} is missing: scripts/setup installs etcd-server")

    # Everything started is registered here as soon as it exists, and
    # stopped in the finally below, whatever ends the run.
    args.trainers, args.node_sets, args.etcd_clusters = [], [], []
    args.out = None
    args.load_start = os.getloadavg()
    args.signals = Signals()
    ok = False
    try:
        args.out = tempfile.mkdtemp(prefix="gradd-rdv-bench-")
        snapshot(args)
        results, rates, failures = run(args)
        summary = summarize(args, results, rates, failures)
        if args.format == "json":
            print(json.dumps(summary))
        else:
            print_table(args, summary)
        ok = not any(failures.values())
    except Interrupted as e:
        print(f"interrupted ({e}): cleaning up", file=sys.stderr)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        for t in args.trainers:
            try:
                t.kill()
            except OSError:
                pass
        for nodes in args.node_sets:  # daemons before etcd: each revokes its lease
            nodes.stop()
        for c in args.etcd_clusters:
            c.stop()
        if args.out is not None:
            shutil.rmtree(args.out, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
