"""Communication hooks that gradd runs in the trainer (gradd/_trainer_hooks.py):
every hook torch accepts other than the daemon's own. Parity: torch's DDP
(Gloo) and gradd.torch with the same hook, 2 ranks, a real daemon, per-step
gradients and parameters compared (tests/python/user_hook_worker.py).
In-process: which path a hook takes, and the errors."""
import json

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, debugging_hooks

import models
from conftest import run_workers
from gradd.torch import DistributedDataParallel as DDP

STEPS = 5
TOL = 1e-5


def run(daemon, job_id, tmp_path, hook, world=2, steps=STEPS):
    outs = run_workers(
        "user_hook_worker.py", world, [hook, str(tmp_path / "gloo"), str(steps)],
        {"GRADD_SOCKET": daemon.socket, "GRADD_JOB": job_id}, timeout=150,
    )
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def check(results, steps=STEPS, tol=TOL, same_params=True):
    for r in results:
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
    check(run(daemon, job_id, tmp_path, hook))


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
    check(run(daemon, job_id, tmp_path, hook, steps=5), steps=5)


def test_bucket_api_matches_torch(daemon, job_id, tmp_path):
    """A hook that records index(), is_last(), parameters(), gradients()
    and buffer() sees torch's layout and torch's values."""
    results = run(daemon, job_id, tmp_path, "record")
    check(results)
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
    assert ddp._gradd_comm_hook == name
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


def test_hook_without_process_group_says_so(daemon, job_id):
    if dist.is_initialized():
        pytest.skip("this process has a default process group")
    ddp = make(daemon, job_id)

    def wrapped_allreduce(state, bucket):  # not torch's: runs in the trainer
        return default_hooks.allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, wrapped_allreduce)
    with pytest.raises(RuntimeError, match="init_process_group"):
        step(ddp)
    ddp.shutdown()


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


def test_join_with_trainer_hook_is_refused(daemon, job_id):
    ddp = make(daemon, job_id)
    ddp.register_comm_hook(None, debugging_hooks.noop_hook)
    with pytest.raises(NotImplementedError, match="join"):
        with ddp.join():
            step(ddp)
    ddp.shutdown()
