"""Communication hooks run by the daemon (gradd/_comm_hooks.py,
server/hooks/) against torch's DDP (Gloo) with the same hook registered:
same model, seed and per-rank data, different initial weights per rank;
gradients and parameters compared after every step."""
import json

import pytest

from conftest import run_workers

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
