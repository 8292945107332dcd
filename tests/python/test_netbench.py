"""scripts/netbench's emulated cluster: namespaces, bridge, addresses and
tc shaping are set up, carry TCP between the nodes, and are all removed on
a normal exit, on SIGINT (Ctrl-C) and by --cleanup. Needs root and
iproute2 with network-namespace support; skipped with the reason otherwise.
Nothing is measured here (benchmarks are not tests)."""
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
NETBENCH = os.path.join(REPO, "scripts", "netbench")
# ip, tc and the script are not built with the sanitizers the suite may
# preload for the extension module.
_ENV = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


def _why_not():
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        # scripts/setup installs iproute2: its absence fails the module.
        raise RuntimeError("iproute2 (ip, tc) is not installed (scripts/setup "
                           "installs it)")
    name = f"gnbprobe{secrets.token_hex(2)}"
    p = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, env=_ENV)
    if p.returncode != 0:
        return f"cannot create a network namespace here: {p.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", name], capture_output=True, env=_ENV)
    return None


_REASON = _why_not()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=str(_REASON))


def _existing(run_id):
    """Namespaces and links whose names carry this run's prefix."""
    prefix = f"gnb{run_id}"
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, env=_ENV).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, env=_ENV).stdout
    names = [line.split()[0] for line in ns.splitlines() if line.split()]
    names += [line.split(":")[1].strip().split("@")[0] for line in links.splitlines()
              if len(line.split(":")) > 1]
    return sorted(n for n in names if n.startswith(prefix))


def _start(run_id, nodes, hold):
    env = dict(_ENV, NETBENCH_HOLD=str(hold))
    return subprocess.Popen([sys.executable, NETBENCH, "--setup-only", "--nodes", str(nodes),
                             "--run-id", run_id, "--rate", "200mbit"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _read_cluster(proc):
    info = json.loads(proc.stdout.readline())
    assert proc.stdout.readline().strip() == "HOLDING"
    return info


def test_cluster_is_built_shaped_connected_and_removed():
    run_id = secrets.token_hex(3)
    proc = _start(run_id, 3, hold=60)
    try:
        info = _read_cluster(proc)
        assert info["namespaces"] == [f"gnb{run_id}n{k}" for k in range(3)]
        assert info["addresses"] == ["198.18.0.1", "198.18.0.2", "198.18.0.3"]
        assert sorted(info["existing"]) == _existing(run_id)
        assert len(_existing(run_id)) == 3 + 3 + 1  # namespaces, host veth ends, bridge
        for k, ns in enumerate(info["namespaces"]):
            addr = subprocess.run(["ip", "netns", "exec", ns, "ip", "-o", "-4", "addr", "show",
                                   "eth0"], capture_output=True, text=True, check=True, env=_ENV).stdout
            assert f"198.18.0.{k + 1}/24" in addr
            qdisc = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev",
                                    "eth0"], capture_output=True, text=True, check=True, env=_ENV).stdout
            assert "tbf" in qdisc and "200Mbit" in qdisc, qdisc
            host = subprocess.run(["tc", "qdisc", "show", "dev", f"gnb{run_id}v{k}"],
                                  capture_output=True, text=True, check=True, env=_ENV).stdout
            assert "tbf" in host and "200Mbit" in host, host
        # Each node's processes run in its namespace, on its share of the CPUs.
        assert len(info["cpus"]) == 3
        for k, cpus in enumerate(info["cpus"]):
            prefix = info["node_exec"].replace("{node}", str(k)).split()
            got = subprocess.run(
                prefix + [sys.executable, "-c",
                          "import os, subprocess; print(sorted(os.sched_getaffinity(0))); "
                          "print(subprocess.run(['ip', '-o', '-4', 'addr', 'show', 'eth0'], "
                          "capture_output=True, text=True).stdout)"],
                capture_output=True, text=True, timeout=30, env=_ENV)
            assert got.returncode == 0, got.stderr
            lines = got.stdout.splitlines()
            assert lines[0] == str(sorted(int(c) for c in cpus.split(","))), (k, got.stdout)
            assert f"198.18.0.{k + 1}/24" in got.stdout, (k, got.stdout)
        # Shares of this process's CPUs, in node order.
        shares = [[int(c) for c in cs.split(",")] for cs in info["cpus"]]
        assert all(set(sh) <= os.sched_getaffinity(0) for sh in shares)
        assert all(a[-1] <= b[0] for a, b in zip(shares, shares[1:])), shares
        bad = subprocess.run(info["node_exec"].replace("{node}", "7").split() + ["true"],
                             capture_output=True, text=True, env=_ENV)
        assert bad.returncode == 2 and "no node 7" in bad.stderr
        exec_dir = os.path.dirname(info["node_exec"].split()[0])
        # TCP from node 0 to node 2 across the bridge.
        server = subprocess.Popen(
            ["ip", "netns", "exec", info["namespaces"][2], sys.executable, "-c",
             "import socket; s = socket.socket(); s.bind(('198.18.0.3', 0)); s.listen(1); "
             "print(s.getsockname()[1], flush=True); c, _ = s.accept(); "
             "c.sendall(c.recv(5)[::-1])"],
            stdout=subprocess.PIPE, text=True, env=_ENV)
        port = int(server.stdout.readline())
        got = subprocess.run(
            ["ip", "netns", "exec", info["namespaces"][0], sys.executable, "-c",
             f"import socket; c = socket.create_connection(('198.18.0.3', {port}), timeout=10); "
             "c.sendall(b'hello'); print(c.recv(5).decode())"],
            capture_output=True, text=True, timeout=30, env=_ENV)
        assert got.stdout.strip() == "olleh", got.stderr
        server.wait(timeout=10)
        # Interrupted (Ctrl-C): still removes everything.
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        subprocess.run([sys.executable, NETBENCH, "--cleanup", "--run-id", run_id],
                       capture_output=True, env=_ENV)
    assert proc.returncode == 130
    assert _existing(run_id) == []
    assert not os.path.exists(exec_dir)


def test_normal_exit_removes_everything():
    run_id = secrets.token_hex(3)
    proc = _start(run_id, 2, hold=0)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    info = json.loads(out.splitlines()[0])
    assert len(info["existing"]) == 2 + 2 + 1
    assert _existing(run_id) == []


def test_cleanup_removes_what_a_killed_run_left():
    run_id = secrets.token_hex(3)
    proc = _start(run_id, 2, hold=60)
    try:
        _read_cluster(proc)
        proc.kill()  # SIGKILL: no chance to clean up
        proc.wait(timeout=10)
        assert len(_existing(run_id)) == 5
        p = subprocess.run([sys.executable, NETBENCH, "--cleanup", "--run-id", run_id],
                           capture_output=True, text=True, timeout=60, env=_ENV)
        assert p.returncode == 0, p.stderr
        assert "removed 5" in p.stdout
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run([sys.executable, NETBENCH, "--cleanup", "--run-id", run_id],
                       capture_output=True, env=_ENV)
    assert _existing(run_id) == []
