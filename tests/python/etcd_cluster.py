"""Test-only: a real etcd (Debian's etcd-server) for the Python suite's
rendezvous.backend: etcd tests (issue 34), the Python counterpart of
tests/integration/etcd_cluster.{h,cc}.

One or three members on loopback, every port chosen by the OS, data, logs
and certificates in one temporary directory. With `tls` (the default) each
member serves TLS with node.crt of tests/tools/make_test_certs.sh (made
fresh in that directory; SAN 127.0.0.1) and demands a client certificate
of the same test CA (--client-cert-auth), so the daemons reach it over
mutual TLS, as a production cluster would be set up.

    cluster = EtcdCluster(members=3)
    try:
        cluster.kill(0)          # SIGKILL, its data stays
        cluster.restart(0)       # same name, ports and data: rejoins
        cluster.kill_all(); cluster.restart_all()
        yaml = cluster.rendezvous_yaml("/gradd-test-x/")  # under rendezvous:
    finally:
        cluster.stop()           # kills every member, deletes the directory

Every start waits until each member answers etcd's /health over the same
TLS a daemon uses (60 s by default: on a loaded 2-core machine etcd takes
seconds to come up); a member that exits or does not answer raises
EtcdError with the tail of its log. Members are started in their own
session, so a test's SIGKILL of a daemon never reaches them.
"""
import base64
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
MAKE_CERTS = os.path.join(HERE, "..", "tools", "make_test_certs.sh")
DEFAULT_BINARY = "/usr/bin/etcd"


class EtcdError(RuntimeError):
    pass


def etcd_binary():
    """$GRADD_TEST_ETCD_BINARY when set (as for the C++ launcher), else
    Debian's /usr/bin/etcd."""
    return os.environ.get("GRADD_TEST_ETCD_BINARY") or DEFAULT_BINARY


def have_etcd():
    return os.access(etcd_binary(), os.X_OK)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Member:
    def __init__(self, name, client_port, peer_port):
        self.name = name
        self.client_port = client_port
        self.peer_port = peer_port
        self.proc = None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None


class EtcdCluster:
    """`members` etcd members on loopback (see the module doc)."""

    def __init__(self, members=1, tls=True, startup_timeout=60.0):
        if members < 1:
            raise ValueError("an etcd cluster needs at least one member")
        self.binary = etcd_binary()
        if not os.access(self.binary, os.X_OK):
            raise EtcdError(f"{self.binary} is missing or not executable: scripts/setup "
                            "installs etcd-server")
        self.tls = tls
        self.startup_timeout = startup_timeout
        self.dir = tempfile.mkdtemp(prefix="gradd-pytest-etcd-")
        self.certs = os.path.join(self.dir, "certs")
        self._token = f"gradd-pytest-{os.getpid()}-{os.path.basename(self.dir)}"
        self._members = []
        try:
            if tls:
                self._make_certs()
            for i in range(members):
                self._members.append(_Member(f"m{i}", _free_port(), _free_port()))
            # Every member first: a member of several answers only once a
            # quorum of them is up and has elected a leader.
            for i in range(members):
                self._launch(i)
            for i in range(members):
                self._wait_healthy(i)
        except BaseException:
            self.stop()
            raise

    # ----------------------------------------------------------- files
    @property
    def ca_file(self):
        return os.path.join(self.certs, "ca.crt")

    @property
    def cert_file(self):
        return os.path.join(self.certs, "node.crt")

    @property
    def key_file(self):
        return os.path.join(self.certs, "node.key")

    def _make_certs(self):
        out = subprocess.run(["sh", MAKE_CERTS, self.certs], capture_output=True, timeout=120)
        if out.returncode != 0:
            raise EtcdError(f"{MAKE_CERTS} {self.certs} failed ({out.returncode}):\n"
                            f"{out.stdout.decode(errors='replace')}"
                            f"{out.stderr.decode(errors='replace')}")

    def log_path(self, i):
        return os.path.join(self.dir, f"{self._members[i].name}.log")

    def log_tail(self, i, limit=3000):
        try:
            with open(self.log_path(i), "rb") as f:
                text = f.read().decode(errors="replace")
        except OSError:
            return "(no log)"
        return text[-limit:] if text else "(empty)"

    def logs(self):
        """Every member's log tail, for a failure's report."""
        return "\n".join(f"--- etcd {m.name} ({self.endpoints[i]})\n{self.log_tail(i)}"
                         for i, m in enumerate(self._members))

    # ------------------------------------------------------- addresses
    @property
    def members(self):
        return len(self._members)

    @property
    def endpoints(self):
        """host:port of every member's client URL, in member order."""
        return [f"127.0.0.1:{m.client_port}" for m in self._members]

    def _url(self, i, path):
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self._members[i].client_port}{path}"

    def rendezvous_yaml(self, prefix, lease_ttl_ms=3000):
        """The lines a daemon's config needs under `rendezvous:` (indented
        by two spaces) to keep its rendezvous on this cluster: the backend,
        every endpoint, the client certificate, key and CA, the key prefix
        (one per test, so that tests sharing a cluster never meet) and the
        daemon's lease TTL."""
        if not prefix.startswith("/"):
            raise ValueError(f"an etcd prefix starts with '/': {prefix!r}")
        lines = ["  backend: etcd", "  etcd:",
                 f"    endpoints: {','.join(self.endpoints)}",
                 f"    prefix: {prefix}",
                 f"    lease_ttl_ms: {lease_ttl_ms}"]
        if self.tls:
            lines += [f"    ca_file: {self.ca_file}", f"    cert_file: {self.cert_file}",
                      f"    key_file: {self.key_file}"]
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------- processes
    def _launch(self, i, initial=True):
        m = self._members[i]
        scheme = "https" if self.tls else "http"
        client_url = f"{scheme}://127.0.0.1:{m.client_port}"
        peer_url = f"http://127.0.0.1:{m.peer_port}"
        cluster = ",".join(f"{o.name}=http://127.0.0.1:{o.peer_port}" for o in self._members)
        args = [self.binary, "--name", m.name,
                "--data-dir", os.path.join(self.dir, f"{m.name}.data"),
                "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                "--initial-cluster", cluster,
                # A restarted member finds its membership in its data
                # directory; "existing" says it joins a running cluster.
                "--initial-cluster-state", "new" if initial else "existing",
                "--initial-cluster-token", self._token,
                # Short elections: a killed leader's successor within a
                # second, well inside the daemons' lease TTL.
                "--heartbeat-interval", "50", "--election-timeout", "500"]
        if self.tls:
            args += [f"--cert-file={self.cert_file}", f"--key-file={self.key_file}",
                     f"--trusted-ca-file={self.ca_file}", "--client-cert-auth"]
        with open(self.log_path(i), "ab") as log:
            log.write(f"==== {time.strftime('%H:%M:%S')} start {' '.join(args)}\n".encode())
            log.flush()
            m.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True)

    def _context(self):
        if not self.tls:
            return None
        ctx = ssl.create_default_context(cafile=self.ca_file)
        ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    def _request(self, i, path, body=None, timeout=2.0):
        """JSON of member i's answer to `path` (GET, or POST of `body`
        to etcd's gRPC gateway)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self._url(i, path), data=data,
                                     method="GET" if body is None else "POST")
        with urllib.request.urlopen(req, timeout=timeout, context=self._context()) as r:
            return json.loads(r.read().decode())

    def keys(self, prefix, i=None):
        """The keys under `prefix` (str), read through a live member's gRPC
        gateway with the test client certificate."""
        members = [i] if i is not None else [m for m in range(self.members)
                                             if self.alive(m)]
        start = prefix.encode()
        end = bytearray(start)
        end[-1] += 1  # the prefix's range end
        body = {"key": base64.b64encode(start).decode(),
                "range_end": base64.b64encode(bytes(end)).decode(),
                "keys_only": True}
        got = self._request(members[0], "/v3/kv/range", body)
        return sorted(base64.b64decode(kv["key"]).decode() for kv in got.get("kvs", []))

    def _wait_healthy(self, i):
        m = self._members[i]
        deadline = time.monotonic() + self.startup_timeout
        last = "no answer yet"
        while True:
            if not m.alive():
                rc = m.proc.returncode if m.proc is not None else None
                raise EtcdError(f"etcd member {m.name} ({self.binary}) exited with {rc} before "
                                f"answering; the tail of its log:\n{self.log_tail(i)}")
            try:
                # /health: a leader, and a linearizable read served.
                if self._request(i, "/health").get("health") == "true":
                    return
                last = "health false"
            except urllib.error.HTTPError as e:  # 503 while it has no leader
                last = f"HTTP {e.code}"
            except (OSError, ValueError) as e:
                last = f"{type(e).__name__}: {e}"
            if time.monotonic() > deadline:
                raise EtcdError(f"etcd member {m.name} ({self.binary}) did not answer within "
                                f"{self.startup_timeout:.0f} s ({last}); the tail of its "
                                f"log:\n{self.log_tail(i)}")
            time.sleep(0.1)

    def alive(self, i):
        return self._members[i].alive()

    def kill(self, i):
        """SIGKILLs member i (no-op when it is not running); its data
        directory stays, so restart(i) brings the same member back."""
        m = self._members[i]
        if m.proc is not None and m.proc.poll() is None:
            m.proc.send_signal(signal.SIGKILL)
            m.proc.wait()
        m.proc = None

    def kill_all(self):
        for i in range(len(self._members)):
            self.kill(i)

    def restart(self, i, wait=True):
        """Starts member i again (killing it first if it runs) on its ports
        and data; with `wait`, until it answers (which a member of several
        does only with a quorum up)."""
        self.kill(i)
        self._launch(i, initial=False)
        if wait:
            self._wait_healthy(i)

    def restart_all(self):
        for i in range(len(self._members)):
            self.restart(i, wait=False)
        for i in range(len(self._members)):
            self._wait_healthy(i)

    # ------------------------------------------------------ leadership
    def _status(self, i):
        """(this member's id, its leader's id) from its Maintenance.Status;
        ids are decimal strings (the gateway's JSON of uint64)."""
        st = self._request(i, "/v3/maintenance/status", {})
        return str(st["header"]["member_id"]), str(st["leader"])

    def member_id(self, i):
        return self._status(i)[0]

    def leader(self, timeout=10.0):
        """Index of the current leader as the running members see it."""
        deadline = time.monotonic() + timeout
        last = None
        while True:
            ids, leaders = {}, set()
            for i, m in enumerate(self._members):
                if not m.alive():
                    continue
                try:
                    me, lead = self._status(i)
                except (OSError, ValueError, KeyError) as e:
                    last = e
                    continue
                ids[me] = i
                if lead != "0":
                    leaders.add(lead)
            if len(leaders) == 1 and next(iter(leaders)) in ids:
                return ids[next(iter(leaders))]
            if time.monotonic() > deadline:
                raise EtcdError(f"no single etcd leader among the running members within "
                                f"{timeout:.0f} s (ids {ids}, leaders {leaders}, {last})\n"
                                f"{self.logs()}")
            time.sleep(0.1)

    def move_leader(self, to, timeout=10.0):
        """Hands leadership to member `to` (Maintenance.MoveLeader, asked of
        the current leader) and waits until every running member agrees."""
        deadline = time.monotonic() + timeout
        while True:
            lead = self.leader(timeout)
            if lead == to:
                return
            try:
                self._request(lead, "/v3/maintenance/transfer-leadership",
                              {"targetID": self.member_id(to)}, timeout=5.0)
            except (OSError, ValueError) as e:
                if time.monotonic() > deadline:
                    raise EtcdError(f"etcd did not move its leader to m{to}: {e}") from e
            if time.monotonic() > deadline:
                raise EtcdError(f"etcd's leader is still m{lead}, not m{to}, after "
                                f"{timeout:.0f} s")
            time.sleep(0.2)

    # ------------------------------------------------------------ end
    def stop(self):
        """Kills every member and deletes data, logs and certificates."""
        self.kill_all()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
