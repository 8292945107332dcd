"""One node's launch: the daemon, the job id, the workers and their restarts.

Life of a launch (one per node)::

    parse flags -> node's daemon (answers? use it : start one) -> job id
      (node rank 0 draws it; the others read it from node rank 0's store)
      -> start LOCAL_WORLD_SIZE workers -> watch them:
           all exited 0                      -> exit 0
           one killed by a signal, restarts left -> start it alone again
                                                (the others pause in gradd)
           one exited non-zero / no restarts left -> stop the others, report,
                                                exit 1
           SIGINT / SIGTERM to the launcher  -> stop the workers, exit 1
      -> stop the started daemon
"""
from __future__ import annotations

import datetime
import os
import shutil
import signal
import socket
import tempfile
import time
import uuid
from typing import List, Optional

from gradd.run import _daemon
from gradd.run._args import Launch
from gradd.run._workers import Worker, console

DEFAULT_GRACE_MS = 60000
STOP_TIMEOUT_S = 15.0
_KEY = "gradd/run"


class Stopped(Exception):
    """SIGINT or SIGTERM reached the launcher."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class NodeLaunch:
    def __init__(self, launch: Launch):
        self.l = launch
        self.signum: Optional[int] = None
        self.daemon: Optional[_daemon.EmbeddedDaemon] = None
        self.store = None
        self.workers: List[Worker] = []
        self.restarts_used = 0
        self.work_dir = tempfile.mkdtemp(prefix="gradd-run-errors-")

    # ----------------------------------------------------------- signals
    def _on_signal(self, signum, frame):
        if self.signum is not None:
            # A second one: no more waiting.
            for w in self.workers:
                w.signal(signal.SIGKILL)
            raise Stopped(signum)
        self.signum = signum
        console(f"[gradd run] received {signal.Signals(signum).name}; stopping the workers")

    def _check_stop(self):
        if self.signum is not None:
            raise Stopped(self.signum)

    # -------------------------------------------------------------- main
    def run(self) -> int:
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            return self._run()
        except Stopped:
            self._stop_workers()
            return 1
        finally:
            self._stop_workers()
            if self.daemon is not None:
                rc = self.daemon.stop()
                if rc not in (0, None):
                    console(f"[gradd run] the daemon started for this launch exited with "
                            f"status {rc}")
            shutil.rmtree(self.work_dir, ignore_errors=True)
            for s, h in old.items():
                signal.signal(s, h)

    def _run(self) -> int:
        l = self.l
        socket_path = self._node_daemon()
        self._check_stop()
        job_id = self._job_id()
        self._check_stop()
        env = self._env(socket_path, job_id)
        log_dir = None
        if l.log_dir is not None or any(l.redirects.values()) or any(l.tee.values()):
            base = l.log_dir if l.log_dir is not None else tempfile.mkdtemp(prefix="gradd-run-logs-")
            log_dir = os.path.join(base, job_id.replace("/", "_"))
            os.makedirs(log_dir, exist_ok=True)
            console(f"[gradd run] workers' logs in {log_dir}")
        world = l.nnodes * l.nproc_per_node
        console(f"[gradd run] job '{job_id}': {l.nnodes} node(s) x {l.nproc_per_node} "
                f"worker(s), world size {world}, node rank {l.node_rank}, "
                f"daemon {'started for this launch' if self.daemon else 'at ' + socket_path}"
                + (f", up to {l.max_restarts} restart(s) with rank_restart_grace_ms="
                   f"{env.get('GRADD_RANK_RESTART_GRACE_MS')}" if l.max_restarts else ""))
        for lr in range(l.nproc_per_node):
            rank = l.node_rank * l.nproc_per_node + lr
            wenv = dict(env, LOCAL_RANK=str(lr), RANK=str(rank), ROLE_RANK=str(rank))
            self.workers.append(Worker(lr, rank, l.cmd, wenv, redirects=l.redirects[lr],
                                       tee=l.tee[lr], log_dir=log_dir))
        for w in self.workers:
            w.start(self.work_dir)
        rc = self._watch()
        self._finish_with_other_nodes(rc)
        return rc

    # ------------------------------------------------------------ daemon
    def _node_daemon(self) -> str:
        from gradd._world import socket_path

        l = self.l
        path = socket_path(l.socket)
        if _daemon.answers(path):
            return path
        binary = _daemon.find_binary(l.binary)
        if binary is None:
            raise LaunchError(
                f"no gradd daemon answers at {path}, and no daemon executable was found to "
                "start one (--gradd-binary, $GRADD_BINARY, or gradd on PATH)")
        args = list(l.daemon_args)
        if l.nnodes > 1:
            node_id = l.node_id or f"{socket.gethostname()}-{l.node_rank}"
            args += ["--node-id", node_id]
            if l.token_file:
                args += ["--rendezvous-token-file", l.token_file]
        self.daemon = _daemon.EmbeddedDaemon(binary, args,
                                             should_stop=lambda: self.signum is not None)
        return self.daemon.socket

    # ------------------------------------------------------------ job id
    def _job_id(self) -> str:
        """A fresh id for each launch: drawn here on a single node; across
        nodes, node rank 0 draws it and publishes it in its store (a
        TCPStore at MASTER_ADDR:MASTER_PORT, which the workers' torch
        rendezvous also uses, as torchrun's agent store). $GRADD_JOB, when
        set, names the job instead."""
        l = self.l
        explicit = os.environ.get("GRADD_JOB")
        if l.nnodes == 1:
            return explicit or f"run-{uuid.uuid4().hex[:12]}"
        timeout = datetime.timedelta(seconds=int(os.environ.get("GRADD_RUN_JOIN_TIMEOUT", "600")))
        self.store = self._make_store(timeout)
        if l.node_rank == 0:
            job = explicit or f"run-{uuid.uuid4().hex[:12]}"
            self.store.set(f"{_KEY}/job_id", job)
            return job
        value = self.store.get(f"{_KEY}/job_id")
        return value.decode() if isinstance(value, bytes) else str(value)

    def _make_store(self, timeout):
        from gradd import _torch_compat

        l = self.l
        deadline = time.monotonic() + timeout.total_seconds()
        while True:
            self._check_stop()
            try:
                return _torch_compat.tcp_store(l.master_addr, l.master_port,
                                               is_master=l.node_rank == 0,
                                               timeout=timeout)
            except RuntimeError as e:
                # Node rank 0's store is not up yet (or its port is taken).
                if l.node_rank == 0 or time.monotonic() > deadline:
                    raise LaunchError(f"the launch's store at {l.master_addr}:{l.master_port}: "
                                      f"{e}") from None
                time.sleep(1.0)

    # --------------------------------------------------------------- env
    def _env(self, socket_path: str, job_id: str) -> dict:
        l = self.l
        env = dict(os.environ)
        world = l.nnodes * l.nproc_per_node
        env.update(
            LOCAL_WORLD_SIZE=str(l.nproc_per_node),
            WORLD_SIZE=str(world),
            GROUP_RANK=str(l.node_rank),
            GROUP_WORLD_SIZE=str(l.nnodes),
            ROLE_NAME=l.role,
            ROLE_WORLD_SIZE=str(world),
            MASTER_ADDR=l.master_addr,
            MASTER_PORT=str(l.master_port),
            TORCHELASTIC_MAX_RESTARTS=str(l.max_restarts),
            TORCHELASTIC_RUN_ID=l.run_id,
            # Multi-node: node rank 0's launcher serves the store there, as
            # torchrun's agent does; one node: the workers' own rank 0 does.
            TORCHELASTIC_USE_AGENT_STORE=str(self.store is not None),
            NCCL_ASYNC_ERROR_HANDLING=os.environ.get("NCCL_ASYNC_ERROR_HANDLING", "1"),
            GRADD_SOCKET=socket_path,
            GRADD_JOB=job_id,
        )
        if "OMP_NUM_THREADS" not in os.environ and l.nproc_per_node > 1:
            env["OMP_NUM_THREADS"] = "1"  # torchrun's default, said as it says it
            console("[gradd run] OMP_NUM_THREADS=1 for each worker (set it to change this)")
        if l.max_restarts > 0:
            grace = l.grace_ms
            if grace is None:
                grace = int(os.environ.get("GRADD_RANK_RESTART_GRACE_MS") or DEFAULT_GRACE_MS)
            env["GRADD_RANK_RESTART_GRACE_MS"] = str(grace)
        elif l.grace_ms is not None:
            env["GRADD_RANK_RESTART_GRACE_MS"] = str(l.grace_ms)
        if l.min_nodes is not None:
            env["GRADD_MIN_NODES"] = str(l.min_nodes)
        return env

    # ------------------------------------------------------------- watch
    def _watch(self) -> int:
        l = self.l
        last_store_look = 0.0
        while True:
            self._check_stop()
            running = 0
            for w in self.workers:
                if w.finished:
                    continue
                rc = w.poll()
                if rc is None:
                    running += 1
                    continue
                if rc == 0:
                    w.finished = True
                    continue
                if rc < 0 and self.restarts_used < l.max_restarts and self.signum is None:
                    self.restarts_used += 1
                    w.restarts += 1
                    console(f"[gradd run] rank {w.global_rank} (local rank {w.local_rank}) was "
                            f"killed by {_signame(-rc)}; restarting it alone (restart "
                            f"{self.restarts_used} of {l.max_restarts}); the other ranks "
                            "pause until it is back")
                    w.start(self.work_dir)
                    running += 1
                    continue
                w.finished = True
                why = ("no restarts left (--max-restarts "
                       f"{l.max_restarts})" if rc < 0 else "it exited with an error")
                console(f"[gradd run] rank {w.global_rank} (local rank {w.local_rank}) failed "
                        f"with exit code {w.describe_exit()}: {why}; stopping the other workers")
                self._publish_failure(w)
                self._stop_workers()
                self._report([w])
                return 1
            if running == 0:
                return 0
            if self.store is not None and time.monotonic() - last_store_look > 0.5:
                last_store_look = time.monotonic()
                other = self._other_node_failed()
                if other:
                    console(f"[gradd run] {other}; stopping this node's workers")
                    self._stop_workers()
                    return 1
            time.sleep(l.monitor_interval)

    def _stop_workers(self) -> None:
        """SIGTERM to every running worker, SIGKILL to those still there
        after STOP_TIMEOUT_S (torchrun's shutdown)."""
        live = [w for w in self.workers if w.proc is not None and w.proc.poll() is None]
        for w in live:
            w.signal(signal.SIGTERM)
        end = time.monotonic() + STOP_TIMEOUT_S
        for w in live:
            try:
                w.proc.wait(timeout=max(0.0, end - time.monotonic()))
            except Exception:  # noqa: BLE001 - TimeoutExpired: kill it
                w.signal(signal.SIGKILL)
                w.proc.wait()
        for w in live:
            w.drain()

    # ----------------------------------------------------------- reports
    def _report(self, failed: List[Worker]) -> None:
        """torchrun's ChildFailedError summary, the root cause's traceback in it."""
        w = failed[0]
        bar = "=" * 60
        rule = "-" * 60
        when = datetime.datetime.fromtimestamp(time.time()).strftime("%Y-%m-%d_%H:%M:%S")
        tb = "\n".join("    " + line for line in w.traceback().rstrip("\n").splitlines())
        console("\n".join([
            bar,
            f"{os.path.basename(self.l.script)} FAILED",
            rule,
            "Failures:",
            "  <NO_OTHER_FAILURES>",
            rule,
            "Root Cause (first observed failure):",
            "[0]:",
            f"  time      : {when}",
            f"  host      : {socket.gethostname()}",
            f"  rank      : {w.global_rank} (local_rank: {w.local_rank})",
            f"  exitcode  : {w.describe_exit()}",
            f"  restarts  : {w.restarts}",
            "  traceback :",
            tb,
            bar,
        ]))

    # ------------------------------------------------- other nodes (store)
    def _publish_failure(self, w: Worker) -> None:
        if self.store is None:
            return
        try:
            self.store.set(f"{_KEY}/failed_msg",
                           f"rank {w.global_rank} on node rank {self.l.node_rank} failed")
            self.store.add(f"{_KEY}/failed", 1)
        except RuntimeError:
            pass

    def _other_node_failed(self) -> Optional[str]:
        try:
            # (add 0: a read that does not wait; torch 1.13's TCPStore has no check())
            if self.store.add(f"{_KEY}/failed", 0) > 0:
                v = self.store.get(f"{_KEY}/failed_msg")
                return v.decode() if isinstance(v, bytes) else str(v)
        except RuntimeError as e:
            if self.l.node_rank != 0:
                return f"node rank 0's launcher is gone ({e})"
        return None

    def _finish_with_other_nodes(self, rc: int) -> None:
        """Node rank 0 serves the store: it stays until every node is done
        (or 60 s), so that no node loses the store while it still runs."""
        if self.store is None:
            return
        try:
            self.store.add(f"{_KEY}/done", 1)
            if self.l.node_rank != 0 or rc != 0:
                return
            end = time.monotonic() + 60
            while time.monotonic() < end and self.signum is None:
                if self.store.add(f"{_KEY}/done", 0) >= self.l.nnodes:
                    return
                time.sleep(0.2)
        except RuntimeError:
            pass


class LaunchError(Exception):
    """A launch that cannot start: the message says why."""


def _signame(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
