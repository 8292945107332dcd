"""gradd.torch under torchrun's environment across two daemons with no
gradd configuration: 2 nodes x 2 trainers form one 4-rank job (the daemon on
MASTER_ADDR's host serves the rendezvous on demand, on gradd's own port, not
MASTER_PORT) and every gradient and parameter equals torch DDP's over Gloo,
uncompressed and with the 16-bit hooks."""
import json

import pytest

from conftest import run_workers
from test_comm_hooks import STEPS, check


@pytest.mark.parametrize("hook", ["allreduce", "bf16"])
def test_torchrun_two_nodes_match_torch(torchrun_daemons, tmp_path, hook):
    outs = run_workers(
        "comm_hook_worker.py", 4, [hook, str(tmp_path / "gloo"), str(STEPS)], {},
        timeout=150, rank_env=lambda r: torchrun_daemons.rank_env(r, 2),
        logs=torchrun_daemons.logs)
    results = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    assert sorted(r["rank"] for r in results) == [0, 1, 2, 3]
    check(results, hook)
    logs = [n.log() for n in torchrun_daemons.nodes]
    assert sum("coordinator store on" in log for log in logs) == 1, torchrun_daemons.logs()
    # The job spans both daemons (one 4-rank job, not two 2-rank ones).
    assert all("of 4" in log for log in logs), torchrun_daemons.logs()
