"""Communication hooks run by the daemon (gradd/_comm_hooks.py,
server/hooks/) against torch's DDP (Gloo) with the same hook registered:
same model, seed and per-rank data, different initial weights per rank;
gradients and parameters compared after every step."""
import json

import pytest

from conftest import Daemon, run_workers

STEPS = 6
# Relative to each tensor's largest magnitude. The 16-bit hooks round the
# average to 16 bits; torch rounds each rank's gradient first and sums in
# 16 bits, so results differ by a few 16-bit units in the last place.
TOL = {"allreduce": 1e-5, "fp16": 4e-3, "builtin_fp16": 4e-3, "bf16": 3e-2}


def check(results, hook, steps=STEPS, tol=None):
    tol = TOL[hook] if tol is None else tol
    for r in results:
        assert r["num_buckets"] > 1, r
        assert len(r["per_step"]) == steps
        for step, (grad_err, param_err) in enumerate(r["per_step"]):
            assert grad_err <= tol, f"rank {r['rank']} step {step}: grads differ by {grad_err}"
            assert param_err <= tol, f"rank {r['rank']} step {step}: params differ by {param_err}"
        if hook in ("fp16", "builtin_fp16", "bf16"):
            assert r["grads_16bit"], "gradients were not rounded to 16 bits"
    assert all(r["param0"] == results[0]["param0"] for r in results)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("hook", ["allreduce", "fp16", "bf16"])
def test_16bit_hooks_match_torch(daemon, job_id, tmp_path, hook, world):
    outs = run_workers(
        "comm_hook_worker.py", world, [hook, str(tmp_path / "gloo"), str(STEPS)],
        {"GRADD_SOCKET": daemon.socket, "GRADD_JOB": job_id}, timeout=150,
    )
    check([json.loads(o.strip().splitlines()[-1]) for o in outs], hook)


def test_builtin_fp16_matches_torch(daemon, job_id, tmp_path):
    outs = run_workers(
        "comm_hook_worker.py", 2, ["builtin_fp16", str(tmp_path / "gloo"), str(STEPS)],
        {"GRADD_SOCKET": daemon.socket, "GRADD_JOB": job_id}, timeout=150,
    )
    check([json.loads(o.strip().splitlines()[-1]) for o in outs], "builtin_fp16")


# PowerSGD: (PowerSGDState settings, ranks). start_powerSGD_iter > 1 covers
# the switch from vanilla allreduce to compression.
POWERSGD_CASES = [
    ("powerSGD", dict(matrix_approximation_rank=1, start_powerSGD_iter=2), 2),
    ("powerSGD", dict(matrix_approximation_rank=2, start_powerSGD_iter=3,
                      use_error_feedback=False, warm_start=False, random_seed=7), 3),
    ("powerSGD", dict(matrix_approximation_rank=2, start_powerSGD_iter=2,
                      use_error_feedback=True, warm_start=False,
                      orthogonalization_epsilon=1e-8), 2),
    ("powerSGD", dict(matrix_approximation_rank=1, start_powerSGD_iter=3,
                      use_error_feedback=False, warm_start=True), 2),
    ("batched_powerSGD", dict(matrix_approximation_rank=1, start_powerSGD_iter=2), 2),
    ("batched_powerSGD", dict(matrix_approximation_rank=2, start_powerSGD_iter=2,
                              warm_start=False, random_seed=3), 3),
]
POWERSGD_TOL = 1e-4


@pytest.mark.parametrize("hook,state,world", POWERSGD_CASES,
                         ids=[f"{h}-{i}" for i, (h, _, _) in enumerate(POWERSGD_CASES)])
def test_powersgd_matches_torch(daemon, job_id, tmp_path, hook, state, world):
    outs = run_workers(
        "comm_hook_worker.py", world,
        [hook, str(tmp_path / "gloo"), str(STEPS), json.dumps(state)],
        {"GRADD_SOCKET": daemon.socket, "GRADD_JOB": job_id}, timeout=150,
    )
    check([json.loads(o.strip().splitlines()[-1]) for o in outs], hook, tol=POWERSGD_TOL)


def run_on_cluster(cluster, job_id, args, local_world=2, timeout=150):
    """torchrun-style over conftest's two daemons: 2 x local_world workers,
    node n's ranks on daemon n; returns each rank's result."""
    outs = run_workers(
        "comm_hook_worker.py", 2 * local_world, args, {"GRADD_JOB": job_id},
        timeout=timeout, rank_env=lambda r: cluster.rank_env(r, local_world),
        logs=cluster.logs)
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


# Two nodes x two ranks (torch with four processes): the node's sum goes to
# the network as 16 bits (fp16), as P and Q (PowerSGD).
@pytest.mark.parametrize("hook,state", [
    ("fp16", {}),
    ("powerSGD", dict(matrix_approximation_rank=2, start_powerSGD_iter=2)),
    ("batched_powerSGD", dict(matrix_approximation_rank=1, start_powerSGD_iter=2,
                              warm_start=False)),
])
def test_two_daemons_match_torch(two_daemons, job_id, tmp_path, hook, state):
    results = run_on_cluster(two_daemons, job_id,
                             [hook, str(tmp_path / "gloo"), str(STEPS), json.dumps(state)])
    check(results, hook, tol=TOL.get(hook, POWERSGD_TOL))


# ---------------------------------------------------------------- errors
import threading  # noqa: E402

import torch  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook  # noqa: E402

import gradd  # noqa: E402
from gradd.torch import DistributedDataParallel as DDP  # noqa: E402
from test_client import run_ranks  # noqa: E402
import models  # noqa: E402


def make(rank, world, daemon, job_id):
    torch.manual_seed(rank)
    return DDP(models.mlp(), socket=daemon.socket, job_id=job_id, rank=rank, world_size=world,
               local_rank=rank, local_world_size=world, bucket_cap_mb=0.02,
               first_bucket_cap_mb=0.02)


def step(ddp):
    ddp(torch.randn(4, 32)).sum().backward()


def test_unknown_builtin_hook_names_the_supported_ones(daemon, job_id):
    # Other Python hooks run in the trainer: tests/python/test_user_hooks.py.
    ddp = make(0, 1, daemon, job_id)
    with pytest.raises(NotImplementedError, match="FP16_COMPRESS"):
        ddp._register_builtin_comm_hook("QUANTIZE")
    with pytest.raises(TypeError, match="must be callable"):
        ddp.register_comm_hook(None, 5)
    step(ddp)  # still the plain average
    ddp.shutdown()


def test_register_twice_and_after_first_backward(daemon, job_id):
    ddp = make(0, 1, daemon, job_id)
    ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    with pytest.raises(RuntimeError, match="can only be called once"):
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    with pytest.raises(RuntimeError, match="can only be called once"):
        ddp._register_builtin_comm_hook(torch.distributed.BuiltinCommHookType.ALLREDUCE)
    step(ddp)
    ddp.shutdown()

    late = make(0, 1, daemon, job_id + "-late")
    step(late)
    with pytest.raises(gradd.GraddError, match="before the first backward"):
        late.register_comm_hook(None, default_hooks.fp16_compress_hook)
    late.shutdown()


def test_powersgd_state_must_be_fresh(daemon, job_id):
    ddp = make(0, 1, daemon, job_id)
    state = powerSGD_hook.PowerSGDState(None, start_powerSGD_iter=2)
    state.rng.randint(10)
    with pytest.raises(ValueError, match="fresh PowerSGDState"):
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    with pytest.raises(TypeError, match="PowerSGDState"):
        ddp.register_comm_hook(None, powerSGD_hook.powerSGD_hook)
    ddp.shutdown()


def test_ranks_that_disagree_get_both_named(daemon, job_id):
    registered = threading.Event()

    def rank_fn(rank):
        ddp = make(rank, 2, daemon, job_id)
        try:
            if rank == 0:
                ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
                registered.set()
                return None
            assert registered.wait(30)
            with pytest.raises(gradd.GraddError) as e:
                ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
            return str(e.value)
        finally:
            ddp.shutdown()

    msg = run_ranks(2, rank_fn)[1]
    assert "local ranks 0 and 1" in msg and "fp16_compress" in msg and "bf16_compress" in msg


def test_rank_without_the_hook_fails_the_job(daemon, job_id):
    def rank_fn(rank):
        ddp = make(rank, 2, daemon, job_id)
        if rank == 0:
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        with pytest.raises(gradd.GraddError) as e:
            step(ddp)
        ddp.shutdown()
        return str(e.value)

    for msg in run_ranks(2, rank_fn):
        assert "different communication hooks" in msg and "local rank 1 kept" in msg


def test_daemon_default_hook_applies(gradd_binary, job_id, tmp_path):
    config = tmp_path / "gradd.yaml"
    config.write_text("default_comm_hook:\n  name: fp16_compress\n")
    d = Daemon(gradd_binary, ["--config", str(config)])
    try:
        def rank_fn(rank):
            ddp = make(rank, 2, d, job_id)
            torch.manual_seed(100 + rank)
            x = torch.randn(4, 32)
            ddp(x).sum().backward()
            local = models.mlp()
            local.load_state_dict(ddp.module.state_dict())
            local(x).sum().backward()
            out = ([p.grad.clone() for p in ddp.module.parameters()],
                   [p.grad.clone() for p in local.parameters()])
            ddp.shutdown()
            return out

        (g0, l0), (g1, l1) = run_ranks(2, rank_fn)
        for a, b, x, y in zip(g0, g1, l0, l1):
            assert torch.equal(a, b)
            assert torch.equal(a, a.half().float())  # carried as float16
            torch.testing.assert_close(a, (x + y) / 2, rtol=2e-3, atol=1e-5)
    finally:
        d.stop()


def test_ddp_comm_hook_type_wrappers_register(daemon, job_id):
    from torch.distributed.algorithms.ddp_comm_hooks import DDPCommHookType

    for i, kind in enumerate([DDPCommHookType.FP16_COMPRESS, DDPCommHookType.POWER_SGD,
                              DDPCommHookType.BATCHED_POWER_SGD_RANK2]):
        ddp = make(0, 1, daemon, f"{job_id}-{i}")
        # Python 3.11: an enum member whose .value is the functools.partial;
        # Python 3.13: the partial itself (a partial is a method descriptor
        # there, so Enum leaves it a plain class attribute, and torch's own
        # register_ddp_comm_hook, which reads .value, fails).
        getattr(kind, "value", kind)(model=ddp, state=None)
        with pytest.raises(RuntimeError, match="only be called once"):
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        step(ddp)
        ddp.shutdown()
