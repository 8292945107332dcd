"""Node loss and arrival (common/control_block.h "Re-formation"), end to end:
real daemons on loopback, one gradd.torch trainer per node
(elastic_worker.py), nodes SIGKILLed and started again.

How the aborted step is accounted for: the trainer of the node to be lost
stops *before* step K's forward (GRADD_TEST_PAUSE_AT_STEP) and is killed
with its daemon there, so steps 0..K-1 ran on every node and step K, whose
iteration the survivors had begun (some buckets handed over), is aborted by
the re-formation and retried by them without the lost node. Every trainer
records the live world size of each applied step; the parameters are
recomputed here without gradd from those records (data is a function of
(step, rank), plain SGD) and compared (float32 sums in another order: to
1e-5), and all trainers must end bitwise equal to each other.

Rank restart across nodes (rank restart of one rank of a 2-node job) reuses
test_rank_restart.py's worker and assertions.

Every test that starts daemons (nodes_factory) runs on both rendezvous
backends (ids "builtin": node-0's store; "etcd": a 1-member etcd over mutual
TLS, no daemon special, issue 34); where they differ is how a lost node is
noticed (its beats stop, or its daemon's lease leaves etcd), and the
assertions on that say which. The faults only etcd survives are in
test_etcd_faults.py.

These need the daemon side of node loss and arrival; on a build without it
they skip (the probe: a 2-node job attached with min_nodes=1 reports it
back).
"""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from torch import nn

import gradd
from trainer_procs import TrainerProcs
from conftest import HERE, Nodes, trainer_env

sys.path.insert(0, HERE)
import elastic_worker  # noqa: E402

WORKER = os.path.join(HERE, "elastic_worker.py")
RESTART_WORKER = os.path.join(HERE, "restart_worker.py")

# gradd.torch's deprecated names (docs/deprecations.md) are tested by
# test_torch_renames.py only; here their FutureWarning fails the test.
pytestmark = pytest.mark.filterwarnings(
    r"error:gradd\.torch\.DistributedDataParallel.*is deprecated:FutureWarning")


@pytest.fixture(params=["builtin", "etcd"])
def backend(request):
    """The rendezvous backend of the test's daemons: node-0's built-in
    store, or a 1-member etcd over mutual TLS (etcd_cluster.py)."""
    return request.param


@pytest.fixture
def nodes_factory(gradd_binary, backend, etcd_factory):
    """make(n, etcd_members=1, **Nodes options): n daemons on the test's
    backend; on etcd each call starts an etcd cluster of its own
    (stopped after the daemons, by etcd_factory)."""
    made = []

    def make(n, etcd_members=1, **kw):
        etcd = etcd_factory(etcd_members) if backend == "etcd" else None
        made.append(Nodes(gradd_binary, n, backend=backend, etcd=etcd, **kw))
        return made[-1]

    yield make
    for m in made:
        m.stop()


def require_elastic(nodes, job_id):
    """Fails the calling test unless the daemons implement node loss and
    arrival: a tiny 2-node job (nodes 0 and 1) attached with min_nodes=1
    reports it back (a single-node job never has a min_nodes)."""
    import threading

    got, errors = {}, []
    # Neither rank detaches before both attached: a node whose attach has
    # returned may still be connecting its Gloo pairs to the other, and
    # the other's job ending then fails that formation (seen on etcd).
    both = threading.Barrier(2)

    def attach(i):
        try:
            c = gradd.attach([("w", (4,), "float32")], socket=nodes.nodes[i].socket,
                             job_id=job_id + "-probe", node_rank=i, num_nodes=2,
                             coordinator=nodes.coordinator, world_size=2, rank=i,
                             min_nodes=1, attach_timeout=30)
            got[i] = int(getattr(c, "min_nodes", 0))
            try:
                both.wait(60)
            finally:
                c.detach()
        except threading.BrokenBarrierError:
            pass  # the other rank's attach failed: its error says why
        except Exception as e:  # noqa: BLE001 - reported below
            both.abort()
            errors.append(f"node {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=attach, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors or got != {0: 1, 1: 1}:
        pytest.fail("this build's daemons do not implement node loss and arrival (a "
                    f"2-node job attached with min_nodes=1 reports {got}; {errors})",
                    pytrace=False)


class Trainers(TrainerProcs):
    """One elastic_worker per node, started like a supervisor would."""

    def __init__(self, nodes, job_id, steps, out_dir, min_nodes, script=WORKER, args=None):
        super().__init__(out_dir)
        self.nodes, self.job_id = nodes, job_id
        self.script = script
        self.args = args if args is not None else [str(steps), str(out_dir), str(min_nodes)]

    def start(self, rank, **env):
        full = trainer_env(self.nodes, rank, self.job_id)
        full.update(env)
        self.procs[rank] = subprocess.Popen(
            [sys.executable, self.script, *self.args], env=full, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True)
        return self.procs[rank]

    def daemon_logs(self):
        logs = self.nodes.logs()
        if self.nodes.etcd is not None:
            logs += "\n" + self.nodes.etcd.logs()
        return logs


def _wait_for(path, proc, timeout, what):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None:
            return False
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def reference(live_by_step, world, divisor=None):
    """The parameters after the applied steps, recomputed without gradd:
    step s sums the gradients of the first live_by_step[s] global ranks (a
    lost node's ranks are the highest here), or of the global ranks it
    lists, and averages over their count, or over `divisor`
    (divide_by_initial_world_size: the initial world size)."""
    model = elastic_worker.make_model()
    params = list(model.parameters())
    for step, live in enumerate(live_by_step):
        ranks = list(range(live)) if isinstance(live, int) else list(live)
        assert ranks and all(0 <= r < world for r in ranks), ranks
        total = [torch.zeros_like(p) for p in params]
        for r in ranks:
            model.zero_grad()
            x, y = elastic_worker.batch(step, r)
            nn.functional.mse_loss(model(x), y).backward()
            for t, p in zip(total, params):
                t += p.grad
        with torch.no_grad():
            for t, p in zip(total, params):
                p -= elastic_worker.LR * (t / (divisor or len(ranks)))
    return elastic_worker.flat(model)


def _close(a, b, tol=1e-5):
    return all(abs(x - y) <= tol * (1 + abs(y)) for pa, pb in zip(a, b) for x, y in zip(pa, pb))


def _applied_live(rep):
    return [a["live"] for a in rep["attempts"] if "aborted" not in a]


def _all_succeed(t, ranks, timeout):
    """Waits for the trainers of `ranks`; each must exit 0."""
    for r in ranks:
        _, rc, _, _ = t.wait(r, timeout)
        assert rc == 0, f"rank {r} failed:\n{t.report()}"


def _returned(res, rank):
    """The one final report of the trainer that came back at `rank`."""
    back = [rep for rep in res[rank] if "final" in rep]
    assert len(back) == 1, res[rank]
    assert back[0]["rejoined"] is True
    return back[0]


def _metric(text, family, job):
    for line in text.splitlines():
        if line.startswith(family + "{") and f'job_id="{job}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


# ------------------------------------------------------------------ option
def test_min_nodes_without_job_id_is_refused(monkeypatch):
    for var in ("GRADD_JOB", "GRADD_MIN_NODES", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("GRADD_SOCKET", "/nonexistent/gradd.sock")
    with pytest.raises(ValueError, match=r"min_nodes=2 needs an explicit job id"):
        gradd.torch.DistributedDataParallel(nn.Linear(3, 2), min_nodes=2)
    monkeypatch.setenv("GRADD_MIN_NODES", "x")
    with pytest.raises(ValueError, match=r"GRADD_MIN_NODES='x' is not an integer"):
        gradd.torch.DistributedDataParallel(nn.Linear(3, 2), job_id="j")
    monkeypatch.setenv("GRADD_MIN_NODES", "1")
    with pytest.raises(ValueError, match=r"min_nodes=1 needs an explicit job id"):
        gradd.torch.DistributedDataParallel(nn.Linear(3, 2))


def test_min_nodes_keyword_reaches_the_attach(monkeypatch):
    # Past the checks construction attaches: the socket does not exist.
    monkeypatch.setenv("GRADD_SOCKET", "/nonexistent/gradd.sock")
    with pytest.raises(gradd.GraddError) as info:
        gradd.torch.DistributedDataParallel(nn.Linear(3, 2), job_id="j", min_nodes=2,
                                            divide_by_initial_world_after_reformation=True,
                                            world_size=1, rank=0, connect_timeout=0.2)
    assert not isinstance(info.value, ValueError)


def test_single_node_accessors(daemon, job_id):
    c = gradd.attach([("w", (4,), "float32")], socket=daemon.socket, job_id=job_id)
    try:
        assert c.live_world_size == 1
        assert c.epoch == 0
        assert c.state_behind is False
    finally:
        c.detach()


# ------------------------------------------------------------- node loss
def test_node_lost_job_goes_on_with_the_others(nodes_factory, job_id, tmp_path):
    """(a) 3 nodes, min_nodes 2; node-2 (its trainer and daemon) is SIGKILLed
    before step K: ranks 0 and 1 abort step K once, retry it on 2 nodes and
    end equal to each other and to the recomputation; the job's world size
    shrinks to 2 and the daemons name the lost node. The settle is longer
    than the whole test may take: the survivors stop waiting for node-2
    because its beat stopped (built-in store: rendezvous.reformation_silence_ms,
    default 1 s, 3 s of silence here, conftest.Nodes) or its daemon's
    etcd lease expired (etcd: rendezvous.etcd.lease_ttl_ms, 3 s here), not
    because the settle ran out."""
    steps, k = 16, 4
    # The settle is capped by the formation timeout (30 s here).
    nodes = nodes_factory(3, reformation_settle_ms=60000)
    require_elastic(nodes, job_id)
    t = Trainers(nodes, job_id, steps, tmp_path, min_nodes=2)
    slow = {"GRADD_TEST_STEP_SLEEP_S": "0.1"}  # time to read the metrics
    for r in range(3):
        t.start(r, **slow, **({"GRADD_TEST_PAUSE_AT_STEP": str(k)} if r == 2 else {}))
    worlds = set()
    try:
        assert _wait_for(tmp_path / "paused-2", t.procs[2], 60, "pause"), t.report()
        worlds.add(_metric(nodes.metrics(0), "gradd_job_world_size", job_id))
        t.kill(2)
        nodes.kill(2)
        started = time.monotonic()
        shrunk_after = None
        while t.procs[0].poll() is None and time.monotonic() - started < 60:
            worlds.add(_metric(nodes.metrics(0), "gradd_job_world_size", job_id))
            if 2.0 in worlds:
                shrunk_after = time.monotonic() - started
                break
            time.sleep(0.05)
        _all_succeed(t, (0, 1), 90)
        took = time.monotonic() - started
    finally:
        t.kill_all()
    assert took < 60, t.report()
    res = {r: v[0] for r, v in t.results().items()}
    assert sorted(res) == [0, 1], res.keys()
    for r in (0, 1):
        rep = res[r]
        aborted = [a for a in rep["attempts"] if "aborted" in a]
        assert len(aborted) == 1, rep["attempts"]
        assert aborted[0]["step"] == k, rep["attempts"]
        assert "re-formed" in aborted[0]["aborted"], aborted[0]
        live = _applied_live(rep)
        assert live == [3] * k + [2] * (steps - k), live
        assert rep["synced_at"] == [k], rep
    assert res[0]["final"] == res[1]["final"]
    assert _close(res[0]["final"], reference([3] * k + [2] * (steps - k), 3))
    # ... and not the 3-node run's (the lost node's data really left).
    assert not _close(res[0]["final"], reference([3] * steps, 3))
    # The job's world size as the coordinator's node exports it: 3, then 2.
    assert 3.0 in worlds and 2.0 in worlds, worlds
    log = nodes.logs()
    assert "node-2" in log, log
    # Well before the 30 s the settle would have taken, for the backend's
    # reason: node-2's beat stopped, or its lease left etcd.
    if nodes.backend == "etcd":
        assert "node 'node-2' is gone from etcd" in log, log
    else:
        assert "node 'node-2' has been silent for 3s" in log, log
    assert shrunk_after is not None and shrunk_after < 20, shrunk_after


def test_below_min_nodes_fails_naming_the_lost_node(nodes_factory, job_id, tmp_path):
    """(b) 2 nodes, min_nodes 2: node-1 is lost; rank 0 gets a clear error
    naming it, in bounded time (no hang)."""
    nodes = nodes_factory(2)
    require_elastic(nodes, job_id)
    t = Trainers(nodes, job_id, 8, tmp_path, min_nodes=2)
    t.start(0)
    t.start(1, GRADD_TEST_PAUSE_AT_STEP="3")
    try:
        assert _wait_for(tmp_path / "paused-1", t.procs[1], 60, "pause"), t.report()
        t.kill(1)
        nodes.kill(1)
        started = time.monotonic()
        _, rc, _, _ = t.wait(0, 90)
        waited = time.monotonic() - started
    finally:
        t.kill_all()
    assert rc == 3, t.report()
    rep = t.results()[0][0]
    assert "IterationAborted" not in rep["error"], rep["error"]
    assert "node-1" in rep["error"], rep["error"]
    assert job_id in rep["error"], rep["error"]
    assert waited < 45, (waited, t.report())


def test_lost_node_comes_back(nodes_factory, job_id, tmp_path):
    """(c) After (a)'s shrink, node-2's daemon and trainer start again (same
    node id): admitted at an iteration boundary, its trainer rejoins, gets
    the state from a live rank and all three end with equal parameters,
    those of the recomputation with the live world each step had."""
    steps, k = 60, 3
    nodes = nodes_factory(3)
    require_elastic(nodes, job_id)
    t = Trainers(nodes, job_id, steps, tmp_path, min_nodes=2)
    slow = {"GRADD_TEST_STEP_SLEEP_S": "0.15"}
    for r in range(3):
        t.start(r, **slow, **({"GRADD_TEST_PAUSE_AT_STEP": str(k)} if r == 2 else {}))
    try:
        assert _wait_for(tmp_path / "paused-2", t.procs[2], 60, "pause"), t.report()
        t.kill(2)
        nodes.kill(2)
        time.sleep(2.0)  # the survivors go on on 2 nodes for a while
        nodes.restart(2)
        t.start(2, **slow)
        _all_succeed(t, range(3), 120)
    finally:
        t.kill_all()
    res = t.results()
    back = _returned(res, 2)
    assert back["synced_at"] and back["synced_at"][0] > k, back
    for r in (0, 1):
        rep = res[r][0]
        live = _applied_live(rep)
        # 3 nodes, then 2 from step k, then 3 again.
        assert live[:k] == [3] * k and live[k] == 2 and live[-1] == 3, live
        aborted = [a for a in rep["attempts"] if "aborted" in a]
        assert len(aborted) == 2, rep["attempts"]  # the loss, the arrival
        assert rep["final"] == back["final"]
    assert res[0][0]["final"] == res[1][0]["final"]
    assert _close(res[0][0]["final"], reference(_applied_live(res[0][0]), 3))


def test_admitted_node_divides_by_the_initial_world_size(nodes_factory, job_id, tmp_path):
    """(c') divide_by_initial_world_size with a node admitted into the
    running job: 3 nodes, min_nodes 2. node-1 is lost at step K (ranks 0
    and 2 go on), then, at step K2, node-2 is lost while node-1 is started
    again and admitted in the same re-formation: the job runs on ranks 0
    and 1, a live world of 2, while its initial world was 3. The admitted
    node learns the initial world size from the agreement, so every step on
    every node averages over 3 and both nodes end bitwise equal, with the
    recomputation's parameters. (Had node-1 come back to a whole job, the
    live world would be the initial one again and the divisor the same on
    a node that did not know it.)

    node-1's new trainer is started with the same command as the first
    (WORLD_SIZE=3, the job's initial size, which the daemon's attach reply
    also says while the live world is 2): it takes global rank 1, the lowest
    free one (formation/reformation.h, AssignOffsets)."""
    steps, k, k2 = 14, 3, 7
    # Long enough for node-1's trainer to start and ask to be admitted
    # while node-0 waits in the re-formation for node-2.
    # (node-2's silence must not end the wait: reformation_silence_ms above the
    # settle leaves only the settle; on etcd, where liveness is the
    # daemon's lease, so does a lease TTL above the settle.)
    nodes = nodes_factory(3, reformation_settle_ms=10000, reformation_silence_ms=20000,
                          lease_ttl_ms=20000)
    require_elastic(nodes, job_id)
    t = Trainers(nodes, job_id, steps, tmp_path, min_nodes=2)
    divide = {"GRADD_TEST_DIVIDE_BY_INITIAL": "1"}
    t.start(0, **divide)
    t.start(1, **divide, GRADD_TEST_PAUSE_AT_STEP=str(k))
    t.start(2, **divide, GRADD_TEST_PAUSE_AT_STEP=str(k2))
    try:
        assert _wait_for(tmp_path / "paused-1", t.procs[1], 60, "pause"), t.report()
        t.kill(1)
        nodes.kill(1)
        assert _wait_for(tmp_path / "paused-2", t.procs[2], 60, "pause"), t.report()
        nodes.restart(1)  # its daemon waits idle until its trainer attaches
        t.kill(2)
        nodes.kill(2)
        t.start(1, **divide)
        _all_succeed(t, (0, 1), 120)
    finally:
        t.kill_all()
    res = t.results()
    back = _returned(res, 1)
    assert back["synced_at"] == [k2], back
    rep = res[0][0]
    assert _applied_live(rep) == [3] * k + [2] * (steps - k), rep["attempts"]
    aborted = [a["step"] for a in rep["attempts"] if "aborted" in a]
    # node-1 lost; node-2 lost and node-1 back, one re-formation.
    assert aborted == [k, k2], rep["attempts"]
    assert back["final"] == rep["final"]
    ranks = [[0, 1, 2]] * k + [[0, 2]] * (k2 - k) + [[0, 1]] * (steps - k2)
    assert _close(rep["final"], reference(ranks, 3, divisor=3))
    # ... and not what averaging over the live world gives.
    assert not _close(rep["final"], reference(ranks, 3))


# ------------------------------------------- rank restart across two nodes
def test_rank_restart_on_a_two_node_job(nodes_factory, job_id, tmp_path):
    """(d) 2 nodes, rank 1 (on node-1) SIGKILLed in the middle of step K's
    backward and started again with rank_restart_grace_ms: it rejoins, gets
    rank 0's parameters, and the job ends with an uninterrupted run's
    parameters (the aborted step was applied by nobody and retried with the
    same data)."""
    steps, die_at, grace = 8, 3, 30000
    nodes = nodes_factory(2)
    require_elastic(nodes, job_id)
    out = tmp_path / "restart"
    out.mkdir()
    t = Trainers(nodes, job_id, steps, out, 0, script=RESTART_WORKER,
                 args=[str(steps), str(out), str(grace)])
    t.start(0)
    t.start(1, GRADD_TEST_DIE_AT_STEP=str(die_at))
    try:
        _, rc, _, _ = t.wait(1, 90)
        assert rc == -signal.SIGKILL, f"the victim did not die by SIGKILL:\n{t.report()}"
        t.start(1)
        _all_succeed(t, (0, 1), 90)
    finally:
        t.kill_all()
    res = t.results()
    res = {r: v[0] for r, v in res.items()}
    back, survivor = res[1], res[0]
    assert back["rejoined"] is True
    assert back["synced"]["step"] == die_at
    aborted = [a for a in survivor["attempts"] if "aborted" in a]
    assert len(aborted) == 1 and aborted[0]["step"] == die_at, survivor["attempts"]
    assert survivor["synced"]["params"] == back["synced"]["params"]
    assert survivor["final"] == back["final"]
    # The uninterrupted run on the same two daemons.
    ref_dir = tmp_path / "reference"
    ref_dir.mkdir()
    ref = Trainers(nodes, job_id + "-ref", steps, ref_dir, 0, script=RESTART_WORKER,
                   args=[str(steps), str(ref_dir), str(grace)])
    for r in (0, 1):
        ref.start(r)
    try:
        for r in (0, 1):
            _, rc, _, _ = ref.wait(r, 90)
            assert rc == 0, ref.report()
    finally:
        ref.kill_all()
    assert ref.results()[0][0]["final"] == survivor["final"]



# ------------------------------- what every node reports (issue 32)
def _counter(text, family, **labels):
    """The value of `family` with exactly `labels` in node text (0 when the
    series is not there: a counter never incremented is not exported)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(family):
            continue
        name, _, value = line.rpartition(" ")
        got = name[len(family):]
        if got == (f"{{{want}}}" if want else "") or (
                got.startswith("{") and ",".join(sorted(got[1:-1].split(","))) == want):
            return float(value)
    return 0.0


def _ctl_job(ctl, node, job):
    out = subprocess.run([ctl, "--socket", node.socket, "--json", "job", job],
                         capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    import json

    return json.loads(out.stdout)["job"]["summary"]


def _poll(what, check, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _reformed_lines(log, epoch):
    return [line for line in log.splitlines() if f"re-formed (epoch {epoch})" in line]


def test_every_node_reports_a_rank_restart_and_a_node_return_alike(
        nodes_factory, job_id, tmp_path):
    """Issue 32: 3 daemons, min_nodes 2. Local rank 0 of node-1 (global rank
    1) is SIGKILLed and restarted, then node-2 (daemon and trainer) is
    killed and started again. On every node: one re-formation per event
    with the same reason label, one aborted iteration each (not two on the
    restarted rank's node), the same live and lost nodes in `graddctl job`
    and in gradd_job_node_up, one info line saying what each event was, and
    iteration numbers that agree (rejoin_iteration is the iteration every
    node's line says the job goes on at)."""
    from conftest import graddctl

    ctl = graddctl()
    steps, die_at, grace = 400, 3, 30000
    nodes = nodes_factory(3)
    require_elastic(nodes, job_id)
    out = tmp_path / "run"
    out.mkdir()
    t = Trainers(nodes, job_id, steps, out, 2, script=RESTART_WORKER,
                 args=[str(steps), str(out), str(grace)])
    env = {"GRADD_MIN_NODES": "2", "GRADD_TEST_STEP_SLEEP_S": "0.05"}
    metrics = lambda: [nodes.metrics(i) for i in range(3)]  # noqa: E731
    reform = "gradd_job_reformations_total"
    try:
        for r in range(3):
            t.start(r, **env, **({"GRADD_TEST_DIE_AT_STEP": str(die_at)} if r == 1 else {}))
        _, rc, _, _ = t.wait(1, 90)
        assert rc == -signal.SIGKILL, f"the victim did not die by SIGKILL:\n{t.report()}"
        t.start(1, **env)

        # 1. The rank restart: rank_rejoined once everywhere, one abort each.
        texts = _poll("the rank restart's re-formation on every node", lambda: (
            lambda m: m if all(_counter(x, reform, reason="rank_rejoined") >= 1 for x in m)
            else None)(metrics()))
        for i, text in enumerate(texts):
            assert _counter(text, reform, reason="rank_rejoined") == 1, (i, text)
            assert _counter(text, reform, reason="other") == 0, (i, text)
            assert _counter(text, "gradd_iterations_aborted_total") == 1, (i, text)
            assert _counter(text, "gradd_rank_restarts_total") == (1 if i == 1 else 0), (i, text)
        for i in range(3):
            s = _ctl_job(ctl, nodes.nodes[i], job_id)
            assert s["live_node_ids"] == ["node-0", "node-1", "node-2"], (i, s)
            assert s.get("lost_node_ids", []) == [], (i, s)

        # 2. node-2 is lost: node_lost on the two others, node-2 down.
        t.kill(2)
        nodes.kill(2)
        texts = _poll("node-2's loss on node-0 and node-1", lambda: (
            lambda m: m if all(_counter(x, reform, reason="node_lost") >= 1 for x in m)
            else None)([nodes.metrics(0), nodes.metrics(1)]))
        for i, text in enumerate(texts):
            assert _counter(text, reform, reason="node_lost") == 1, (i, text)
            assert _counter(text, "gradd_job_node_up", job_id=job_id, node_id="node-2") == 0
            assert _counter(text, "gradd_job_node_up", job_id=job_id, node_id="node-1") == 1
            s = _ctl_job(ctl, nodes.nodes[i], job_id)
            assert s["live_node_ids"] == ["node-0", "node-1"], (i, s)
            assert s["lost_node_ids"] == ["node-2"], (i, s)

        # 3. node-2 comes back: admitted; live 3 of 3, lost none, everywhere.
        nodes.restart(2)
        t.start(2, **env)
        texts = _poll("node-2's admission on node-0 and node-1", lambda: (
            lambda m: m if all(_counter(x, reform, reason="node_admitted") >= 1 for x in m)
            else None)([nodes.metrics(0), nodes.metrics(1)]))
        summaries = [_ctl_job(ctl, nodes.nodes[i], job_id) for i in range(3)]
        for i, s in enumerate(summaries):
            assert s["live_node_ids"] == ["node-0", "node-1", "node-2"], (i, s)
            assert s.get("lost_node_ids", []) == [], (i, s)
        # The same iteration numbers (the nodes step together: at most a
        # step apart between two answers). Three graddctl calls in a row
        # may straddle a few steps on a loaded machine, so the nodes get a
        # few tries to answer close together; a node that numbers its
        # iterations otherwise (3 where the others say 30) never does.
        spreads = []
        for _ in range(10):
            its = [int(_ctl_job(ctl, nodes.nodes[i], job_id)["iteration"])
                   for i in range(3)]
            spreads.append(its)
            if max(its) - min(its) <= 2:
                break
        assert max(its) - min(its) <= 2, spreads
        for i in range(3):
            text = nodes.metrics(i)
            for node in ("node-0", "node-1", "node-2"):
                assert _counter(text, "gradd_job_node_up", job_id=job_id, node_id=node) == 1, \
                    (i, node, text)
        for i, text in enumerate(texts):
            assert _counter(text, reform, reason="node_admitted") == 1, (i, text)
            assert _counter(text, reform, reason="rank_rejoined") == 1, (i, text)
            assert _counter(text, reform, reason="other") == 0, (i, text)
            # The rank restart, the loss, the admission: one abort each.
            assert _counter(text, "gradd_iterations_aborted_total") == 3, (i, text)
        _all_succeed(t, range(3), 120)
    finally:
        t.kill_all()
        (tmp_path / "logs").mkdir()
        nodes.save_logs(tmp_path / "logs")

    res = t.results()
    back1 = [rep for rep in res[1] if rep["rejoined"]]
    back2 = [rep for rep in res[2] if rep["rejoined"]]
    assert len(back1) == 1 and len(back2) == 1, res
    finals = [rep["final"] for r in range(3) for rep in res[r] if "final" in rep]
    assert len(finals) == 3 and all(f == finals[0] for f in finals), res

    # The logs: one line per event and node saying what it was, at info for
    # the restart and the admission, naming the node and rank; the running
    # nodes' lines say where the job goes on, which is the restarted
    # trainer's rejoin_iteration.
    logs = {i: nodes.nodes[i].log() for i in range(3)}
    for i in (0, 1):
        log = logs[i]
        lines = _reformed_lines(log, 1)
        assert len(lines) == 1, (i, lines)
        assert "local rank 0 of node 'node-1' restarted (rank_restarted)" in lines[0], lines
        assert " I " in lines[0][:40], lines
        assert f"goes on at iteration {back1[0]['rejoin_iteration']}" in lines[0], \
            (lines, back1[0]["rejoin_iteration"])
        lost = _reformed_lines(log, 2)
        assert len(lost) == 1 and "node 'node-2' lost" in lost[0] and "(node_lost)" in lost[0], lost
        admitted = _reformed_lines(log, 3)
        assert len(admitted) == 1 and "node 'node-2' admitted (node_admitted)" in admitted[0], \
            admitted
        assert f"goes on at iteration {back2[0]['rejoin_iteration']}" in admitted[0], \
            (admitted, back2[0]["rejoin_iteration"])
        # What a node saw at the rank restart's break is not called a
        # failure: no warning or error until node-2's real loss, but for
        # the trainer's death itself on its own node ("is restarting") and
        # the one warning that the metric's default label value for it is
        # deprecated (reason="rank_rejoined", docs/deprecations.md).
        before_loss = log.split("its nodes' group broke at epoch 1")[0]
        loud = [line for line in before_loss.splitlines()
                if (" W " in line[:40] or " E " in line[:40])
                and not (i == 1 and "is restarting (session closed" in line)
                and "that label value is deprecated" not in line]
        assert not loud, loud
    # node-2 before its loss said the same about the rank restart.
    dead_log = [d.log() for i, d in nodes.dead if i == 2][0]
    lines = _reformed_lines(dead_log, 1)
    assert len(lines) == 1 and "(rank_restarted)" in lines[0], lines
