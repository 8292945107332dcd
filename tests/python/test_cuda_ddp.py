"""gradd.torch on CUDA against torch's DDP with CUDA tensors (Gloo): two
processes sharing GPU 0, parameters compared after every step. Needs a GPU:
skipped elsewhere (ctest runs this file as python_gpu_tests, label gpu)."""
import json

import pytest
import torch

import rebuild_checks
from conftest import run_workers

if not torch.cuda.is_available():
    pytest.skip("no CUDA device (or a CPU-only torch)", allow_module_level=True)

STEPS = 20
# fp32: as the CPU parity; 16-bit: both sides round each averaged bucket to
# the type, torch after its own fp16/bf16 allreduce, gradd after summing in
# fp32, so they agree to the type's precision.
TOL = {"float32": 1e-5, "float16": 2e-2, "bfloat16": 5e-2}


@pytest.mark.parametrize("model", ["mlp", "cnn_bn"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_cuda_matches_torch_ddp(daemon, job_id, tmp_path, model, dtype):
    outs = run_workers(
        "cuda_ddp_worker.py",
        2,
        [model, dtype, str(tmp_path / "gloo_init"), str(STEPS)],
        {"GRADD_SOCKET": daemon.socket, "GRADD_JOB": job_id},
        timeout=300,
    )
    for out in outs:
        r = json.loads(out.strip().splitlines()[-1])
        assert r["grads_on_device"] and r["grads_are_views"], r
        assert len(r["per_step"]) == STEPS
        for step, err in enumerate(r["per_step"]):
            assert err <= TOL[dtype], f"rank {r['rank']} step {step}: {err}"


# Bucket rebuild on CUDA, as torch's DDP does it there (test_rebuild.py's
# model and checks on GPU 0): the same forward as torch's, torch's rebuilt
# buckets, gradients and parameters equal to torch's after every step across
# the switch, every .grad a view into the daemon's device memory at its new
# place. "zero" keeps every .grad a bucket view through zero_grad, so the
# views themselves move; "none" leaves them None at the rebuild.
@pytest.mark.parametrize("mode,rebuild_at", [("plain", 1), ("static", 2)])
@pytest.mark.parametrize("zero_grad", ["zero", "none"])
def test_cuda_rebuild_matches_torch_ddp(daemon, job_id, tmp_path, mode, rebuild_at, zero_grad):
    outs = run_workers(
        "rebuild_worker.py",
        2,
        [mode, str(tmp_path / "gloo_init"), str(rebuild_checks.STEPS), zero_grad],
        {"GRADD_SOCKET": daemon.socket, "GRADD_JOB": job_id, "GRADD_TEST_DEVICE": "cuda"},
        timeout=300,
    )
    results = rebuild_checks.results(outs)
    for r in results:
        assert r["grads_on_device"], r
    rebuild_checks.check(results, rebuild_at)
