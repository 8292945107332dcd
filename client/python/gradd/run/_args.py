"""gradd run's command line: torchrun's flags (both spellings, --nproc-per-node
and --nproc_per_node, as torchrun 2.x accepts), plus gradd's own. Errors are
argparse's, as torchrun's are: the usage, then "gradd run: error: ...", exit
status 2."""
from __future__ import annotations

import argparse
import os
import socket
from dataclasses import dataclass
from typing import Dict, List, Optional

PROG = "gradd run"


def _add(ap, *names, **kw):
    """An option under each spelling: --a-b and --a_b (torchrun's)."""
    flags = []
    for n in names:
        flags.append(n)
        if n.startswith("--") and "-" in n[2:]:
            flags.append("--" + n[2:].replace("-", "_"))
    ap.add_argument(*flags, **kw)


def parser() -> argparse.ArgumentParser:
    from gradd.run import __doc__ as doc

    ap = argparse.ArgumentParser(
        prog=PROG, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_argument_group("torchrun's flags")
    _add(g, "--nnodes", default="1",
         help="nodes: N, or MIN:MAX (the job forms with MAX nodes and goes on while "
              "MIN are left: gradd's min_nodes)")
    _add(g, "--nproc-per-node", default="1",
         help="workers on this node: a number, or cpu, gpu, auto")
    _add(g, "--node-rank", type=int, default=None, help="this node's rank (default 0)")
    _add(g, "--master-addr", default=None,
         help="node rank 0's address (default 127.0.0.1); also the host of gradd's "
              "rendezvous coordinator")
    _add(g, "--master-port", type=int, default=None,
         help="the launch's store on node rank 0 (default 29500)")
    _add(g, "--standalone", action="store_true",
         help="one node, a free port: --nnodes 1 --master-addr 127.0.0.1")
    _add(g, "--rdzv-backend", default="static",
         help="static, or c10d with --node-rank (the endpoint is then node rank 0's store)")
    _add(g, "--rdzv-endpoint", default="",
         help="HOST[:PORT]: the same as --master-addr HOST --master-port PORT")
    _add(g, "--rdzv-id", default="none", help="the run id (TORCHELASTIC_RUN_ID)")
    _add(g, "--rdzv-conf", default="", help="accepted for compatibility; ignored")
    _add(g, "--max-restarts", type=int, default=0,
         help="workers of this node that may be restarted after being killed by a "
              "signal, each one alone while the others pause (default 0)")
    _add(g, "--monitor-interval", type=float, default=0.1,
         help="seconds between looks at the workers (default 0.1)")
    _add(g, "--start-method", default="spawn", choices=["spawn", "fork", "forkserver"],
         help="accepted for compatibility (workers are always new processes)")
    _add(g, "--role", default="default", help="ROLE_NAME of the workers")
    _add(g, "-m", "--module", action="store_true",
         help="run the script as a module (python -m)")
    _add(g, "--no-python", action="store_true",
         help="run the script as an executable, not through Python")
    _add(g, "--run-path", action="store_true", help="accepted for compatibility")
    _add(g, "--log-dir", default=None,
         help="directory for the workers' log files (LOG_DIR/JOB/attempt_N/LOCAL_RANK/"
              "stdout.log)")
    _add(g, "-r", "--redirects", default="0",
         help="streams to log files instead of the console: 0 none, 1 stdout, 2 stderr, "
              "3 both, or per local rank: 0:1,1:2")
    _add(g, "-t", "--tee", default="0",
         help="streams to log files and the console (same values as --redirects)")
    _add(g, "--local-addr", default=None, help="accepted for compatibility")
    _add(g, "--max-nodes", type=int, default=None, help=argparse.SUPPRESS)
    d = ap.add_argument_group("gradd's flags")
    _add(d, "--rank-restart-grace-ms", type=int, default=None,
         help="the job's rank restart grace when --max-restarts > 0 (default "
              "$GRADD_RANK_RESTART_GRACE_MS, else 60000)")
    _add(d, "--gradd-socket", default=None,
         help="the node's daemon socket (default $GRADD_SOCKET, else the daemon's default "
              "path); a daemon there is used, else one is started for the launch")
    _add(d, "--gradd-binary", default=None,
         help="the daemon to start when none answers (default $GRADD_BINARY, the build "
              "tree's, or gradd on PATH)")
    _add(d, "--gradd-token-file", default=None,
         help="multi-node: the cluster's shared token for the started daemon "
              "(default $GRADD_TOKEN_FILE)")
    _add(d, "--gradd-node-id", default=None,
         help="multi-node: the started daemon's node id (default HOSTNAME-NODE_RANK)")
    _add(d, "--gradd-daemon-arg", action="append", default=[],
         help="one more flag for the started daemon (repeatable), e.g. "
              "--gradd-daemon-arg=--config=/etc/gradd/gradd.yaml")
    ap.add_argument("training_script", help="the script (or module, or executable)")
    ap.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return ap


@dataclass
class Launch:
    """The checked command line."""

    nnodes: int
    min_nodes: Optional[int]  # MIN of --nnodes MIN:MAX when MIN < MAX
    nproc_per_node: int
    node_rank: int
    master_addr: str
    master_port: int
    max_restarts: int
    grace_ms: Optional[int]
    monitor_interval: float
    role: str
    run_id: str
    cmd: List[str]
    script: str
    log_dir: Optional[str]
    redirects: Dict[int, int]  # local rank -> stream mask (1 stdout, 2 stderr)
    tee: Dict[int, int]
    socket: Optional[str]
    binary: Optional[str]
    token_file: Optional[str]
    node_id: Optional[str]
    daemon_args: List[str]


def _streams(ap, flag: str, value: str, nproc: int) -> Dict[int, int]:
    def one(v: str) -> int:
        try:
            n = int(v)
        except ValueError:
            ap.error(f"argument {flag}: invalid value {value!r} (0, 1, 2, 3 or "
                     "LOCAL_RANK:VALUE,...)")
        if not 0 <= n <= 3:
            ap.error(f"argument {flag}: {n} is not one of 0, 1, 2, 3")
        return n

    if ":" not in value:
        n = one(value)
        return {r: n for r in range(nproc)}
    out = {r: 0 for r in range(nproc)}
    for part in value.split(","):
        rank, _, v = part.partition(":")
        try:
            r = int(rank)
        except ValueError:
            ap.error(f"argument {flag}: invalid value {value!r}")
        out[r] = one(v)
    return out


def _nproc(ap, value: str) -> int:
    if value in ("cpu", "auto"):
        if value == "auto":
            try:
                import torch

                if torch.cuda.is_available() and torch.cuda.device_count() > 0:
                    return torch.cuda.device_count()
            except ImportError:
                pass
        return os.cpu_count() or 1
    if value == "gpu":
        try:
            import torch

            n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        except ImportError:
            n = 0
        if n == 0:
            ap.error("argument --nproc-per-node: gpu given but this node has no CUDA device")
        return n
    try:
        n = int(value)
    except ValueError:
        ap.error(f"argument --nproc-per-node: invalid value {value!r} (a number, cpu, gpu "
                 "or auto)")
    if n < 1:
        ap.error(f"argument --nproc-per-node: {n} is not positive")
    return n


def _nnodes(ap, value: str):
    parts = value.split(":")
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        ap.error(f"argument --nnodes: invalid value {value!r} (N or MIN:MAX)")
    if len(nums) == 1:
        nums = nums * 2
    if len(nums) != 2 or not 1 <= nums[0] <= nums[1]:
        ap.error(f"argument --nnodes: invalid value {value!r} (N or MIN:MAX with "
                 "1 <= MIN <= MAX)")
    return nums[1], (nums[0] if nums[0] < nums[1] else None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse(argv: List[str]) -> Launch:
    ap = parser()
    a = ap.parse_args(argv)
    nnodes, min_nodes = _nnodes(ap, a.nnodes)
    nproc = _nproc(ap, a.nproc_per_node)
    if a.max_restarts < 0:
        ap.error(f"argument --max-restarts: {a.max_restarts} is negative")
    if a.monitor_interval <= 0:
        ap.error("argument --monitor-interval: must be positive")
    if a.rdzv_backend not in ("static", "c10d"):
        ap.error(f"argument --rdzv-backend: {a.rdzv_backend!r} is not supported by gradd "
                 "run (static or c10d)")
    if a.module and a.no_python:
        ap.error("arguments -m/--module and --no-python cannot be used together")
    master_addr, master_port = a.master_addr, a.master_port
    if a.rdzv_endpoint:
        host, _, port = a.rdzv_endpoint.rpartition(":") if ":" in a.rdzv_endpoint \
            else (a.rdzv_endpoint, "", "")
        if master_addr is not None and master_addr != host:
            ap.error("arguments --rdzv-endpoint and --master-addr name different hosts")
        master_addr = host
        if port:
            try:
                master_port = int(port)
            except ValueError:
                ap.error(f"argument --rdzv-endpoint: invalid port in {a.rdzv_endpoint!r}")
        elif master_port is None:
            master_port = 29400  # torchrun's c10d endpoint default
    if a.standalone:
        if nnodes != 1:
            ap.error("argument --standalone: only with --nnodes 1")
        master_addr, master_port = "127.0.0.1", _free_port()
    node_rank = a.node_rank
    if node_rank is None:
        if nnodes > 1:
            ap.error(f"argument --node-rank: required with --nnodes {a.nnodes} (gradd run "
                     "assigns no node ranks through a rendezvous)")
        node_rank = 0
    if not 0 <= node_rank < nnodes:
        ap.error(f"argument --node-rank: {node_rank} is not in [0, {nnodes})")
    if a.rank_restart_grace_ms is not None and not 0 <= a.rank_restart_grace_ms <= 3600000:
        ap.error("argument --rank-restart-grace-ms: must be in [0, 3600000]")
    if a.no_python:
        cmd = [a.training_script, *a.training_script_args]
    elif a.module:
        cmd = [_python(), "-u", "-m", a.training_script, *a.training_script_args]
    else:
        cmd = [_python(), "-u", a.training_script, *a.training_script_args]
    return Launch(
        nnodes=nnodes,
        min_nodes=min_nodes,
        nproc_per_node=nproc,
        node_rank=node_rank,
        master_addr=master_addr or "127.0.0.1",
        master_port=master_port if master_port is not None else 29500,
        max_restarts=a.max_restarts,
        grace_ms=a.rank_restart_grace_ms,
        monitor_interval=a.monitor_interval,
        role=a.role,
        run_id=a.rdzv_id,
        cmd=cmd,
        script=a.training_script,
        log_dir=a.log_dir,
        redirects=_streams(ap, "--redirects", a.redirects, nproc),
        tee=_streams(ap, "--tee", a.tee, nproc),
        socket=a.gradd_socket,
        binary=a.gradd_binary,
        token_file=a.gradd_token_file or os.environ.get("GRADD_TOKEN_FILE") or None,
        node_id=a.gradd_node_id,
        daemon_args=list(a.gradd_daemon_arg),
    )


def _python() -> str:
    import sys

    return sys.executable or "python3"
