"""The faults only the rendezvous on etcd survives (issue 34, "Any node may
die"), end to end: real daemons on rendezvous.backend: etcd, a real
3-member etcd over mutual TLS (etcd_cluster.py), one gradd.torch trainer
per node (elastic_worker.py, as in test_elastic_nodes.py, whose helpers
recompute the parameters without gradd).

  - node-0, the node that would be the coordinator on the built-in store,
    is lost mid-job (daemon and trainer SIGKILLed): the other two go on,
    then node-0 comes back with the same node id and is admitted;
  - an etcd member is SIGKILLed mid-job (member 0, the one the daemons
    talk to first, while a follower; and the leader, while not member 0):
    nothing happens to the job, no aborted iteration, no re-formation;
  - every etcd member is SIGKILLed mid-job: the running job finishes its
    steps, a job attached meanwhile fails within the formation timeout naming
    the etcd endpoints, and once etcd is back a new job forms and ends.

  - jobs that ended (an elastic one, whose last node deletes its keys, and
    one that was not, whose rounds are released by every node) leave no key
    in etcd.

Each test's daemons and etcd are stopped and their directories deleted at
its end, failed or not (fixtures etcd_nodes and etcd_factory).
"""
import base64
import threading
import time

import pytest

import gradd
from conftest import Nodes
from test_elastic_nodes import (Trainers, _all_succeed, _applied_live, _close, _metric,
                                _returned, _wait_for, reference, require_elastic)

ETCD_MEMBERS = 3


@pytest.fixture
def etcd_nodes(gradd_binary, etcd_factory):
    """make(n, **Nodes options): n daemons on a fresh 3-member etcd (the
    Nodes' `etcd`); the daemons stop before etcd does."""
    made = []

    def make(n, **kw):
        made.append(Nodes(gradd_binary, n, backend="etcd",
                          etcd=etcd_factory(ETCD_MEMBERS), **kw))
        return made[-1]

    yield make
    for m in made:
        m.stop()


def _keep_logs(nodes, tmp_path):
    """Every daemon's whole log (the killed ones' too) and the etcd
    members' in tmp_path/logs, which pytest keeps after a failure."""
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    nodes.save_logs(logs)
    (logs / "etcd.log").write_text(nodes.etcd.logs())


def _total(text, family):
    """Sum of every series of `family` in a node's /metrics text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(family + "{") or line.startswith(family + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


FAULT_COUNTERS = ("gradd_iterations_aborted_total", "gradd_job_reformations_total",
                  "gradd_nodes_lost_total", "gradd_job_failures_total")


def _fault_counts(nodes):
    return [{f: _total(nodes.metrics(i), f) for f in FAULT_COUNTERS}
            for i in range(len(nodes.nodes))]


def _wait_iterations(nodes, job, at_least, t, timeout=90):
    """node-0's gradd_iterations_total of `job` once it reaches
    `at_least`; fails if a trainer ends first or it takes `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        done = _metric(nodes.metrics(0), "gradd_iterations_total", job)
        if done is not None and done >= at_least:
            return done
        ended = [r for r, p in t.procs.items() if p.poll() is not None]
        if ended or time.monotonic() > deadline:
            for r in ended:
                t.wait(r, 1)
            t.kill_all()
            pytest.fail(f"job {job} did not reach iteration {at_least} on node-0 (at {done}; "
                        f"ranks ended: {ended}):\n{t.report()}")
        time.sleep(0.05)


def _reformed_lines(nodes, job):
    return [line for line in nodes.logs().splitlines()
            if f"job '{job}' re-formed" in line]


# ------------------------------------------ the former coordinator's node
def test_node_0_lost_mid_job_and_back(etcd_nodes, job_id, tmp_path):
    """3 nodes, min_nodes 2. node-0 (daemon and trainer) is SIGKILLed
    before step K: on the built-in store it held the job's rendezvous and
    the job would fail; on etcd nodes 1 and 2 abort step K once and go on
    with ranks 1 and 2; node-0 starts again (same node id) and is admitted,
    its trainer syncs the state from a live rank, and all three end with
    equal parameters, those of the recomputation with the ranks each step
    had (not the first two ranks: node-0's data really left)."""
    steps, k = 60, 3
    nodes = etcd_nodes(3)
    require_elastic(nodes, job_id)
    t = Trainers(nodes, job_id, steps, tmp_path, min_nodes=2)
    slow = {"GRADD_TEST_STEP_SLEEP_S": "0.15"}
    for r in range(3):
        t.start(r, **slow, **({"GRADD_TEST_PAUSE_AT_STEP": str(k)} if r == 0 else {}))
    try:
        assert _wait_for(tmp_path / "paused-0", t.procs[0], 60, "pause"), t.report()
        t.kill(0)
        nodes.kill(0)
        time.sleep(2.0)  # nodes 1 and 2 go on without node-0 for a while
        nodes.restart(0)
        t.start(0, **slow)
        _all_succeed(t, range(3), 120)
    finally:
        t.kill_all()
        _keep_logs(nodes, tmp_path)
    res = t.results()
    back = _returned(res, 0)
    assert back["synced_at"] and back["synced_at"][0] > k, back
    for r in (1, 2):
        rep = res[r][0]
        live = _applied_live(rep)
        # 3 nodes, then 2 from step k, then 3 again.
        assert live[:k] == [3] * k and live[k] == 2 and live[-1] == 3, live
        assert set(live) == {2, 3}, live
        aborted = [a for a in rep["attempts"] if "aborted" in a]
        assert len(aborted) == 2, rep["attempts"]  # the loss, the arrival
        assert aborted[0]["step"] == k, rep["attempts"]
        assert rep["final"] == back["final"]
    assert res[1][0]["final"] == res[2][0]["final"]
    # Without node-0 the live ranks were 1 and 2.
    ranks = [[0, 1, 2] if n == 3 else [1, 2] for n in _applied_live(res[1][0])]
    assert _close(back["final"], reference(ranks, 3))
    assert not _close(back["final"], reference(_applied_live(res[1][0]), 3))
    # The survivors say which node left and which came back.
    for i in (1, 2):
        log = nodes.nodes[i].log()
        assert "node 'node-0' lost" in log, log
        assert "node 'node-0' admitted" in log, log


# ------------------------------------------------- an etcd member killed
@pytest.mark.parametrize("victim", ["member0", "leader"])
def test_etcd_member_killed_changes_nothing(etcd_nodes, job_id, tmp_path, victim):
    """3 nodes, min_nodes 2 (so a spurious re-formation would show as an
    aborted step, not as a failure), 3 etcd members. Mid-job one member is
    SIGKILLed and stays dead: member 0 (the endpoint the daemons call
    first) while it is a follower, so the daemons' etcd client must fail
    over; or the leader while it is not member 0, so etcd elects another
    under the daemons' connections. Every step runs on 3 nodes: no aborted
    iteration, no re-formation, no lost node (trainer reports, every
    daemon's counters and log), and the parameters are the recomputation's
    for 3 live ranks throughout. The job outlives the kill by more than a
    lease TTL (3 s), so a keepalive the kill broke would show."""
    steps, kill_at = 60, 8
    nodes = etcd_nodes(3)
    etcd = nodes.etcd
    require_elastic(nodes, job_id)
    # Leadership where the case wants it, before the job starts.
    if etcd.leader() == 0:
        etcd.move_leader(1)
    leader = etcd.leader()
    target = 0 if victim == "member0" else leader
    assert leader != 0 and (target == 0) == (victim == "member0"), (victim, leader)
    before = _fault_counts(nodes)
    t = Trainers(nodes, job_id, steps, tmp_path, min_nodes=2)
    for r in range(3):
        t.start(r, GRADD_TEST_STEP_SLEEP_S="0.1")
    try:
        done = _wait_iterations(nodes, job_id, kill_at, t)
        etcd.kill(target)
        running = [r for r, p in t.procs.items() if p.poll() is None]
        killed_at = time.monotonic()
        _all_succeed(t, range(3), 120)
        after_kill = time.monotonic() - killed_at
    finally:
        t.kill_all()
        _keep_logs(nodes, tmp_path)
    assert running == [0, 1, 2] and done < steps, (running, done)
    assert after_kill > 3.0, after_kill  # the job outlived a lease TTL
    assert not etcd.alive(target)
    res = {r: v[0] for r, v in t.results().items()}
    assert sorted(res) == [0, 1, 2], res.keys()
    for r, rep in res.items():
        assert not [a for a in rep["attempts"] if "aborted" in a], (r, rep["attempts"])
        assert _applied_live(rep) == [3] * steps, (r, rep["attempts"])
        assert len({a["epoch"] for a in rep["attempts"]}) == 1, (r, rep["attempts"])
        assert rep["synced_at"] == [], (r, rep)
        assert rep["final"] == res[0]["final"], r
    assert _close(res[0]["final"], reference([3] * steps, 3))
    assert all(n.proc.poll() is None for n in nodes.nodes), nodes.logs()
    assert _fault_counts(nodes) == before, (before, nodes.logs())
    assert not _reformed_lines(nodes, job_id), _reformed_lines(nodes, job_id)


# ---------------------------------------------------- etcd down, then back
def test_etcd_down_then_back(etcd_nodes, job_id, tmp_path):
    """2 nodes (formation_timeout_ms 8000), an elastic job (min_nodes 1) running;
    every etcd member is SIGKILLed mid-job. The running job needs no store
    to go on: both trainers complete every step on 2 nodes, no aborted
    iteration, parameters of the recomputation (and no node decides the
    other is lost because etcd went quiet). A 2-node job attached while
    etcd is down fails on both nodes within the formation timeout (not a hang,
    not the client's attach timeout) with an error naming the etcd
    endpoints. After restart_all() a new 2-node job forms and completes on
    the same daemons."""
    steps, kill_at, join_timeout_s = 60, 5, 8
    nodes = etcd_nodes(2, formation_timeout_ms=join_timeout_s * 1000)
    etcd = nodes.etcd
    require_elastic(nodes, job_id)
    (tmp_path / "running").mkdir()
    t = Trainers(nodes, job_id, steps, tmp_path / "running", min_nodes=1)
    for r in range(2):
        t.start(r, GRADD_TEST_STEP_SLEEP_S="0.15")
    errors, elapsed = {}, {}

    def attach(i):
        started = time.monotonic()
        try:
            c = gradd.attach([("w", (4,), "float32")], socket=nodes.nodes[i].socket,
                             job_id=job_id + "-while-down", node_rank=i, num_nodes=2,
                             coordinator=nodes.coordinator, world_size=2, rank=i,
                             attach_timeout=60)
            c.detach()
            errors[i] = None
        except gradd.GraddError as e:
            errors[i] = f"{type(e).__name__}: {e}"
        elapsed[i] = time.monotonic() - started

    try:
        done = _wait_iterations(nodes, job_id, kill_at, t)
        etcd.kill_all()
        running = [r for r, p in t.procs.items() if p.poll() is None]
        # A new job while etcd is down (the first one still runs).
        threads = [threading.Thread(target=attach, args=(i,), daemon=True) for i in (0, 1)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(90)
        hung = [th.is_alive() for th in threads]
        _all_succeed(t, range(2), 120)
    finally:
        t.kill_all()
        _keep_logs(nodes, tmp_path)
    assert running == [0, 1] and done < steps, (running, done)
    res = {r: v[0] for r, v in t.results().items()}
    assert sorted(res) == [0, 1], res.keys()
    for r, rep in res.items():
        assert not [a for a in rep["attempts"] if "aborted" in a], (r, rep["attempts"])
        assert _applied_live(rep) == [2] * steps, (r, rep["attempts"])
        assert rep["final"] == res[0]["final"], r
    assert _close(res[0]["final"], reference([2] * steps, 2))

    assert hung == [False, False], "an attach hung while etcd was down"
    named = "etcd " + ",".join(etcd.endpoints)
    for i in (0, 1):
        assert errors[i] is not None, f"node {i}: a job formed with etcd down"
        assert named in errors[i], (i, errors[i])
        assert elapsed[i] < join_timeout_s + 4, (i, elapsed[i], errors[i])

    # etcd back: a new job forms on the same daemons and ends.
    etcd.restart_all()
    (tmp_path / "after").mkdir()
    again = Trainers(nodes, job_id + "-after", 10, tmp_path / "after", min_nodes=1)
    for r in range(2):
        again.start(r)
    try:
        _all_succeed(again, range(2), 120)
    finally:
        again.kill_all()
        _keep_logs(nodes, tmp_path)
    res = {r: v[0] for r, v in again.results().items()}
    assert sorted(res) == [0, 1], res.keys()
    assert res[0]["final"] == res[1]["final"]
    assert _applied_live(res[0]) == [2] * 10, res[0]["attempts"]
    assert _close(res[0]["final"], reference([2] * 10, 2))
    assert all(n.proc.poll() is None for n in nodes.nodes), nodes.logs()


# ------------------------------------------------ ended jobs leave nothing
def test_ended_jobs_leave_no_key_in_etcd(etcd_nodes, job_id, tmp_path):
    """Two jobs on 2 nodes end normally, one elastic (min_nodes 1) and one
    not: once their trainers are gone, nothing is left under the nodes'
    prefix in etcd (the daemons' liveness keys go with the elastic job, its
    shared keys with its last node, the other job's rounds when both nodes
    released them)."""
    nodes = etcd_nodes(2)
    jobs_prefix = nodes.prefix + "jobs/"
    # The listing sees a key there (so an empty one below means something).
    control = base64.b64encode((jobs_prefix + "control").encode()).decode()
    nodes.etcd._request(0, "/v3/kv/put", {"key": control, "value": ""})
    assert nodes.etcd.keys(jobs_prefix) == [jobs_prefix + "control"]
    nodes.etcd._request(0, "/v3/kv/deleterange", {"key": control})
    try:
        for name, min_nodes in (("elastic", 1), ("plain", 0)):
            (tmp_path / name).mkdir()
            t = Trainers(nodes, f"{job_id}-{name}", 4, tmp_path / name, min_nodes=min_nodes)
            for r in range(2):
                t.start(r)
            _all_succeed(t, range(2), 90)
        left = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            left = nodes.etcd.keys(jobs_prefix)
            if not left:
                break
            time.sleep(0.2)
    finally:
        _keep_logs(nodes, tmp_path)
    assert left == [], left
