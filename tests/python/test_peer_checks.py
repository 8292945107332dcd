"""Who a trainer talks to, and who the daemon serves: a trainer refuses a
socket served by another user before sending it anything, and a trainer the
daemon refuses is told why (PERMISSION_DENIED), not "peer closed the socket".

These need root (to run a fake daemon or a trainer as another uid); they
skip otherwise.
"""
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

import gradd
import gradd._C as _C

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch uids")

# A "daemon" run by uid NOBODY: both sockets at the usual paths, a hello on
# the session socket; it records every byte anyone sends it.
FAKE = textwrap.dedent(
    """
    import os, select, socket, struct, sys
    path, log = sys.argv[1], sys.argv[2]
    os.setgid(%d); os.setuid(%d)
    sess = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); sess.bind(path + ".session"); sess.listen(8)
    rpc = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); rpc.bind(path); rpc.listen(8)
    os.chmod(path, 0o777); os.chmod(path + ".session", 0o777)
    open(log + ".ready", "w").close()
    conns = []
    while True:
        r, _, _ = select.select([sess, rpc] + conns, [], [])
        for s in r:
            if s is sess:
                c, _ = sess.accept()
                c.send(struct.pack("<IIIIQ", 0x53445247, 1, 1, 0, 42))
                conns.append(c)
            elif s is rpc:
                c, _ = rpc.accept(); conns.append(c)
            else:
                data = s.recv(65536)
                if not data:
                    conns.remove(s)
                else:
                    with open(log, "ab") as f:
                        f.write(data)
    """
    % (NOBODY, NOBODY)
)


@pytest.fixture
def fake_daemon():
    d = tempfile.mkdtemp(prefix="gradd-fake-")
    os.chmod(d, 0o777)
    path, log = os.path.join(d, "gradd.sock"), os.path.join(d, "received")
    proc = subprocess.Popen([sys.executable, "-c", FAKE, path, log])
    try:
        for _ in range(500):
            if os.path.exists(log + ".ready"):
                break
            assert proc.poll() is None, "fake daemon died"
            time.sleep(0.01)
        yield path, log
    finally:
        proc.kill()
        proc.wait()
        subprocess.run(["rm", "-rf", d])


def _attach(path, **kw):
    return _C.attach([("w", (4,), "float32")], socket=path, job_id="secret-job",
                     local_rank=0, local_world_size=1, connect_timeout=2.0,
                     attach_timeout=2.0, **kw)


def test_trainer_refuses_a_daemon_of_another_uid(fake_daemon, monkeypatch):
    path, log = fake_daemon
    monkeypatch.delenv("GRADD_DAEMON_UID", raising=False)
    with pytest.raises(gradd.PermissionDeniedError) as e:
        _attach(path)
    msg = str(e.value)
    assert f"uid {NOBODY}" in msg and f"runs as uid {os.geteuid()}" in msg, msg
    assert "GRADD_DAEMON_UID" in msg
    # Nothing was sent: no job id, no parameter names.
    assert not os.path.exists(log) or b"secret-job" not in open(log, "rb").read()


def test_a_named_daemon_uid_is_trusted(fake_daemon, monkeypatch):
    path, _ = fake_daemon
    monkeypatch.setenv("GRADD_DAEMON_UID", str(NOBODY))
    # Trusted now: the client goes on to gRPC, which the fake does not speak.
    with pytest.raises(gradd.GraddError) as e:
        _attach(path)
    assert not isinstance(e.value, gradd.PermissionDeniedError), str(e.value)


def test_bad_daemon_uid_variable_is_an_error(fake_daemon, monkeypatch):
    path, _ = fake_daemon
    monkeypatch.setenv("GRADD_DAEMON_UID", "nobody")
    with pytest.raises(gradd.InvalidArgumentError, match="GRADD_DAEMON_UID"):
        _attach(path)


TRAINER = textwrap.dedent(
    """
    import os, sys
    os.setgid(%d); os.setuid(%d)
    import gradd, gradd._C as _C
    try:
        _C.attach([("w", (4,), "float32")], socket=sys.argv[1], job_id="j",
                  local_rank=0, local_world_size=1, connect_timeout=2.0, attach_timeout=2.0)
    except gradd.GraddError as e:
        print(type(e).__name__, e)
        sys.exit(0)
    print("attached")
    sys.exit(1)
    """
    % (NOBODY, NOBODY)
)


def test_daemon_tells_a_refused_trainer_why(daemon):
    # Open the daemon's directory and sockets to everyone: the uid check at
    # accept (SO_PEERCRED) is then what refuses the other user.
    d = os.path.dirname(daemon.socket)
    paths = (os.path.dirname(d), d, daemon.socket, daemon.socket + ".session")
    modes = {p: os.stat(p).st_mode for p in paths}
    try:
        for p in modes:
            os.chmod(p, 0o777)
        out = subprocess.run([sys.executable, "-c", TRAINER, daemon.socket],
                             capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", "")))
    finally:
        for p, m in modes.items():
            os.chmod(p, m & 0o7777)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("PermissionDeniedError"), out.stdout
    assert "refused this trainer" in out.stdout and f"uid {NOBODY}" in out.stdout, out.stdout


RAW_RPC = textwrap.dedent(
    """
    import os, socket, sys
    os.setgid(%d); os.setuid(%d)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(sys.argv[1])
    print("eof" if s.recv(1024) == b"" else "served")
    """
    % (NOBODY, NOBODY)
)


def test_grpc_socket_refuses_other_uids(daemon):
    """The gRPC socket checks SO_PEERCRED like the session socket: another
    user's connection is closed before gRPC sees it (gRPC would otherwise
    greet it with its HTTP/2 settings)."""
    d = os.path.dirname(daemon.socket)
    paths = (os.path.dirname(d), d, daemon.socket)
    modes = {p: os.stat(p).st_mode for p in paths}
    try:
        for p in modes:
            os.chmod(p, 0o777)
        other = subprocess.run([sys.executable, "-c", RAW_RPC, daemon.socket],
                               capture_output=True, text=True, timeout=30)
    finally:
        for p, m in modes.items():
            os.chmod(p, m & 0o7777)
    assert other.stdout.strip() == "eof", other.stdout + other.stderr
    # The daemon's own user is served (gRPC sends its settings frame).
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(daemon.socket)
    assert s.recv(1024) != b""
    s.close()
