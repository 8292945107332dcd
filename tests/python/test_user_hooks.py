"""Communication hooks that gradd runs in the trainer (gradd/_trainer_hooks.py):
every hook torch accepts other than the daemon's own. Parity: torch's DDP
(Gloo) and gradd.torch with the same hook, 2 ranks, a real daemon, per-step
gradients and parameters compared (tests/python/user_hook_worker.py); the
same under join() with uneven inputs (tests/python/hook_join_worker.py).
Which group the hook's collectives use (gradd/_hook_group.py) is checked by
counting the collectives gradd's steps issue on the Gloo default group (its
sequence number) and by asking the daemon for the job's trainer-hooks job.
In-process: which path a hook takes, and the errors."""
import json
import logging
import types

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import (
    debugging_hooks,
    default_hooks,
    post_localSGD_hook,
    powerSGD_hook,
)
from torch.distributed.algorithms.join import Join

import gradd.distributed
import models
from conftest import graddctl, run_workers
from gradd import _hook_group
from gradd.torch import DistributedDataParallel as DDP

STEPS = 5
TOL = 1e-5

needs_backend = pytest.mark.skipif(
    not gradd.distributed.available(),
    reason="gradd._c10d not built (libtorch-dev missing): hooks use the user's groups",
)


def run(daemon, job_id, tmp_path, hook, world=2, steps=STEPS, env=None):
    outs = run_workers(
        "user_hook_worker.py", world, [hook, str(tmp_path / "gloo"), str(steps)],
        {"GRADD_SOCKET": daemon.socket, "GRADD_JOB": job_id, **(env or {})}, timeout=150,
    )
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def check(results, steps=STEPS, tol=TOL, same_params=True, over_gradd=None):
    """Per-step parity; `over_gradd` True: gradd's steps issued no collective
    on the Gloo group (the hook's went through the job's gradd group); False:
    they did (the hook used the Gloo group)."""
    for r in results:
        if over_gradd is True:
            assert r["gloo_ops"] == 0, r["gloo_ops"]
        elif over_gradd is False:
            assert r["gloo_ops"] > 0, r["gloo_ops"]
        assert r["num_buckets"] > 1, r
        assert r["daemon_hook"].startswith("trainer:"), r["daemon_hook"]
        assert len(r["per_step"]) == steps
        for step, (grad_err, param_err) in enumerate(r["per_step"]):
            assert grad_err <= tol, f"rank {r['rank']} step {step}: grads differ by {grad_err}"
            assert param_err <= tol, f"rank {r['rank']} step {step}: params differ by {param_err}"
    if same_params:
        assert all(r["param0"] == results[0]["param0"] for r in results)


@pytest.mark.parametrize("hook", ["user_then", "unused_then", "static_then", "fused_sgd",
                                  "quant_pertensor", "quant_perchannel"])
def test_trainer_hook_matches_torch(daemon, job_id, tmp_path, hook):
    # State None (torch's default group, the DDP's): the job's gradd group.
    check(run(daemon, job_id, tmp_path, hook), over_gradd=gradd.distributed.available())


def test_noop_hook_leaves_local_gradients(daemon, job_id, tmp_path):
    results = run(daemon, job_id, tmp_path, "noop")
    check(results, same_params=False)
    # No communication: the ranks' models drift apart, as with torch.
    assert results[0]["param0"] != results[1]["param0"]


@pytest.mark.parametrize("hook", ["post_localsgd", "post_localsgd_noallreduce"])
def test_post_local_sgd_matches_torch(daemon, job_id, tmp_path, hook):
    # 5 steps: global allreduce for 2, then local SGD with the model
    # averaged every 2nd step (PeriodicModelAverager, after steps 3 and 5),
    # so the ranks end equal.
    # The global phase's group (None) is the DDP's: gradd's; the subgroups
    # (one rank each) stay the user's.
    check(run(daemon, job_id, tmp_path, hook, steps=5), steps=5,
          over_gradd=gradd.distributed.available())


def test_bucket_api_matches_torch(daemon, job_id, tmp_path):
    """A hook that records index(), is_last(), parameters(), gradients()
    and buffer() sees torch's layout and torch's values."""
    results = run(daemon, job_id, tmp_path, "record")
    # Its state is a recorder, and the hook passes None to the allreduce
    # itself: torch's default group, the Gloo one.
    check(results, over_gradd=False)
    for r in results:
        torch_calls, ours = r["recorded"]
        assert len(ours) == len(torch_calls) > STEPS
        for a, b in zip(torch_calls, ours):
            for key in ("index", "is_last", "params", "shapes", "numel", "grads_alias_buffer",
                        "grads_ok"):
                assert a[key] == b[key], (key, a, b)
            assert abs(a["sum"] - b["sum"]) <= 1e-5 * max(1.0, abs(a["sum"])), (a, b)
        assert all(c["grads_alias_buffer"] and c["grads_ok"] for c in ours)
        # torch's first iteration: one bucket; then the rebuilt ones.
        assert ours[0]["index"] == 0 and ours[0]["is_last"] and ours[1]["index"] == 0


@needs_backend
@pytest.mark.parametrize("hook", ["group_none", "group_pg"])
def test_user_hook_runs_over_the_job_group(daemon, job_id, tmp_path, hook):
    """State None / the DDP's process group: the hook gets the job's gradd
    group (same ranks, get_rank and get_backend answer), its collectives go
    through the daemon's <job>/trainer-hooks job, none over Gloo; values as
    torch's over Gloo."""
    results = run(daemon, job_id, tmp_path, hook, env={"GRADDCTL_BINARY": graddctl()})
    check(results, over_gradd=True)
    for r in results:
        assert r["seen"] == ["HookProcessGroup/gradd/rank_ok=True"], r["seen"]
    job = results[0]["hooks_job"]
    assert job["state"] == "JOB_STATE_RUNNING" and job["live"] == 2, job
    assert job["pids"] == sorted(r["pid"] for r in results), job


@needs_backend
def test_wrapped_powersgd_state_gets_the_job_group(daemon, job_id, tmp_path):
    """A PowerSGDState over the default group: the hook reads
    state.process_group as the gradd group, its own writes (state.iter) land
    on the user's object, whose process_group stays None."""
    results = run(daemon, job_id, tmp_path, "powersgd_wrapped")
    check(results, over_gradd=True)
    for r in results:
        assert r["seen"] == ["HookProcessGroup/gradd/rank_ok=True"], r["seen"]
        ref_state, our_state = r["states"]
        assert our_state == ref_state == {"iter": STEPS, "process_group_is_none": True}, r


def test_user_hook_falls_back_to_the_users_group(daemon, job_id, tmp_path):
    """Without gradd._c10d the hook gets its state unchanged (None: the Gloo
    default group); no trainer-hooks job is created."""
    results = run(daemon, job_id, tmp_path, "group_fallback",
                  env={"GRADDCTL_BINARY": graddctl()})
    check(results, over_gradd=False)
    for r in results:
        assert r["seen"] == ["None"], r["seen"]
    assert "no job" in results[0]["hooks_job"]["error"], results[0]["hooks_job"]


# ------------------------------------------------------------------ join
def run_join(daemon, job_id, tmp_path, model, api, throw, path, batches):
    outs = run_workers(
        "hook_join_worker.py", 2,
        [model, str(tmp_path / "gloo"), api, str(throw), path, batches],
        {"GRADD_SOCKET": daemon.socket, "GRADD_JOB": job_id}, timeout=150,
    )
    return sorted((json.loads(o.strip().splitlines()[-1]) for o in outs),
                  key=lambda r: r["rank"])


@pytest.mark.parametrize("model,api,path,batches", [
    ("mlp", "method", "gradd", "3,5"),
    ("cnn_bn", "generic", "gradd", "1,4"),  # buffers; rank 0 joins before the rebuild
    ("mlp", "method", "fallback", "3,5"),
])
def test_join_with_user_hook_matches_torch(daemon, job_id, tmp_path, model, api, path,
                                           batches):
    """Uneven inputs with a user allreduce hook: rank 0 runs out first and
    runs the hook on zero buckets while rank 1 trains (torch's join with a
    comm hook); every step, and the final model (rank 1's), as torch's DDP
    + join over Gloo."""
    if path == "gradd" and not gradd.distributed.available():
        pytest.skip("gradd._c10d not built")
    results = run_join(daemon, job_id, tmp_path, model, api, 0, path, batches)
    for r in results:
        ref_steps, our_steps = r["steps"]
        assert our_steps == ref_steps == r["batches"], r
        assert r["errors"] == [None, None], r
        assert len(r["per_step"]) == our_steps
        for step, err in enumerate(r["per_step"]):
            assert err <= TOL, f"rank {r['rank']} step {step}: relative error {err}"
        assert r["final_err"] <= TOL, r
        assert r["authoritative"] == 1, r  # the last to join
        assert r["num_buckets"] > 1 and r["hook"].startswith("trainer:"), r
        assert not r["join_enabled_after"], r
        if path == "gradd":
            assert r["gloo_ops"] == 0, r  # join steps and hooks through gradd
        else:
            assert r["gloo_ops"] > 0, r
    assert results[0]["checksum"] == results[1]["checksum"]


def test_join_with_user_hook_throw_on_early_termination(daemon, job_id, tmp_path):
    path = "gradd" if gradd.distributed.available() else "fallback"
    results = run_join(daemon, job_id, tmp_path, "mlp", "generic", 1, path, "3,5")
    for r in results:
        assert r["steps"] == [3, 3], r
        ref_error, our_error = r["errors"]
        for err in (ref_error, our_error):
            if r["rank"] == 0:
                assert err.startswith("Rank 0 exhausted all inputs."), err
            else:
                assert err.startswith("Detected at least one rank that exhausted inputs."), err
        assert all(e <= TOL for e in r["per_step"]), r
        assert not r["join_enabled_after"], r


# ------------------------------------------------------------ in-process
def make(daemon, job_id, **kw):
    torch.manual_seed(0)
    return DDP(models.mlp(), socket=daemon.socket, job_id=job_id, rank=0, world_size=1,
               local_rank=0, local_world_size=1, bucket_cap_mb=0.02,
               first_bucket_cap_mb=0.02, **kw)


def step(ddp, seed=0):
    torch.manual_seed(seed)
    ddp(torch.randn(4, 32)).sum().backward()


@pytest.mark.parametrize("register,name", [
    (lambda d: d.register_comm_hook(None, default_hooks.allreduce_hook), "allreduce"),
    (lambda d: d.register_comm_hook(None, default_hooks.fp16_compress_hook), "fp16_compress"),
    (lambda d: d._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE), "allreduce"),
    (lambda d: d._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS),
     "fp16_compress"),
])
def test_torch_builtin_hooks_stay_in_the_daemon(daemon, job_id, register, name):
    ddp = make(daemon, job_id)
    register(ddp)
    assert ddp._hooks.registered == name
    assert ddp._reducer.comm is ddp.client  # the daemon reduces the buckets
    step(ddp)
    assert ddp.client.iteration == 2  # the daemon ran the iteration
    ddp.shutdown()


def test_noop_hook_runs_in_the_trainer_without_the_daemon(daemon, job_id):
    ddp = make(daemon, job_id)
    local = models.mlp()
    local.load_state_dict(ddp.module.state_dict())
    calls = []

    def hook(state, bucket):
        calls[-1].append((bucket.index(), bucket.is_last(), bucket.buffer().numel()))
        return debugging_hooks.noop_hook(state, bucket)

    ddp.register_comm_hook(None, hook)
    for it in range(3):
        calls.append([])
        for m in (ddp, local):
            m.zero_grad()
            step(m, seed=it)
        for p, q in zip(ddp.module.parameters(), local.parameters()):
            assert torch.equal(p.grad, q.grad)
    total = sum(p.numel() for p in local.parameters())
    # torch's layout: one bucket first, then rebuilt from the ready order.
    assert calls[0] == [(0, True, total)]
    for it_calls in calls[1:]:
        assert len(it_calls) > 1
        assert [c[0] for c in it_calls] == list(range(len(it_calls)))
        assert [c[1] for c in it_calls] == [False] * (len(it_calls) - 1) + [True]
        assert sum(c[2] for c in it_calls) == total
    assert ddp.client.iteration == 1  # the daemon took no part in backward
    assert not ddp.client.has_rebuilt_buckets
    ddp.shutdown()


def test_hook_result_is_what_grad_gets(daemon, job_id):
    """The future's value is copied into the bucket and so into .grad."""
    ddp = make(daemon, job_id)

    def times_three(state, bucket):
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer() * 3)  # a new tensor, not the buffer
        return fut.then(lambda f: f.value() + 1)

    ddp.register_comm_hook(None, times_three)
    local = models.mlp()
    local.load_state_dict(ddp.module.state_dict())
    step(ddp)
    step(local)
    for p, q in zip(ddp.module.parameters(), local.parameters()):
        torch.testing.assert_close(p.grad, q.grad * 3 + 1)
    ddp.shutdown()


def test_hook_that_raises_fails_clearly(daemon, job_id):
    ddp = make(daemon, job_id)

    def broken_hook(state, bucket):
        raise ValueError("boom in my hook")

    ddp.register_comm_hook(None, broken_hook)
    with pytest.raises(RuntimeError) as e:
        step(ddp)
    msg = str(e.value)
    assert "broken_hook" in msg and "boom in my hook" in msg and "bucket 0" in msg
    with pytest.raises(RuntimeError, match="failed earlier"):
        step(ddp)
    ddp.shutdown()


def test_future_that_fails_and_wrong_results(daemon, job_id):
    def failing(state, bucket):
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())

        def bad(f):
            raise KeyError("late failure")
        return fut.then(bad)

    ddp = make(daemon, job_id + "-a")
    ddp.register_comm_hook(None, failing)
    with pytest.raises(RuntimeError, match="future of communication hook.*late failure"):
        step(ddp)
    ddp.shutdown()

    ddp = make(daemon, job_id + "-b")
    ddp.register_comm_hook(None, lambda s, b: b.buffer())
    with pytest.raises(RuntimeError, match="must return a torch.futures.Future"):
        step(ddp)
    ddp.shutdown()

    def short(state, bucket):
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer()[:1])
        return fut

    ddp = make(daemon, job_id + "-c")
    ddp.register_comm_hook(None, short)
    with pytest.raises(RuntimeError, match="tensor of the bucket's"):
        step(ddp)
    ddp.shutdown()


def wrapped_allreduce(state, bucket):  # not torch's: runs in the trainer
    return default_hooks.allreduce_hook(state, bucket)


@needs_backend
def test_hook_without_process_group_runs_over_the_job_group(daemon, job_id, caplog):
    """No torch.distributed at all: state None is the job's gradd group."""
    if dist.is_initialized():
        pytest.skip("this process has a default process group")
    ddp = make(daemon, job_id)
    local = models.mlp()
    local.load_state_dict(ddp.module.state_dict())
    with caplog.at_level(logging.INFO, logger="gradd.torch"):
        ddp.register_comm_hook(None, wrapped_allreduce)
    assert "over the job's gradd collectives" in caplog.text, caplog.text
    assert f"'{job_id}/trainer-hooks'" in caplog.text
    for seed in range(2):
        ddp.zero_grad()
        local.zero_grad()
        step(ddp, seed)
        step(local, seed)
        for p, q in zip(ddp.module.parameters(), local.parameters()):
            torch.testing.assert_close(p.grad, q.grad)  # a world of one
    assert ddp._reducer.comm.job_group.created
    assert ddp.client.iteration == 1  # the daemon's buckets took no part
    ddp.shutdown()
    assert not ddp._reducer.comm.job_group.created  # closed with the model


def test_hook_without_process_group_says_so(daemon, job_id, caplog, monkeypatch):
    if dist.is_initialized():
        pytest.skip("this process has a default process group")
    monkeypatch.setattr(gradd.distributed, "_c10d", None)  # as if not built
    ddp = make(daemon, job_id)
    with caplog.at_level(logging.INFO, logger="gradd.torch"):
        ddp.register_comm_hook(None, wrapped_allreduce)
    assert "gradd._c10d (the torch.distributed backend 'gradd') is not built" in caplog.text
    assert ddp._reducer.comm.job_group is None
    with pytest.raises(RuntimeError, match="init_process_group"):
        step(ddp)
    ddp.shutdown()


class _FakeJobGroup:
    def __init__(self):
        self.group = object()

    def get(self):
        return self.group


def test_hook_state_substitution_rules():
    """Which states stand for the DDP's ranks (gradd/_hook_group.py), and a
    state object's view: process_group reads as the gradd group while the
    user's attribute holds the replaced one; writes go to the user's
    object; isinstance sees the user's class."""
    job = _FakeJobGroup()
    # The DDP's placement (gradd._world.World's fields the rules read).
    ddp = types.SimpleNamespace(is_subgroup=False, group=None, world_size=2,
                                job_id="j", rank=0)
    passed, _ = _hook_group.hook_state(ddp, None, job)
    assert _hook_group.resolve(passed) is job.group
    # No gradd group (not built, CUDA): the user's state itself.
    assert _hook_group.hook_state(ddp, None, None)[0] is None

    state = powerSGD_hook.PowerSGDState(process_group=None, start_powerSGD_iter=2)
    view, _ = _hook_group.hook_state(ddp, state, job)
    assert isinstance(view, powerSGD_hook.PowerSGDState)
    assert view.process_group is job.group
    assert view.matrix_approximation_rank == state.matrix_approximation_rank
    view.iter += 3  # the hook's own writes land on the user's object
    assert state.iter == 3 and state.process_group is None
    other = object()
    state.process_group = other  # the user changed it: no longer replaced
    assert view.process_group is other

    local = post_localSGD_hook.PostLocalSGDState(process_group=None, subgroup="sub",
                                                 start_localSGD_iter=1)
    view, _ = _hook_group.hook_state(ddp, local, job)
    assert view.process_group is job.group and view.subgroup == "sub"

    # A DDP over a subgroup: None means the whole world in torch's hooks.
    sub = types.SimpleNamespace(is_subgroup=True, group=dist.ProcessGroup(0, 2),
                                world_size=2, job_id="j", rank=0)
    assert _hook_group.hook_state(sub, None, job)[0] is None
    another = dist.ProcessGroup(0, 2)  # another group: as it is
    assert _hook_group.hook_state(sub, another, job)[0] is another
    assert _hook_group.resolve(_hook_group.hook_state(sub, sub.group, job)[0]) \
        is job.group
    # A state that is not a group and carries none: as it is.
    plain = {"k": 1}
    assert _hook_group.hook_state(ddp, plain, job)[0] is plain


def test_registration_rules(daemon, job_id):
    ddp = make(daemon, job_id)

    def bad_annotation(state, bucket: int):
        return debugging_hooks.noop_hook(state, bucket)

    with pytest.raises(ValueError, match="bucket annotation should be dist.GradBucket"):
        ddp.register_comm_hook(None, bad_annotation)

    def bad_return(state, bucket) -> int:
        return debugging_hooks.noop_hook(state, bucket)

    with pytest.raises(ValueError, match="return annotation should be"):
        ddp.register_comm_hook(None, bad_return)
    ddp.register_comm_hook(None, debugging_hooks.noop_hook)
    with pytest.raises(RuntimeError, match="can only be called once"):
        ddp.register_comm_hook(None, debugging_hooks.noop_hook)
    with pytest.raises(RuntimeError, match="can only be called once"):
        ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    step(ddp)
    ddp.shutdown()

    late = make(daemon, job_id + "-late")
    step(late)
    with pytest.raises(RuntimeError, match="before the first backward"):
        late.register_comm_hook(None, debugging_hooks.noop_hook)
    late.shutdown()


def test_join_with_trainer_hook_one_rank(daemon, job_id):
    """join() with a trainer-side hook, a world of one: a step, then the
    join finds nobody active and names this rank authoritative."""
    if not gradd.distributed.available() and not dist.is_initialized():
        pytest.skip("needs gradd._c10d or a torch.distributed group")
    ddp = make(daemon, job_id)
    ddp.register_comm_hook(None, wrapped_allreduce)
    with ddp.join():
        step(ddp)
    assert ddp._authoritative_rank == 0
    assert not ddp._join_config.enable
    ddp.shutdown()


def test_join_with_trainer_hook_must_be_alone(daemon, job_id):
    first = make(daemon, job_id + "-a")
    second = make(daemon, job_id + "-b")
    second.register_comm_hook(None, debugging_hooks.noop_hook)
    with pytest.raises(NotImplementedError, match="only joinable of its join context"):
        with Join([first, second]):
            step(first)
            step(second)
    first.shutdown()
    second.shutdown()
