"""Starting a real gradd for the install tests: readiness through the
sd_notify protocol (the test binds $NOTIFY_SOCKET and waits for READY=1),
so there is no polling for socket files and every wait is bounded."""

import os
import signal
import socket
import subprocess


class Daemon:
    def __init__(self, binary, run_dir, extra=()):
        self.socket_path = os.path.join(run_dir, "run", "gradd.sock")
        notify_path = os.path.join(run_dir, "notify")
        self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._notify.bind(notify_path)
        self.log_path = os.path.join(run_dir, "gradd.log")
        env = dict(os.environ, NOTIFY_SOCKET=notify_path)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [binary, "--socket", self.socket_path, *extra],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env)

    def wait_ready(self, timeout=10.0):
        self._notify.settimeout(timeout)
        try:
            msg = self._notify.recv(4096).decode()
        except socket.timeout:
            raise AssertionError(f"gradd not ready in {timeout} s:\n{self.log()}")
        assert "READY=1" in msg, msg
        return self

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self, timeout=20.0):
        """SIGTERM; the exit code (SIGKILL and AssertionError past timeout)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"gradd ignored SIGTERM:\n{self.log()}")
        finally:
            self._notify.close()
