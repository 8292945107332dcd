"""Sparse gradients (nn.Embedding / nn.EmbeddingBag with sparse=True) against
torch's own DDP over Gloo: averaged like Gloo's sparse allreduce, delivered
as sparse tensors (SparseAdam steps them), mixed with dense parameters; on
one node with 2 and 3 ranks and on 2 daemons x 2 ranks (torch: 4 processes).
"""
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import HERE, Daemon, run_workers

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


def test_sparse_matches_torch_two_nodes(gradd_binary, job_id, tmp_path):
    port_file = tmp_path / "coordinator.port"
    a = Daemon(gradd_binary, ["--node-id", "sp-a", "--rendezvous-listen", "127.0.0.1:0",
                              "--rendezvous-port-file", str(port_file)])
    daemons = [a]
    try:
        deadline = time.monotonic() + 20
        while not (port_file.exists() and port_file.read_text().strip()):
            assert time.monotonic() < deadline, "coordinator port file never appeared"
            time.sleep(0.02)
        coordinator = f"127.0.0.1:{port_file.read_text().strip().rsplit(':', 1)[-1]}"
        daemons.append(Daemon(gradd_binary, ["--node-id", "sp-b", "--coordinator", coordinator]))
        procs = []
        for rank in range(4):
            node, local = divmod(rank, 2)
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="4", LOCAL_RANK=str(local),
                       LOCAL_WORLD_SIZE="2", GROUP_RANK=str(node), OMP_NUM_THREADS="1",
                       GRADD_SOCKET=daemons[node].socket, GRADD_JOB=job_id,
                       GRADD_COORDINATOR=coordinator)
            procs.append(subprocess.Popen(
                [sys.executable, os.path.join(HERE, "sparse_worker.py"),
                 str(tmp_path / "gloo"), str(STEPS)],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        outs, failed = [], []
        for rank, p in enumerate(procs):
            try:
                out, err = p.communicate(timeout=150)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                out, err = p.communicate()
            outs.append(out.decode())
            if p.returncode != 0:
                failed.append(f"rank {rank}: exit {p.returncode}\n{err.decode()[-3000:]}")
        assert not failed, "\n".join(failed) + "\n" + "\n".join(d.log() for d in daemons)
        _check(outs)
    finally:
        for d in daemons:
            d.stop()
