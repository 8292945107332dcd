"""One worker process of a launch: started (and started again after a
restart) with torchrun's environment, its stdout and stderr read line by
line and written with the rank's prefix to the console and/or to log files
(torchrun's --redirects / --tee), the tail of its stderr kept for the
failure report."""
from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional

STDOUT, STDERR = 1, 2

_console_lock = threading.Lock()


def console(line: str, err: bool = True) -> None:
    """A launcher message, whole lines only, between the workers' lines."""
    stream = sys.stderr if err else sys.stdout
    with _console_lock:
        stream.write(line if line.endswith("\n") else line + "\n")
        stream.flush()


class Worker:
    def __init__(self, local_rank: int, global_rank: int, cmd: List[str], env: Dict[str, str],
                 *, redirects: int, tee: int, log_dir: Optional[str]):
        self.local_rank = local_rank
        self.global_rank = global_rank
        self.cmd = cmd
        self.env = env
        self.prefix = f"[rank{global_rank}]:".encode()
        self.redirects = redirects
        self.tee = tee
        self.log_dir = log_dir
        self.restarts = 0
        self.proc: Optional[subprocess.Popen] = None
        self.returncode: Optional[int] = None
        self.finished = False
        self.started_at = 0.0
        self.stderr_tail: collections.deque = collections.deque(maxlen=60)
        self._threads: List[threading.Thread] = []
        self.error_file: Optional[str] = None

    # ------------------------------------------------------------- running
    def start(self, error_dir: str) -> None:
        env = dict(self.env)
        env["TORCHELASTIC_RESTART_COUNT"] = str(self.restarts)
        self.error_file = os.path.join(error_dir, f"error-{self.local_rank}-{self.restarts}.json")
        env["TORCHELASTIC_ERROR_FILE"] = self.error_file
        self.stderr_tail.clear()
        self.returncode = None
        self.finished = False
        self.proc = subprocess.Popen(
            self.cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True)
        self.started_at = time.time()
        self._threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, STDOUT), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, STDERR), daemon=True),
        ]
        for t in self._threads:
            t.start()

    def poll(self) -> Optional[int]:
        if self.proc is None:
            return None
        rc = self.proc.poll()
        if rc is not None:
            self.drain()
            self.returncode = rc
        return rc

    def drain(self, timeout: float = 5.0) -> None:
        """Waits for the output of the process that ended to be written."""
        end = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, end - time.monotonic()))

    def signal(self, sig: int) -> None:
        """`sig` to the worker's process group (its own session: the worker
        and whatever it started)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _log_path(self, stream: int) -> Optional[str]:
        if self.log_dir is None or not ((self.redirects | self.tee) & stream):
            return None
        d = os.path.join(self.log_dir, f"attempt_{self.restarts}", str(self.local_rank))
        os.makedirs(d, exist_ok=True)
        return os.path.join(d, "stdout.log" if stream == STDOUT else "stderr.log")

    def _pump(self, pipe, stream: int) -> None:
        path = self._log_path(stream)
        show = not (self.redirects & stream) or bool(self.tee & stream)
        out = sys.stdout if stream == STDOUT else sys.stderr
        f = open(path, "ab") if path else None
        try:
            for line in iter(pipe.readline, b""):
                if not line.endswith(b"\n"):
                    line += b"\n"
                if stream == STDERR:
                    self.stderr_tail.append(line.decode(errors="replace"))
                if f is not None:
                    f.write(line)
                    f.flush()
                if show:
                    with _console_lock:
                        out.flush()
                        out.buffer.write(self.prefix + line)
                        out.buffer.flush()
        finally:
            pipe.close()
            if f is not None:
                f.close()

    # ------------------------------------------------------------ reporting
    def describe_exit(self) -> str:
        rc = self.returncode
        if rc is not None and rc < 0:
            try:
                return f"{rc} (pid: {self.proc.pid}) (signal {signal.Signals(-rc).name})"
            except ValueError:
                return f"{rc} (pid: {self.proc.pid})"
        return f"{rc} (pid: {self.proc.pid if self.proc else '?'})"

    def traceback(self) -> str:
        """The worker's error: torch's @record error file when it wrote one,
        else the last lines of its stderr from the first 'Traceback'."""
        if self.error_file and os.path.exists(self.error_file):
            try:
                import json

                with open(self.error_file) as f:
                    msg = json.load(f).get("message", {})
                if isinstance(msg, dict):
                    tb = msg.get("extraInfo", {}).get("py_callstack") or msg.get("message")
                    if tb:
                        return str(tb)
            except (OSError, ValueError):
                pass
        lines = list(self.stderr_tail)
        for i in range(len(lines) - 1, -1, -1):
            if lines[i].startswith("Traceback (most recent call last)"):
                return "".join(lines[i:])
        return "".join(lines[-10:]) or "<no output on stderr>"
