"""Communication hooks run by the daemon (gradd/_comm_hooks.py,
server/hooks/) against torch's DDP (Gloo) with the same hook registered:
same model, seed and per-rank data, different initial weights per rank;
gradients and parameters compared after every step."""
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import HERE, Daemon, run_workers

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


class HookCluster:
    """Two gradd daemons on loopback forming multi-node jobs: the first
    serves the rendezvous on an OS-chosen port, the second joins it."""

    def __init__(self, binary, tmp_path):
        port_file = tmp_path / "rendezvous.port"
        self.daemons = [Daemon(binary, ["--node-id", "hooks-a", "--rendezvous-listen",
                                        "127.0.0.1:0", "--rendezvous-port-file", str(port_file)])]
        try:
            deadline = time.monotonic() + 30
            while not (port_file.exists() and port_file.read_text().strip()):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no rendezvous port:\n{self.daemons[0].log()}")
                time.sleep(0.02)
            self.coordinator = f"127.0.0.1:{port_file.read_text().strip()}"
            self.daemons.append(Daemon(binary, ["--node-id", "hooks-b", "--coordinator",
                                                self.coordinator]))
        except Exception:
            self.stop()
            raise

    def stop(self):
        for d in self.daemons:
            d.stop()


@pytest.fixture
def hook_cluster(gradd_binary, tmp_path):
    cluster = HookCluster(gradd_binary, tmp_path)
    yield cluster
    alive = all(d.proc.poll() is None for d in cluster.daemons)
    logs = "\n".join(d.log() for d in cluster.daemons)
    cluster.stop()
    assert alive, f"a gradd died during the test:\n{logs}"


def run_on_cluster(cluster, job_id, args, local_world=2, timeout=150):
    """torchrun-style: len(daemons) x local_world workers, node n's ranks on
    daemon n; returns each rank's stdout."""
    world = len(cluster.daemons) * local_world
    procs = []
    for rank in range(world):
        env = dict(os.environ)
        env.update(
            RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank % local_world),
            LOCAL_WORLD_SIZE=str(local_world), GROUP_RANK=str(rank // local_world),
            GRADD_SOCKET=cluster.daemons[rank // local_world].socket, GRADD_JOB=job_id,
            GRADD_COORDINATOR=cluster.coordinator, OMP_NUM_THREADS="1",
        )
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(HERE, "comm_hook_worker.py"), *args], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True))
    outs, failed = [], False
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    q.kill()
            out, err = p.communicate()
            err += b"\n[killed: timeout]"
            failed = True
        outs.append((p.returncode, out.decode(errors="replace"), err.decode(errors="replace")))
        failed = failed or p.returncode != 0
    if failed:
        pytest.fail("\n".join(f"--- rank {r}: exit {rc}\n{o}\n{e[-4000:]}"
                              for r, (rc, o, e) in enumerate(outs)) +
                    "\n".join(d.log() for d in cluster.daemons))
    return [json.loads(o.strip().splitlines()[-1]) for _, o, _ in outs]


# Two nodes x two ranks (torch with four processes): the node's sum goes to
# the network as 16 bits (fp16), as P and Q (PowerSGD).
@pytest.mark.parametrize("hook,state", [
    ("fp16", {}),
    ("powerSGD", dict(matrix_approximation_rank=2, start_powerSGD_iter=2)),
    ("batched_powerSGD", dict(matrix_approximation_rank=1, start_powerSGD_iter=2,
                              warm_start=False)),
])
def test_two_daemons_match_torch(hook_cluster, job_id, tmp_path, hook, state):
    results = run_on_cluster(hook_cluster, job_id,
                             [hook, str(tmp_path / "gloo"), str(STEPS), json.dumps(state)])
    check(results, hook, tol=TOL.get(hook, POWERSGD_TOL))
