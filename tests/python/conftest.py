"""Fixtures for the gradd Python suite.

Environment (set by tests/python/CMakeLists.txt under ctest):
  PYTHONPATH    <build>/client/python, where `import gradd` finds the package
  GRADD_BINARY  the gradd daemon to start

Run by hand:
  PYTHONPATH=build/client/python GRADD_BINARY=build/server/gradd \\
      /usr/bin/python3 -m pytest -q tests/python
"""
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # helpers (ddp_worker, models) for this process


def _gradd_binary():
    path = os.environ.get("GRADD_BINARY")
    if not path:
        for guess in ("build/server/gradd", "build-py/server/gradd"):
            cand = os.path.join(HERE, "..", "..", guess)
            if os.access(cand, os.X_OK):
                return os.path.abspath(cand)
        pytest.skip("GRADD_BINARY is not set (run under ctest or set it by hand)")
    if not os.access(path, os.X_OK):
        pytest.fail(f"GRADD_BINARY={path} is not an executable")
    return path


class Daemon:
    """A real gradd on a socket in a private temporary directory."""

    def __init__(self, binary, extra_args=()):
        self.dir = tempfile.mkdtemp(prefix="gradd-pytest-")
        self.socket = os.path.join(self.dir, "run", "gradd.sock")
        self.log_path = os.path.join(self.dir, "gradd.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [binary, "--socket", self.socket, *extra_args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while not (os.path.exists(self.socket) and os.path.exists(self.socket + ".session")):
            if self.proc.poll() is not None:
                raise RuntimeError(f"gradd exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"gradd did not create {self.socket} in 30 s:\n{self.log()}")
            time.sleep(0.02)

    def log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def gradd_binary():
    return _gradd_binary()


@pytest.fixture(scope="session")
def daemon(gradd_binary):
    d = Daemon(gradd_binary)
    yield d
    alive = d.proc.poll() is None
    log = d.log()
    d.stop()
    assert alive, f"gradd died during the tests:\n{log}"


def node_token_args(directory):
    """gradd flags giving a node daemon the cluster's shared token (issue 20:
    a daemon taking part in multi-node jobs needs credentials): a fresh
    random token in `directory`, mode 0600, the same file for every node."""
    path = os.path.join(directory, "node-token")
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(24) + "\n")
    return ["--rendezvous-token-file", path]


class TwoDaemons:
    """Two real gradd daemons on loopback forming multi-node jobs: node-a is
    the rendezvous coordinator (OS-chosen port), node-b points at it. Node
    ranks are given explicitly by the trainers (gradd.torch derives them from
    RANK // LOCAL_WORLD_SIZE), so node i hosts global ranks
    i*L .. i*L+L-1 for a local world size L."""

    def __init__(self, binary):
        self.dir = tempfile.mkdtemp(prefix="gradd-pytest-2n-")
        config = os.path.join(self.dir, "gradd.yaml")
        with open(config, "w") as f:
            f.write("rendezvous:\n  formation_timeout_ms: 60000\n  collective_timeout_ms: 60000\n")
        port_file = os.path.join(self.dir, "coordinator.port")
        self.nodes = []
        auth = node_token_args(self.dir)
        a = Daemon(binary, ["--node-id", "node-a", "--config", config,
                            "--rendezvous-listen", "127.0.0.1:0",
                            "--rendezvous-port-file", port_file, *auth])
        self.nodes.append(a)
        port = wait_port_file(port_file, a, self.stop)
        self.coordinator = f"127.0.0.1:{port}"
        try:
            self.nodes.append(Daemon(binary, ["--node-id", "node-b", "--config", config,
                                              "--coordinator", self.coordinator, *auth]))
        except Exception:
            self.stop()
            raise

    def rank_env(self, rank, local_world_size):
        """Environment of global rank `rank` (torchrun's names + gradd's)."""
        node = rank // local_world_size
        return dict(
            LOCAL_RANK=str(rank % local_world_size),
            LOCAL_WORLD_SIZE=str(local_world_size),
            GROUP_RANK=str(node),
            GRADD_SOCKET=self.nodes[node].socket,
            GRADD_COORDINATOR=self.coordinator,
        )

    def logs(self):
        return "\n".join(f"--- {n.log_path}\n{n.log()}" for n in self.nodes)

    def alive(self):
        return all(n.proc.poll() is None for n in self.nodes)

    def stop(self):
        for n in reversed(self.nodes):
            n.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class Nodes:
    """N daemons on loopback; node i hosts global rank i (one trainer per
    node). A node can be SIGKILLed and started again with the same node id.

    backend="builtin": node-0 is the rendezvous coordinator (its store in
    its memory, on an OS-chosen port), the others point at it with
    --coordinator, and the trainers name it in GRADD_COORDINATOR.
    backend="etcd": the rendezvous lives on `etcd` (an etcd_cluster.
    EtcdCluster the caller owns and stops after this): every daemon gets the
    same config (rendezvous.backend: etcd, the cluster's endpoints and mTLS
    files, a key prefix of its own, rendezvous.etcd.lease_ttl_ms) and no
    coordinator flag, and the trainers' GRADD_COORDINATOR is empty (a
    daemon on etcd takes the store from its config, whatever its trainers
    name). Either way the daemons share one node token (their Gloo pairs)."""

    # reformation_silence_ms: 3 s rather than the daemon's 1 s default, so that a
    # daemon starved of CPU on a loaded CI machine (sanitizers) is not
    # taken for a silent one, which would re-form the job once more than a
    # test expects. lease_ttl_ms (etcd) plays the same part there: 3 s.
    def __init__(self, binary, n, reformation_settle_ms=1500, reformation_silence_ms=3000,
                 backend="builtin", etcd=None, lease_ttl_ms=3000, formation_timeout_ms=30000):
        if backend not in ("builtin", "etcd"):
            raise ValueError(f"unknown rendezvous backend {backend!r}")
        if (backend == "etcd") != (etcd is not None):
            raise ValueError("backend='etcd' goes with etcd=<EtcdCluster>, and only it")
        self.binary = binary
        self.backend = backend
        self.etcd = etcd
        self.prefix = None  # the etcd key prefix of this set of nodes
        self.dir = tempfile.mkdtemp(prefix="gradd-pytest-elastic-")
        self.config = os.path.join(self.dir, "gradd.yaml")
        with open(self.config, "w") as f:
            f.write(f"rendezvous:\n  formation_timeout_ms: {formation_timeout_ms}\n"
                    "  collective_timeout_ms: 20000\n"
                    f"  reformation_settle_ms: {reformation_settle_ms}\n")
            if reformation_silence_ms is not None:
                f.write(f"  reformation_silence_ms: {reformation_silence_ms}\n")
            if etcd is not None:
                # One prefix per Nodes: jobs of two tests never meet.
                self.prefix = f"/gradd-pytest/{uuid.uuid4().hex[:12]}/"
                f.write(etcd.rendezvous_yaml(self.prefix, lease_ttl_ms=lease_ttl_ms))
        self.auth = node_token_args(self.dir)
        self.nodes = [None] * n
        self.dead = []  # (i, Daemon) of each killed daemon: its log stays
        try:
            if etcd is not None:
                self.coordinator = ""
                for i in range(n):
                    self.nodes[i] = self._start(i, [])
            else:
                port_file = os.path.join(self.dir, "coordinator.port")
                self.nodes[0] = self._start(0, ["--rendezvous-listen", "127.0.0.1:0",
                                                "--rendezvous-port-file", port_file])
                port = wait_port_file(port_file, self.nodes[0], self.stop)
                self.coordinator = f"127.0.0.1:{port}"
                for i in range(1, n):
                    self.nodes[i] = self._start(i, ["--coordinator", self.coordinator])
        except Exception:
            self.stop()
            raise

    def _start(self, i, extra):
        port_file = os.path.join(self.dir, f"metrics-{i}.port")
        if os.path.exists(port_file):
            os.unlink(port_file)
        return Daemon(self.binary, ["--node-id", f"node-{i}", "--config", self.config,
                                    "--metrics-listen", "127.0.0.1:0",
                                    "--metrics-port-file", port_file, *self.auth, *extra])

    def metrics(self, i):
        """Node i's /metrics text ("" when it cannot be read)."""
        try:
            with open(os.path.join(self.dir, f"metrics-{i}.port")) as f:
                port = int(f.read().strip())
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                return r.read().decode()
        except (OSError, ValueError):
            return ""

    def kill(self, i):
        """SIGKILL node i's daemon (its trainer is the caller's)."""
        d = self.nodes[i]
        d.proc.kill()
        d.proc.wait()
        self.dead.append((i, d))

    def restart(self, i):
        """Starts node i's daemon again, same node id and config (on the
        built-in store pointing at node-0's, as every node but node-0)."""
        self.nodes[i] = self._start(i, [] if self.etcd is not None
                                    else ["--coordinator", self.coordinator])

    def rank_env(self, rank):
        return dict(RANK=str(rank), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                    WORLD_SIZE=str(len(self.nodes)), GROUP_RANK=str(rank),
                    GRADD_SOCKET=self.nodes[rank].socket,
                    GRADD_COORDINATOR=self.coordinator)

    def logs(self):
        return "\n".join(f"--- node-{i}\n{n.log()}" for i, n in enumerate(self.nodes)
                         if n is not None)

    def save_logs(self, directory):
        """Copies every daemon's whole log, the killed ones' too, to
        directory (node-<i>-<n>.log, n counting the node's starts); returns
        the paths."""
        paths = []
        seen = {}
        for i, d in self.dead + [(i, n) for i, n in enumerate(self.nodes) if n is not None]:
            seen[i] = seen.get(i, 0) + 1
            path = os.path.join(directory, f"node-{i}-{seen[i]}.log")
            try:
                shutil.copyfile(d.log_path, path)
                paths.append(path)
            except OSError:
                pass
        return paths

    def stop(self):
        """Stops every daemon (SIGTERM: on etcd each revokes its lease, so
        stop this before the etcd cluster) and deletes their directory."""
        for n in reversed(self.nodes):
            if n is not None:
                n.stop()
        for _, d in self.dead:
            d.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def trainer_env(nodes, rank, job_id):
    """The environment of the trainer of global rank `rank` of `job_id` on
    `nodes` (Nodes): the caller's, without the test knobs a test may have
    left set (min_nodes, grace, pause/die/sleep, divisor, MASTER_*), plus
    the rank's variables and one thread each for OpenMP and OpenBLAS."""
    full = dict(os.environ)
    for var in ("GRADD_MIN_NODES", "GRADD_RANK_RESTART_GRACE_MS",
                "GRADD_TEST_PAUSE_AT_STEP", "GRADD_TEST_DIE_AT_STEP",
                "GRADD_TEST_STEP_SLEEP_S", "GRADD_TEST_DIVIDE_BY_INITIAL",
                "MASTER_ADDR", "MASTER_PORT"):
        full.pop(var, None)
    full.update(nodes.rank_env(rank))
    full.update(GRADD_JOB=job_id, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    return full


class TorchrunDaemons:
    """Two real gradd daemons configured as a fresh install is, except for
    a node id each and a free rendezvous port (29600 on real machines): no
    coordinator address, no listen address. Trainers get torchrun's
    environment only (plus GRADD_SOCKET, which on one machine stands for
    "my node's daemon"); the daemon on MASTER_ADDR's host (here both are;
    the first to bind wins) serves the rendezvous on demand."""

    def __init__(self, binary):
        self.dir = tempfile.mkdtemp(prefix="gradd-pytest-tr-")
        self.port = _free_port()
        self.master_port = _free_port()
        self.nodes = []
        auth = node_token_args(self.dir)
        try:
            for i in range(2):
                self.nodes.append(Daemon(binary, ["--node-id", f"host{i}",
                                                  "--rendezvous-port", str(self.port),
                                                  *auth]))
        except Exception:
            self.stop()
            raise

    def rank_env(self, rank, local_world_size):
        """What `torchrun --nnodes 2 --nproc_per_node L` gives global rank
        `rank` (RANK and WORLD_SIZE come from run_workers)."""
        node = rank // local_world_size
        return dict(
            LOCAL_RANK=str(rank % local_world_size),
            LOCAL_WORLD_SIZE=str(local_world_size),
            GROUP_RANK=str(node),
            GROUP_WORLD_SIZE="2",
            ROLE_RANK=str(rank),
            ROLE_WORLD_SIZE=str(2 * local_world_size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(self.master_port),
            GRADD_SOCKET=self.nodes[node].socket,
        )

    def logs(self):
        return "\n".join(f"--- {n.log_path}\n{n.log()}" for n in self.nodes)

    def alive(self):
        return all(n.proc.poll() is None for n in self.nodes)

    def stop(self):
        for n in reversed(self.nodes):
            n.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def graddctl():
    """The graddctl binary (GRADDCTL_BINARY under ctest, else the build tree's);
    skips the calling test when there is none."""
    path = os.environ.get("GRADDCTL_BINARY")
    if not path:
        guess = os.path.join(HERE, "..", "..", "build", "tools", "graddctl", "graddctl")
        if os.access(guess, os.X_OK):
            return os.path.abspath(guess)
        pytest.skip("GRADDCTL_BINARY is not set (run under ctest or set it by hand)")
    return path


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def torchrun_daemons(gradd_binary):
    """Two daemons discovering their coordinator; see TorchrunDaemons."""
    d = TorchrunDaemons(gradd_binary)
    yield d
    alive, logs = d.alive(), d.logs()
    d.stop()
    assert alive, f"a gradd daemon died during the tests:\n{logs}"


@pytest.fixture
def etcd_factory():
    """make(members=1) starts an etcd_cluster.EtcdCluster (mutual TLS) for
    the calling test; every one made is stopped and deleted at its end. A
    fixture that starts daemons on it depends on this one, so that its
    daemons stop first (each revokes its etcd lease)."""
    from etcd_cluster import EtcdCluster

    made = []

    def make(members=1):
        made.append(EtcdCluster(members=members))
        return made[-1]

    yield make
    for c in made:
        c.stop()


@pytest.fixture(scope="session")
def two_daemons(gradd_binary):
    """Two gradd daemons on loopback (multi-node jobs); see TwoDaemons."""
    d = TwoDaemons(gradd_binary)
    yield d
    alive, logs = d.alive(), d.logs()
    d.stop()
    assert alive, f"a gradd daemon died during the tests:\n{logs}"


@pytest.fixture
def job_id(request):
    name = re.sub(r"[^A-Za-z0-9._-]", "-", request.node.name)
    return f"{name}-{uuid.uuid4().hex[:8]}"


def run_workers(script, world, args, env_extra, timeout=120, rank_env=None, logs=None):
    """Runs `world` copies of `script` (rank in RANK), returns their stdouts;
    fails with every worker's output if one fails or runs past `timeout`.
    `rank_env(rank)` may return per-rank variables (e.g.
    TwoDaemons.rank_env) that override the single-node defaults; `logs()`
    (e.g. TwoDaemons.logs) is added to a failure's report."""
    procs = []
    for rank in range(world):
        env = dict(os.environ)
        env.update(env_extra)
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            OMP_NUM_THREADS="1",
            OPENBLAS_NUM_THREADS="1",
        )
        if rank_env is not None:
            env.update(rank_env(rank))
        procs.append(
            subprocess.Popen(
                [sys.executable, os.path.join(HERE, script), *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        )
    outs = []
    deadline = time.monotonic() + timeout
    failed = False
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    q.kill()
            out, err = p.communicate()
            err += b"\n[killed: timeout]"
            failed = True
        outs.append((p.returncode, out.decode(errors="replace"), err.decode(errors="replace")))
        failed = failed or p.returncode != 0
    if failed:
        report = "\n".join(
            f"--- rank {r}: exit {rc}\n{out}\n{err[-6000:]}" for r, (rc, out, err) in enumerate(outs)
        )
        if logs is not None:
            report += f"\n{logs()}"
        pytest.fail(f"{script} failed:\n{report}")
    return [out for _, out, _ in outs]


def rank_threads(world, fn, timeout=60):
    """fn(rank) in `world` threads of this process (ranks of one job through
    the binding, which releases the GIL while it waits); returns (results,
    errors), each by rank. Fails if a thread is still running after
    `timeout` seconds."""
    results, errors = [None] * world, [None] * world

    def body(rank):
        try:
            results[rank] = fn(rank)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors[rank] = e

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), f"rank thread still running after {timeout} s"
    return results, errors


def wait_port_file(port_file, daemon, stop, timeout=30):
    """The port `daemon` wrote to `port_file` (its --rendezvous-port-file);
    calls stop() and raises when it wrote none within `timeout` s or died."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(port_file) as f:
                port = int(f.read().strip() or 0)
        except (OSError, ValueError):
            port = 0
        if port > 0:
            return port
        if time.monotonic() > deadline or daemon.proc.poll() is not None:
            stop()
            raise RuntimeError(f"coordinator wrote no port:\n{daemon.log()}")
        time.sleep(0.02)
