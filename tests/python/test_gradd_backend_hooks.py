"""torch.distributed's backend "gradd" (gradd._c10d, ProcessGroupGradd) under
future callbacks that wait for collectives of the same group: torch's own
DistributedDataParallel with torch's PowerSGD and quantization hooks, against
the same training over Gloo, step by step; nested callbacks and completion
order; errors reaching callbacks; groups destroyed with work and blocking
callbacks in flight (also from their own callback thread). Real daemon, 2
ranks as real processes (backend_hook_worker.py).

A hang is a failure: the workers dump their stacks and exit after
backend_hook_worker.HANG_S seconds, and run_workers kills them after
TIMEOUT_S."""
import json

import pytest

from conftest import run_workers

# python3-torch (scripts/setup installs it): without it the module fails.
import torch  # noqa: E402
import torch.distributed  # noqa: E402,F401

TIMEOUT_S = 200
STEPS = 5


def _backend_available():
    try:
        import gradd.distributed as gd
    except ImportError:
        return False
    return gd.available()


pytestmark = pytest.mark.skipif(
    not _backend_available(),
    reason="gradd._c10d not built (libtorch-dev missing): the torch.distributed backend is off",
)


def _run(mode, daemon, tmp_path, steps=STEPS):
    outs = run_workers("backend_hook_worker.py", 2, [mode, str(tmp_path / "init"), str(steps)],
                       {"GRADD_SOCKET": daemon.socket}, timeout=TIMEOUT_S)
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def _check_parity(results):
    # Two ranks: every sum is one IEEE addition a + b, the same over Gloo
    # and gradd, and everything else is the same local arithmetic on the
    # same inputs with the same random projections: equal to the bit.
    for r in results:
        assert len(r["per_step"]) == STEPS
        for step, (grad_err, param_err) in enumerate(r["per_step"]):
            assert grad_err == 0.0, f"rank {r['rank']} step {step}: grads differ by {grad_err}"
            assert param_err == 0.0, f"rank {r['rank']} step {step}: params differ by {param_err}"
    assert results[0]["param0"] == results[1]["param0"]


def test_torch_ddp_powersgd_hook_over_gradd_matches_gloo(daemon, tmp_path):
    """PowerSGD's P and Q all_reduces are issued and waited for inside
    future callbacks once compression starts (step 2)."""
    results = _run("powersgd", daemon, tmp_path)
    _check_parity(results)
    for r in results:
        for side in ("gradd", "gloo"):
            st = r["powersgd"][side]
            assert st["iter"] == STEPS and st["compressed"], (side, st)


def test_torch_ddp_quantization_hook_over_gradd_matches_gloo(daemon, tmp_path):
    """The per-tensor quantization hook's second all_gather is issued and
    waited for inside a future callback."""
    _check_parity(_run("quant", daemon, tmp_path))


def test_nested_blocking_callbacks_and_completion_order(daemon, tmp_path):
    results = _run("nested", daemon, tmp_path, steps=3)
    for r in results:
        # The pool grows only while every thread is busy (running a
        # collective or a future's callbacks): never past one thread per
        # collective in flight (6 top-level + 3 nested) plus the runner.
        assert 1 <= r["pool_threads"] <= 10, r


def test_error_reaches_future_callbacks(daemon, tmp_path):
    for r in _run("error", daemon, tmp_path, steps=1):
        for where, msg in r["errors"].items():
            assert "gradd allreduce failed" in msg, (where, msg)


def test_destroy_with_blocking_callbacks_in_flight(daemon, tmp_path):
    results = _run("shutdown", daemon, tmp_path, steps=1)
    assert results[0]["ran_on"] == ["gradd-pg"]
