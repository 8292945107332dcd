"""gradd run: a torchrun-compatible launcher with the node's daemon built in
and rank-granular restarts.

    gradd run --nproc-per-node 2 train.py --steps 100
    python3 -m gradd.run --nproc-per-node 2 train.py --steps 100     # the same

It takes torchrun's flags and gives each worker torchrun's environment
(RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
GROUP_WORLD_SIZE, ROLE_RANK, ROLE_NAME, ROLE_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS,
TORCHELASTIC_RUN_ID, TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_ERROR_FILE)
plus gradd's: GRADD_SOCKET (the node's daemon), GRADD_JOB (a fresh job id
for each launch, the same on every node) and, with --max-restarts,
GRADD_RANK_RESTART_GRACE_MS.

The daemon: if one answers at the node's socket (--gradd-socket,
$GRADD_SOCKET, else the daemon's default path), the workers use it;
otherwise one is started for the launch, as the user, in a private
temporary directory, and stopped when the launch ends.

Restarts: a worker killed by a signal (SIGKILL, the OOM killer, ...) is
started again alone, with the same rank, up to --max-restarts times on this
node; the other workers pause inside gradd (the job's rank restart grace,
which the launcher sets) and go on when it is back. A worker that exits
with an error ends the launch as torchrun's does: its traceback is shown,
the other workers are stopped, and the exit status is 1. SIGINT or SIGTERM
stop the workers (SIGTERM, then SIGKILL after 15 s) and the daemon started
for the launch; exit status 1, as torchrun's. Every line a worker prints
carries its rank ([rank3]:), as torchrun's --tee does. A training loop
survives a restart with gradd.torch's DistributedDataParallel and
OptimizerWrapper (gradd/_optim.py says what the loop must still do).

Multi-node: run it on every node with --nnodes N --node-rank K
--master-addr NODE0 (or --rdzv-endpoint NODE0:PORT). Node rank 0's launcher
serves a TCPStore at MASTER_ADDR:MASTER_PORT (torchrun's agent store: the
job id goes through it, and so does the workers' init_process_group); a
node whose worker fails tells the others there. The daemons of the nodes
need the cluster's credentials (docs/operations.md): a started daemon gets
--gradd-token-file / $GRADD_TOKEN_FILE.
"""
from __future__ import annotations

import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    from gradd.run import _args, _launch

    launch = _args.parse(sys.argv[1:] if argv is None else argv)
    try:
        return _launch.NodeLaunch(launch).run()
    except (_launch.LaunchError, RuntimeError) as e:
        print(f"{_args.PROG}: error: {e}", file=sys.stderr)
        return 1
