"""Rank restart in gradd.torch (issue 23): the option, the error class, and
real trainer processes SIGKILLed mid-iteration and started again.

The end-to-end tests need the client library and daemon of rank restart
(branches i23-client, i23-daemon); on a build without them they skip, saying
so (the probe: a job attached with a grace reports it back).
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
import gradd._C
import gradd.torch
from trainer_procs import TrainerProcs
from conftest import HERE, rank_threads

WORKER = os.path.join(HERE, "restart_worker.py")

# gradd.torch's deprecated names (docs/deprecations.md) are tested by
# test_torch_renames.py only; here their FutureWarning fails the test.
pytestmark = pytest.mark.filterwarnings(
    r"error:gradd\.torch\.DistributedDataParallel.*is deprecated:FutureWarning")


# ------------------------------------------------------------------ option
@pytest.fixture
def clean_env(monkeypatch):
    for var in ("GRADD_JOB", "GRADD_RANK_RESTART_GRACE_MS", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_USE_AGENT_STORE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("GRADD_SOCKET", "/nonexistent/gradd.sock")
    return monkeypatch


def test_grace_without_explicit_job_id_is_refused(clean_env):
    with pytest.raises(ValueError, match=r"rank_restart_grace_ms=5000 needs an explicit job id"):
        gradd.torch.DistributedDataParallel(nn.Linear(3, 2), rank_restart_grace_ms=5000)


def test_grace_from_environment_without_job_id_is_refused(clean_env):
    clean_env.setenv("GRADD_RANK_RESTART_GRACE_MS", "2500")
    with pytest.raises(ValueError, match=r"job_id= or \$GRADD_JOB"):
        gradd.torch.DistributedDataParallel(nn.Linear(3, 2))


@pytest.mark.parametrize("bad", [-1, 1 << 32])
def test_grace_out_of_range_is_refused(clean_env, bad):
    with pytest.raises(ValueError, match=r"rank_restart_grace_ms= must be in \[0, 2\^32\)"):
        gradd.torch.DistributedDataParallel(nn.Linear(3, 2), job_id="j",
                                            rank_restart_grace_ms=bad)


def test_grace_environment_not_an_integer(clean_env):
    clean_env.setenv("GRADD_RANK_RESTART_GRACE_MS", "soon")
    with pytest.raises(ValueError, match="GRADD_RANK_RESTART_GRACE_MS='soon' is not an integer"):
        gradd.torch.DistributedDataParallel(nn.Linear(3, 2), job_id="j")


def test_explicit_job_id_passes_the_check(clean_env):
    # Past the check, construction goes on to attach: the socket does not
    # exist, so the error is the connection's, not the ValueError.
    clean_env.setenv("GRADD_JOB", "restart-job")
    with pytest.raises(gradd.GraddError) as info:
        gradd.torch.DistributedDataParallel(nn.Linear(3, 2), rank_restart_grace_ms=5000,
                                            connect_timeout=0.2)
    assert not isinstance(info.value, ValueError)


def test_grace_zero_needs_no_job_id(clean_env):
    with pytest.raises(gradd.GraddError) as info:
        gradd.torch.DistributedDataParallel(nn.Linear(3, 2), rank_restart_grace_ms=0,
                                            job_id=None, world_size=1, rank=0,
                                            connect_timeout=0.2)
    assert not isinstance(info.value, ValueError)


# ------------------------------------------------------------ error class
def test_iteration_aborted_status_raises_iteration_aborted_error():
    with pytest.raises(gradd.IterationAbortedError) as info:
        gradd._C._raise_status("ABORTED", "iteration 4 of job 'j' aborted", True)
    e = info.value
    assert isinstance(e, gradd.AbortedError)
    assert isinstance(e, gradd.GraddError) and isinstance(e, RuntimeError)
    assert e.code == "ABORTED"
    assert str(e) == "iteration 4 of job 'j' aborted"
    assert type(e).__name__ == "IterationAbortedError"
    assert gradd.IterationAbortedError is gradd._C.IterationAbortedError
    assert gradd.torch.IterationAbortedError is gradd.IterationAbortedError
    assert "IterationAbortedError" in gradd.__all__


def test_other_errors_are_unchanged():
    with pytest.raises(gradd.AbortedError) as info:
        gradd._C._raise_status("ABORTED", "rank 1 failed", False)
    assert not isinstance(info.value, gradd.IterationAbortedError)
    assert info.value.code == "ABORTED"
    # The payload only marks ABORTED statuses.
    with pytest.raises(gradd.UnavailableError) as info:
        gradd._C._raise_status("UNAVAILABLE", "gone", True)
    assert not isinstance(info.value, gradd.AbortedError)
    with pytest.raises(gradd.InvalidArgumentError) as info:
        gradd._C._raise_status("INVALID_ARGUMENT", "bad", False)
    assert isinstance(info.value, ValueError)


class _AbortOnce:
    """The DDP's comm, whose wait_all completes the real iteration and then
    reports it aborted once (what the client library does when a rank of
    the job restarted): tests the reducer's abort path through the autograd
    engine without a restart."""

    def __init__(self, client):
        self._client = client
        self.armed = True

    def wait_all(self, stream=0):
        self._client.wait_all(stream)
        if self.armed:
            self.armed = False
            gradd._C._raise_status(
                "ABORTED", "iteration aborted: local rank 1 restarted; skip the optimizer "
                "step and retry the batch", True)

    def __getattr__(self, name):
        return getattr(self._client, name)


def test_aborted_backward_raises_through_autograd_and_retries(daemon, job_id, monkeypatch):
    for var in ("GRADD_RANK_RESTART_GRACE_MS", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
    ddp = gradd.torch.DistributedDataParallel(model, socket=daemon.socket, job_id=job_id,
                                              rank=0, world_size=1)
    try:
        comm = _AbortOnce(ddp._reducer.comm)
        ddp._reducer.comm = comm
        x = torch.randn(5, 6)
        assert ddp.should_commit()
        with pytest.raises(gradd.IterationAbortedError, match="retry the batch"):
            ddp(x).sum().backward()
        # Not a failure: the next forward works, should_commit until then False.
        assert not ddp.should_commit()
        assert ddp._failure is None
        assert not ddp._reducer.backward_in_progress
        for p in model.parameters():
            p.grad = None
        ddp(x).sum().backward()
        assert ddp.should_commit()
        expected = [torch.autograd.grad(model(x).sum(), p)[0] for p in model.parameters()]
        for p, g in zip(model.parameters(), expected):
            assert torch.allclose(p.grad, g)
        assert not ddp.restarted and ddp.restart_iteration is None
        assert ddp.iterations_aborted == 0  # the client's count; none really aborted
    finally:
        ddp.shutdown()


class _SyncDue:
    """A client proxy on which one state sync is due, rooted at rank 0
    (what the client library reports after a restart); broadcasts go to the
    real client. Tests gradd.torch's half of the sync (what is sent, who
    loads) on a build without rank restart."""

    def __init__(self, client):
        self._client = client
        self.pending = True

    def state_sync_pending(self):
        return self.pending

    def begin_state_sync(self):
        self.pending = False
        return 0

    def __getattr__(self, name):
        return getattr(self._client, name)


def test_state_sync_sends_parameters_buffers_and_registered_states(daemon, job_id):
    """Two ranks as threads; rank 1 plays the restarted one (different
    parameters, buffers, optimizer state and step): after the sync it holds
    rank 0's, loaded through its load_state_dict functions in registration
    order; rank 0 loads nothing."""
    world = 2

    def body(rank):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(5, 7), nn.BatchNorm1d(7), nn.Linear(7, 3))
        ddp = gradd.torch.DistributedDataParallel(
            model, socket=daemon.socket, job_id=job_id, rank=rank, world_size=world,
            local_rank=rank, local_world_size=world)
        try:
            opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
            step = {"step": 0}
            loaded = []
            ddp.register_state(opt.state_dict,
                               lambda sd: (loaded.append("opt"), opt.load_state_dict(sd)))
            ddp.register_state(lambda: dict(step),
                               lambda sd: (loaded.append("step"), step.update(sd)))
            # Diverge: rank 1 is "the restarted one", with a fresh state.
            if rank == 0:
                x = torch.randn(8, 5, generator=torch.Generator().manual_seed(3))
                model(x).sum().backward()
                opt.step()
                step["step"] = 17
            else:
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(1.0)
            ddp._client = _SyncDue(ddp._client)
            ddp._restart.grace_ms = 1000  # as if the job ran with a grace
            ddp._restart.unsynced = rank == 1
            ran = ddp.sync_state()
            again = ddp.sync_state()  # nothing due any more
            return dict(
                ran=ran, again=again, loaded=loaded, step=step["step"],
                params=[p.detach().clone() for p in model.parameters()],
                buffers=[b.detach().clone() for b in model.buffers()],
                momentum=[opt.state[p]["momentum_buffer"].clone()
                          for p in model.parameters() if p in opt.state],
            )
        finally:
            ddp.shutdown()

    results, errors = rank_threads(world, body, timeout=60)
    assert errors == [None, None], errors
    r0, r1 = results
    assert r0["ran"] and r1["ran"] and not r0["again"] and not r1["again"]
    assert r0["loaded"] == [] and r1["loaded"] == ["opt", "step"]
    assert r1["step"] == 17
    for a, b in zip(r0["params"] + r0["buffers"], r1["params"] + r1["buffers"]):
        assert torch.equal(a, b)
    assert len(r0["momentum"]) == len(r1["momentum"]) == 6  # every parameter
    for a, b in zip(r0["momentum"], r1["momentum"]):
        assert torch.equal(a, b)
    # BatchNorm's running stats moved on rank 0 (a forward in train mode):
    # the buffers really came from it.
    assert not torch.equal(r0["buffers"][0], torch.zeros(7))


# ----------------------------------------------------------- end to end
def _rank_restart_supported(socket_path, job_id):
    c = gradd.attach([("w", (4,), "float32")], socket=socket_path, job_id=job_id,
                     rank_restart_grace_ms=1234)
    try:
        return c.rank_restart_grace_ms == 1234
    finally:
        c.detach()


@pytest.fixture
def restart_supported(daemon, job_id):
    if not _rank_restart_supported(daemon.socket, job_id + "-probe"):
        pytest.fail("this build's client library / daemon do not implement rank restart "
                    "(a job attached with rank_restart_grace_ms=1234 reports 0)",
                    pytrace=False)


class _Trainers(TrainerProcs):
    """Worker processes of one job, started and restarted like a
    supervisor would (same RANK / LOCAL_RANK / GRADD_JOB)."""

    def __init__(self, daemon, job_id, world, steps, out_dir, grace_ms):
        self.daemon, self.job_id, self.world = daemon, job_id, world
        self.args = [str(steps), str(out_dir), str(grace_ms)]
        super().__init__(out_dir)

    def start(self, rank, **env):
        base = {"GRADD_SOCKET": self.daemon.socket, "GRADD_JOB": self.job_id}
        base.update(env)
        full = dict(os.environ)
        full.pop("GRADD_RANK_RESTART_GRACE_MS", None)
        full.pop("GRADD_TEST_DIE_AT_STEP", None)
        full.update(base)
        full.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(self.world),
                    LOCAL_WORLD_SIZE=str(self.world), OMP_NUM_THREADS="1",
                    OPENBLAS_NUM_THREADS="1")
        self.procs[rank] = subprocess.Popen(
            [sys.executable, WORKER, *self.args], env=full, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True)
        return self.procs[rank]

    def daemon_logs(self):
        return self.daemon.log()


def _run_uninterrupted(daemon, job_id, world, steps, out_dir, grace_ms):
    t = _Trainers(daemon, job_id, world, steps, out_dir, grace_ms)
    for r in range(world):
        t.start(r)
    deadline = time.monotonic() + 180
    for r in range(world):
        rank, rc, _, _ = t.wait(r, max(1, deadline - time.monotonic()))
        if rc != 0:
            t.kill_all()
            pytest.fail(f"uninterrupted run failed:\n{t.report()}")
    return {r: reps[0] for r, reps in t.results().items()}


def test_sigkilled_rank_restarts_and_the_job_goes_on(daemon, job_id, tmp_path,
                                                     restart_supported):
    """World 3, rank 1 SIGKILLs itself in the backward of step K=3 and is
    started again (same RANK / LOCAL_RANK / GRADD_JOB) within the grace.

    Expected: every rank finishes; the survivors' backward of step K raised
    IterationAbortedError once (should_commit False exactly for that
    attempt) and they retried the same batch; the restarted rank rejoined at
    the survivors' next iteration, started at step K with the parameters
    of the others; and since the aborted step was applied by nobody and
    retried with the same data (data is a function of step and rank), the
    final parameters equal those of an uninterrupted run with the same seed,
    exactly."""
    world, steps, die_at, victim, grace = 3, 8, 3, 1, 30000
    out = tmp_path / "restart"
    out.mkdir()
    t = _Trainers(daemon, job_id, world, steps, out, grace)
    for r in range(world):
        t.start(r, **({"GRADD_TEST_DIE_AT_STEP": str(die_at)} if r == victim else {}))
    try:
        _, rc, _, _ = t.wait(victim, 120)
        assert rc == -signal.SIGKILL, f"the victim did not die by SIGKILL:\n{t.report()}"
        t.start(victim)  # the supervisor: same rank, same job id
        deadline = time.monotonic() + 180
        for r in range(world):
            _, rc, _, _ = t.wait(r, max(1, deadline - time.monotonic()))
            assert rc == 0, f"rank {r} failed:\n{t.report()}"
    finally:
        t.kill_all()
    res = t.results()
    assert sorted(res) == list(range(world)), res.keys()
    assert all(len(v) == 1 for v in res.values())  # the killed one wrote nothing
    res = {r: v[0] for r, v in res.items()}
    back = res[victim]
    survivors = [res[r] for r in range(world) if r != victim]

    # The restarted rank.
    assert back["rejoined"] is True
    assert back["grace"] == grace
    assert isinstance(back["rejoin_iteration"], int) and back["rejoin_iteration"] > die_at
    assert back["synced"]["step"] == die_at
    assert [a["step"] for a in back["attempts"]] == list(range(die_at, steps))
    assert all(a["commit"] for a in back["attempts"])
    # Survivors: one aborted attempt, at step K, retried.
    for s in survivors:
        assert s["rejoined"] is False and s["rejoin_iteration"] is None
        aborted = [a for a in s["attempts"] if "aborted" in a]
        assert len(aborted) == 1, s["attempts"]
        assert aborted[0]["step"] == die_at and aborted[0]["commit"] is False
        assert "retry the batch" in aborted[0]["aborted"]
        # The survivors' next iteration is the one the restarted rank joined at.
        assert aborted[0]["next_iteration"] == back["rejoin_iteration"]
        assert [a["step"] for a in s["attempts"]] == \
            list(range(die_at + 1)) + list(range(die_at, steps))
        assert [a["commit"] for a in s["attempts"]].count(False) == 1
        assert s["iterations_aborted"] == 1
        # After the sync, the restarted rank holds the survivors' parameters.
        assert s["synced"]["step"] == die_at
        assert s["synced"]["params"] == back["synced"]["params"]
    # Every rank ends with the same parameters ...
    for r in range(1, world):
        assert res[r]["final"] == res[0]["final"]
    # ... those of the same training without the restart.
    ref_dir = tmp_path / "reference"
    ref_dir.mkdir()
    ref = _run_uninterrupted(daemon, job_id + "-ref", world, steps, ref_dir, grace)
    assert ref[0]["final"] == res[0]["final"]
    assert all(len(r["attempts"]) == steps for r in ref.values())


def test_rank_not_back_within_grace_fails_the_job_naming_it(daemon, job_id, tmp_path,
                                                           restart_supported):
    """World 2, rank 1 dies at step 2 and is not started again: past the
    grace the survivor's backward fails (an AbortedError that is not an
    IterationAbortedError) with a message naming local rank 1 and the
    grace."""
    world, grace = 2, 1500
    out = tmp_path / "out"
    out.mkdir()
    t = _Trainers(daemon, job_id, world, 6, out, grace)
    t.start(0)
    t.start(1, GRADD_TEST_DIE_AT_STEP="2")
    try:
        _, rc, _, _ = t.wait(1, 120)
        assert rc == -signal.SIGKILL, t.report()
        started = time.monotonic()
        _, rc, _, _ = t.wait(0, 120)
        waited = time.monotonic() - started
    finally:
        t.kill_all()
    assert rc == 3, t.report()
    rep = t.results()[0][0]
    assert rep["error"].startswith("AbortedError: "), rep["error"]
    assert "local rank 1" in rep["error"] and "rank_restart_grace_ms=1500" in rep["error"]
    assert job_id in rep["error"]
    assert waited < 60
