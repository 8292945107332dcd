"""The node's daemon for a launch: the one that answers at the node's socket
(systemd's, a Kubernetes DaemonSet's), else one started for the launch --
as the user, in a private directory (mode 0700, removed at the end), with
the launch's settings -- and stopped (SIGTERM, its clean shutdown) when the
launch ends."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from typing import List, Optional


def answers(path: str, timeout: float = 1.0) -> bool:
    """Whether a daemon accepts connections on the Unix socket `path` (a
    stale socket file left by a dead daemon refuses them)."""
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return False
    except OSError:
        return False
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def find_binary(explicit: Optional[str]) -> Optional[str]:
    """The daemon executable: --gradd-binary, $GRADD_BINARY, the build
    tree's (this package assembled in <build>/client/python/gradd), the
    installed one beside a `gradd` wrapper (<prefix>/libexec/gradd/gradd),
    else an executable `gradd` on PATH that is the daemon itself (an ELF
    file, not the `gradd` wrapper script)."""
    for cand in (explicit, os.environ.get("GRADD_BINARY")):
        if cand:
            return cand
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    build_tree = os.path.normpath(os.path.join(pkg, "..", "..", "..", "server", "gradd"))
    if os.access(build_tree, os.X_OK):
        return build_tree
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if not d:
            continue
        for cand in (os.path.join(d, "gradd"),
                     os.path.normpath(os.path.join(d, "..", "libexec", "gradd", "gradd"))):
            if os.access(cand, os.X_OK) and _is_elf(cand):
                return cand
    return None


class EmbeddedDaemon:
    """A daemon started for one launch; `socket` is where its trainers find it."""

    def __init__(self, binary: str, args: List[str], ready_timeout: float = 60.0,
                 should_stop=lambda: False):
        self.dir = tempfile.mkdtemp(prefix="gradd-run-")  # 0700, the user's
        self.socket = os.path.join(self.dir, "gradd.sock")
        self.log_path = os.path.join(self.dir, "gradd.log")
        self.cmd = [binary, "--socket", self.socket, *args]
        log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            log.close()
            shutil.rmtree(self.dir, ignore_errors=True)
            raise RuntimeError(f"cannot start the gradd daemon {binary}: {e}") from None
        finally:
            if not log.closed:
                log.close()
        deadline = time.monotonic() + ready_timeout
        while not (os.path.exists(self.socket) and os.path.exists(self.socket + ".session")):
            if self.proc.poll() is not None:
                tail = self.log()
                self.stop()
                raise RuntimeError(
                    f"the gradd daemon started for this launch exited with status "
                    f"{self.proc.returncode}:\n{tail}")
            if time.monotonic() > deadline or should_stop():
                tail = self.log()
                self.stop()
                raise RuntimeError(
                    f"the gradd daemon started for this launch did not serve {self.socket} "
                    f"within {ready_timeout:.0f} s:\n{tail}")
            time.sleep(0.02)

    def log(self, limit: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")[-limit:]
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 15.0) -> Optional[int]:
        """SIGTERM (the daemon's clean shutdown), SIGKILL after `timeout`;
        removes the private directory. Returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
        return self.proc.returncode
