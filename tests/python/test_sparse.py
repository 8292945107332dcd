"""Sparse gradients (nn.Embedding / nn.EmbeddingBag with sparse=True) against
torch's own DDP over Gloo: averaged like Gloo's sparse allreduce, delivered
as sparse tensors (SparseAdam steps them), mixed with dense parameters; on
one node with 2 and 3 ranks and on 2 daemons x 2 ranks (torch: 4 processes).
"""
import json

import pytest

from conftest import run_workers

STEPS = 6
TOL = 1e-5


def _check(outs):
    results = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    for r in results:
        assert len(r["per_step"]) == STEPS
        for step, err in enumerate(r["per_step"]):
            assert err <= TOL, f"rank {r['rank']} step {step}: relative error {err}"
        assert r["sparse_ok"], "gradd's gradient layout differs from torch's"
        assert r["grads_differ_locally"], "data too uniform to tell averaged from local"
    assert len({r["checksum"] for r in results}) == 1, results


@pytest.mark.parametrize("world", [2, 3])
def test_sparse_matches_torch_one_node(daemon, job_id, tmp_path, world):
    outs = run_workers("sparse_worker.py", world, [str(tmp_path / "gloo"), str(STEPS)],
                       {"GRADD_SOCKET": daemon.socket, "GRADD_JOB": job_id}, timeout=150)
    _check(outs)


def test_sparse_matches_torch_two_nodes(two_daemons, job_id, tmp_path):
    outs = run_workers("sparse_worker.py", 4, [str(tmp_path / "gloo"), str(STEPS)],
                       {"GRADD_JOB": job_id}, timeout=150,
                       rank_env=lambda r: two_daemons.rank_env(r, 2), logs=two_daemons.logs)
    _check(outs)
