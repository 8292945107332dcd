"""graddctl against a real PyTorch job: two gradd.torch ranks held attached
after a few steps while `graddctl job --json` is asked about them, either
with find_unused_parameters and one layer never used (as in torch, no
bucket rebuild then) or with every layer used (buckets rebuilt after the
first step). The daemon's view
must agree with the trainers': the unused parameters by name, and torch's
DDP logging-data fields both sides know (gradd.torch computes its own from
the client's state, the daemon from its engine)."""
import json
import os
import selectors
import subprocess
import sys
import time

import pytest

from conftest import graddctl, HERE

STEPS = 3
# Fields both the trainer's _get_ddp_logging_data() and the daemon report.
SHARED_KEYS = [
    "world_size", "bucket_cap_bytes", "dtypes",
    # Not "iteration": the daemon reports the iterations it completed (the
    # summary's, checked against STEPS below), the trainer torch's last
    # sampled iteration (gradd/_ddp_logging.py).
    "num_parameter_tensors", "total_parameter_size_bytes",
    "has_rebuilt_buckets", "rebuilt_bucket_sizes",
    "rebuilt_per_bucket_param_indices", "unused_parameter_size",
    "can_set_static_graph",
]


def read_line(proc, deadline):
    """One line of `proc`'s stdout, waiting at most until `deadline`."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not sel.select(timeout=left):
            raise TimeoutError("no line from the worker in time")
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            raise EOFError(f"worker exited ({proc.wait()}): {proc.stderr.read().decode()[-4000:]}")
        data += chunk
    return json.loads(data.decode())


@pytest.mark.parametrize("mode", ["unused", "rebuild"])
def test_daemon_view_matches_the_trainers(daemon, job_id, mode):
    ctl = graddctl()
    world = 2
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), GRADD_SOCKET=daemon.socket, GRADD_JOB=job_id,
                   OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(HERE, "graddctl_worker.py"), mode, str(STEPS)],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True))
    try:
        deadline = time.monotonic() + 120
        workers = [read_line(p, deadline) for p in procs]
        job = workers[0]["job_id"]
        out = subprocess.run([ctl, "--socket", daemon.socket, "--json", "job", job],
                             capture_output=True, timeout=60)
        assert out.returncode == 0, out.stderr.decode()
        detail = json.loads(out.stdout)["job"]

        assert detail["summary"]["state"] == "JOB_STATE_RUNNING"
        assert int(detail["summary"]["iteration"]) == STEPS
        assert sorted(r["pid"] for r in detail["ranks"]) == sorted(w["pid"] for w in workers)
        if mode == "unused":
            assert detail["used_map"]
            unused = [n for n in workers[0]["params"] if n.startswith("unused.")]
            assert sorted(detail["unused_parameters"]) == sorted(unused), detail
        else:
            # gradd.torch attaches with the used map anyway; nothing unused.
            assert detail["used_map"] and detail["unused_parameters"] == [], detail
            assert detail["rebuilt"] and int(detail["rebuild_iteration"]) == 1, detail
            # Indices into the daemon's parameters: the used map and the model's.
            n = len(workers[0]["params"]) + 1
            assert sorted(detail["rebuild_ready_order"]) == list(range(n)), detail

        ours = detail["ddp_logging_data"]
        theirs = workers[0]["logging"]
        differ = {k: (ours.get(k), theirs.get(k)) for k in SHARED_KEYS
                  if str(ours.get(k)) != str(theirs.get(k))}
        assert not differ, f"daemon vs trainer: {differ}"
        assert int(ours["iteration"]) == STEPS, ours

        human = subprocess.run([ctl, "--socket", daemon.socket, "job", job],
                               capture_output=True, timeout=60)
        assert human.returncode == 0, human.stderr.decode()
        text = human.stdout.decode()
        # The plan counts gradd's used-parameter map and says so (issue 32).
        n = len(detail["plan"]["buckets"])
        assert f"plan: {n} buckets ({n - 1} of the model's and gradd's used-parameter map)" \
            in text, text
        if mode == "unused":
            assert f"unused parameters (iteration {STEPS}): unused." in text, text
        else:
            assert "rebuild: after iteration 1" in text, text
    finally:
        for p in procs:
            if p.poll() is None:
                p.stdin.close()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), [p.stderr.read().decode()[-2000:] for p in procs]
