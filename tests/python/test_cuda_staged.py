"""The daemon's staged CUDA path on a GPU (server/engine/reduce/host_staging.h:
buckets copied to pinned host memory, reduced by the host path, copied
back): communication hooks and join on CUDA buckets, and two daemons with
one trainer each sharing GPU 0 (a multi-node CUDA job; NCCL cannot run two
ranks on one GPU, so the daemons stage through Gloo). The CPU parity
workers run on GPU 0 (GRADD_TEST_DEVICE=cuda) against torch's DDP over
Gloo with CUDA tensors, every gradient and parameter compared after every
step. Needs a GPU: skipped elsewhere (ctest: python_gpu_tests, label gpu).
"""
import json

import pytest
import torch

from conftest import run_workers

if not torch.cuda.is_available():
    pytest.skip("no CUDA device (or a CPU-only torch)", allow_module_level=True)

CUDA = {"GRADD_TEST_DEVICE": "cuda"}
STEPS = 6
# As test_comm_hooks / test_join on CPU.
HOOK_TOL = {"fp16": 4e-3, "powerSGD": 1e-4}
JOIN_TOL = 1e-5


def results(outs):
    return sorted((json.loads(o.strip().splitlines()[-1]) for o in outs), key=lambda r: r["rank"])


def check_hook(rs, hook):
    for r in rs:
        assert r["grads_on_device"], r
        assert r["num_buckets"] > 1, r
        assert len(r["per_step"]) == STEPS
        for step, (grad_err, param_err) in enumerate(r["per_step"]):
            assert grad_err <= HOOK_TOL[hook], f"rank {r['rank']} step {step}: grads {grad_err}"
            assert param_err <= HOOK_TOL[hook], f"rank {r['rank']} step {step}: params {param_err}"
        if hook == "fp16":
            assert r["grads_16bit"], "gradients were not rounded to 16 bits"
    assert all(r["param0"] == rs[0]["param0"] for r in rs)


def check_join(rs, world):
    for r in rs:
        assert r["grads_on_device"], r
        assert r["steps"][0] == r["steps"][1] == r["batches"], r
        assert r["errors"] == [None, None], r
        assert len(r["per_step"]) == r["batches"]
        for step, err in enumerate(r["per_step"]):
            assert err <= JOIN_TOL, f"rank {r['rank']} step {step}: relative error {err}"
        assert r["final_err"] <= JOIN_TOL, r
        assert r["authoritative"] == world - 1, r
        assert not r["in_join_after"], r
    assert len({r["checksum"] for r in rs}) == 1, "ranks ended with different models"


HOOKS = [
    ("fp16", {}),
    ("powerSGD", dict(matrix_approximation_rank=1, start_powerSGD_iter=2)),
]


@pytest.mark.parametrize("hook,state", HOOKS, ids=[h for h, _ in HOOKS])
def test_cuda_hook_matches_torch(daemon, job_id, tmp_path, hook, state):
    outs = run_workers(
        "comm_hook_worker.py", 2, [hook, str(tmp_path / "gloo"), str(STEPS), json.dumps(state)],
        {"GRADD_SOCKET": daemon.socket, "GRADD_JOB": job_id, **CUDA}, timeout=300,
    )
    check_hook(results(outs), hook)


def test_cuda_join_matches_torch(daemon, job_id, tmp_path):
    # Rank r has 3 + 2r batches: rank 0 joins after 3, rank 1 runs 2 more
    # iterations alone, divided by the initial world size.
    outs = run_workers(
        "join_worker.py", 2, ["mlp", str(tmp_path / "gloo"), "method", "1", "0", "1"],
        {"GRADD_SOCKET": daemon.socket, "GRADD_JOB": job_id, **CUDA}, timeout=300,
    )
    check_join(results(outs), 2)


def _two_nodes(two_daemons, job_id, script, args):
    """Two daemons, one trainer each, both on GPU 0: global rank r on node r."""
    return results(run_workers(
        script, 2, args, {"GRADD_JOB": job_id, **CUDA}, timeout=300,
        rank_env=lambda r: two_daemons.rank_env(r, 1), logs=two_daemons.logs))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cuda_two_daemons_match_torch(two_daemons, job_id, tmp_path, dtype):
    rs = _two_nodes(two_daemons, job_id, "cuda_ddp_worker.py",
                    ["mlp", dtype, str(tmp_path / "gloo"), "10"])
    tol = {"float32": 1e-5, "float16": 2e-2}[dtype]
    for r in rs:
        assert r["grads_on_device"] and r["grads_are_views"], r
        assert len(r["per_step"]) == 10
        for step, err in enumerate(r["per_step"]):
            assert err <= tol, f"rank {r['rank']} step {step}: {err}"


def test_cuda_two_daemons_on_one_gpu_fall_back_to_staging(two_daemons, job_id, tmp_path):
    """The NCCL setup between the nodes (server/engine/formation/nccl_job_setup.h)
    sees both daemons offer the same GPU: every node logs that it stages,
    naming the shared GPU (or the node without NCCL), and the values still
    match torch's DDP."""
    job = job_id + "-fallback"
    rs = _two_nodes(two_daemons, job, "cuda_ddp_worker.py",
                    ["mlp", "float32", str(tmp_path / "gloo-f"), "4"])
    for r in rs:
        assert len(r["per_step"]) == 4
        for step, err in enumerate(r["per_step"]):
            assert err <= 1e-5, f"rank {r['rank']} step {step}: {err}"
    for k, node in enumerate(two_daemons.nodes):
        with open(node.log_path, "rb") as f:
            log = f.read().decode(errors="replace")
        lines = [l for l in log.splitlines()
                 if f"job '{job}' node rank" in l and "NCCL between the nodes is not used" in l]
        assert lines, f"node {k} logged no staging reason for {job}:\n{log[-4000:]}"
        # Where libnccl.so.2 loads, the shared GPU is the reason; where it
        # does not (it is looked up on the library path), the missing NCCL.
        assert ("serves node ranks 0 and 1 (NCCL needs a GPU per rank)" in lines[-1]
                or "has no NCCL" in lines[-1]), lines[-1]


def test_cuda_two_daemons_hook_and_join(two_daemons, job_id, tmp_path):
    check_hook(_two_nodes(two_daemons, job_id + "-hook", "comm_hook_worker.py",
                          ["powerSGD", str(tmp_path / "gloo-h"), str(STEPS),
                           json.dumps(dict(matrix_approximation_rank=1, start_powerSGD_iter=2))]),
               "powerSGD")
    check_join(_two_nodes(two_daemons, job_id + "-join", "join_worker.py",
                          ["mlp", str(tmp_path / "gloo-j"), "generic", "0", "0", "1"]), 2)
