"""The daemon's session socket under connection floods: limits in total and
per uid, idle sessions closed, no busy loop when accept() runs out of file
descriptors, and recovery once they are free again."""
import os
import socket
import struct
import subprocess
import time

import pytest

import gradd
import gradd._C as _C
from conftest import Daemon

REFUSED = 3  # SessionMessageKind::kRefused
RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED = 8, 4


def _connect(path, timeout=5.0):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(timeout)
    s.connect(path + ".session")
    s.settimeout(5.0)
    return s


def _greeting(s):
    """('hello', session id) or ('refused', code, reason)."""
    msg = s.recv(1024)
    magic, kind = struct.unpack_from("<II", msg)
    assert magic == 0x53445247, msg[:16]
    if kind == REFUSED:
        code = struct.unpack_from("<i", msg, 12)[0]
        return ("refused", code, msg[16:].split(b"\0")[0].decode())
    return ("hello", struct.unpack_from("<Q", msg, 16)[0])


def _config(tmp_path, text):
    path = tmp_path / "gradd.yaml"
    path.write_text(text)
    return ["--config", str(path)]


def _attach_and_run(daemon, job):
    c = _C.attach([("w", (16,), "float32")], socket=daemon.socket, job_id=job,
                  local_rank=0, local_world_size=1, connect_timeout=5.0)
    try:
        c.gradient(0)[:] = 3.0
        c.mark_ready(0)
        c.wait_all()
        assert (c.gradient(0) == 3.0).all()
    finally:
        c.detach()


def test_session_limits_refuse_with_a_reason(gradd_binary, tmp_path):
    # One process fills its uid's cap here: the per-process cap (default half
    # the uid's) raised to it.
    d = Daemon(gradd_binary, _config(tmp_path, "max_sessions: 6\nmax_sessions_per_uid: 3\n"
                                                "max_sessions_per_process: 3\n"
                                                "session_idle_timeout_ms: 60000\n"))
    try:
        held = [_connect(d.socket) for _ in range(3)]
        ids = [_greeting(s) for s in held]
        assert all(g[0] == "hello" for g in ids), ids
        assert len({g[1] for g in ids}) == 3
        extra = _connect(d.socket)
        kind, code, reason = _greeting(extra)
        assert (kind, code) == ("refused", RESOURCE_EXHAUSTED), (kind, code, reason)
        assert "max_sessions_per_uid" in reason
        assert extra.recv(1024) == b""  # and closed
        # Freeing one makes room again.
        held.pop().close()
        deadline = time.monotonic() + 5
        while True:
            s = _connect(d.socket)
            g = _greeting(s)
            if g[0] == "hello":
                held.append(s)
                break
            s.close()
            assert time.monotonic() < deadline, g
            time.sleep(0.02)
        for s in held:
            s.close()
        # The daemon sees the closes asynchronously; then it serves again.
        deadline = time.monotonic() + 10
        while True:
            try:
                _attach_and_run(d, f"after-limit-{time.monotonic_ns()}")
                break
            except gradd.ResourceExhaustedError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
    finally:
        d.stop()


def test_session_ids_are_not_consecutive(daemon):
    socks = [_connect(daemon.socket) for _ in range(4)]
    ids = [_greeting(s)[1] for s in socks]
    for s in socks:
        s.close()
    gaps = {b - a for a, b in zip(ids, ids[1:])}
    assert 1 not in gaps and len(gaps) == 3, ids


def test_idle_sessions_are_closed(gradd_binary, tmp_path):
    d = Daemon(gradd_binary, _config(tmp_path, "session_idle_timeout_ms: 300\n"))
    try:
        s = _connect(d.socket)
        assert _greeting(s)[0] == "hello"
        s.settimeout(10)
        start = time.monotonic()
        kind, code, reason = _greeting(s)
        assert (kind, code) == ("refused", DEADLINE_EXCEEDED), reason
        assert "session_idle_timeout_ms" in reason
        assert s.recv(1024) == b""
        assert time.monotonic() - start < 5
        # An attached rank's session is not idle: it outlives the timeout.
        c = _C.attach([("w", (4,), "float32")], socket=d.socket, job_id="idle",
                      local_rank=0, local_world_size=1)
        time.sleep(0.8)
        c.mark_ready(0)
        c.wait_all()
        c.detach()
    finally:
        d.stop()


def _proc_state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(
    "libasan" in os.environ.get("LD_PRELOAD", "") or "libtsan" in os.environ.get("LD_PRELOAD", ""),
    reason="sanitizer runtimes need file descriptors themselves (UBSan's vptr check "
    "probes memory through a pipe), so a daemon out of fds trips them; the plain "
    "build runs this test",
)
def test_fd_exhaustion_does_not_spin_and_recovers(gradd_binary, tmp_path):
    # A hard limit of 96 fds: the daemon cannot raise it, and far more
    # sessions than that are allowed, so accept() itself runs out.
    d = Daemon(gradd_binary, _config(tmp_path, "max_sessions: 5000\nmax_sessions_per_uid: 5000\n"))
    try:
        subprocess.run(["prlimit", f"--pid={d.proc.pid}", "--nofile=96:96"], check=True)
        held = []
        for _ in range(200):
            try:
                held.append(_connect(d.socket, timeout=0.2))
            except OSError:
                break  # backlog full: the daemon stopped accepting
        # gRPC connections too: gradd accepts that socket itself, so a failed
        # accept there must not kill the listener either (gRPC 1.51's own
        # listener stops for good after EMFILE).
        for _ in range(8):
            r = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            r.settimeout(0.2)
            try:
                r.connect(d.socket)
                held.append(r)
            except OSError:
                r.close()
        time.sleep(0.3)
        before = _cpu_seconds(d.proc.pid)
        time.sleep(1.0)
        used = _cpu_seconds(d.proc.pid) - before
        assert used < 0.5, f"gradd used {used:.2f} s of CPU in 1 s while out of fds"
        assert d.proc.poll() is None
        for s in held:
            s.close()
        # Once fds are free again it serves jobs by itself.
        deadline = time.monotonic() + 20
        while True:
            try:
                _attach_and_run(d, f"recovered-{int(time.monotonic() * 1000)}")
                break
            except Exception:
                assert time.monotonic() < deadline, d.log()
                time.sleep(0.2)
    finally:
        d.stop()


def test_stopped_daemon_is_reported_not_waited_for(gradd_binary, tmp_path, monkeypatch):
    """A SIGSTOPped daemon keeps its sockets open, so only its heartbeat
    tells: the trainer fails with UNAVAILABLE 'not responding' after its
    heartbeat timeout instead of its (600 s) wait timeout."""
    monkeypatch.setenv("GRADD_HEARTBEAT_TIMEOUT_MS", "1500")
    d = Daemon(gradd_binary)
    try:
        c = _C.attach([("w", (4,), "float32")], socket=d.socket, job_id="stopped",
                      local_rank=0, local_world_size=1)
        c.mark_ready(0)
        c.wait_all()  # beats normally
        os.kill(d.proc.pid, 19)  # SIGSTOP
        # The signal is asynchronous: wait until the daemon really stopped,
        # or its engine could still finish the next bucket.
        deadline = time.monotonic() + 10
        while _proc_state(d.proc.pid) != "T":
            assert time.monotonic() < deadline, "gradd did not stop"
            time.sleep(0.01)
        try:
            c.mark_ready(0)
            start = time.monotonic()
            with pytest.raises(gradd.UnavailableError, match="not responding"):
                c.wait_all()
            assert time.monotonic() - start < 30
        finally:
            os.kill(d.proc.pid, 18)  # SIGCONT
    finally:
        d.stop()
