"""Helpers for the tests of the daemon's /metrics endpoint: a daemon with
metrics on an OS-chosen port, scraping, parsing the exposition text, and a
real Prometheus server."""
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
import json
import sys

from conftest import HERE, Daemon


def read_port(path):
    """The port a daemon wrote to `path`, or 0 while it has not."""
    try:
        with open(path) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def wait_for(what, fn, timeout=30, interval=0.05):
    """Polls fn() until it returns something truthy; fails naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class MetricsDaemon(Daemon):
    """A gradd with /metrics on 127.0.0.1:<OS-chosen port> (self.metrics_port)
    and the given YAML config."""

    def __init__(self, binary, config_text="", extra_args=()):
        self.conf_dir = tempfile.mkdtemp(prefix="gradd-metrics-")
        config = os.path.join(self.conf_dir, "gradd.yaml")
        with open(config, "w") as f:
            f.write(config_text)
        port_file = os.path.join(self.conf_dir, "metrics.port")
        super().__init__(binary, ["--config", config, "--metrics-listen", "127.0.0.1:0",
                                  "--metrics-port-file", port_file, *extra_args])

        self.metrics_port = wait_for("the metrics port file", lambda: read_port(port_file))

    def scrape(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=10) as r:
            assert r.status == 200
            return r.read().decode()

    def stop(self):
        super().stop()
        shutil.rmtree(self.conf_dir, ignore_errors=True)


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def samples(text):
    """{(name, frozenset(labels)): value} of an exposition text."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, f"unparsable sample line: {line!r}"
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def value(text, name, **labels):
    """The value of series name{labels}, or None."""
    return samples(text).get((name, frozenset(labels.items())))


def metric_families(text):
    """Names declared by # TYPE lines, with their type."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """A real Prometheus server scraping `targets` every 250 ms, with its
    storage in a temporary directory. Prometheus cannot listen on port 0, so
    a free port is picked and the start retried if another process took it
    meanwhile."""

    def __init__(self, targets, attempts=5):
        self.dir = tempfile.mkdtemp(prefix="gradd-prometheus-")
        config = os.path.join(self.dir, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 250ms\n  scrape_timeout: 200ms\n"
                    "scrape_configs:\n  - job_name: gradd\n    static_configs:\n"
                    f"      - targets: {json.dumps(targets)}\n")
        self.log_path = os.path.join(self.dir, "prometheus.log")
        for _ in range(attempts):
            self.port = free_port()
            self._log = open(self.log_path, "wb")
            self.proc = subprocess.Popen(
                [shutil.which("prometheus"), f"--config.file={config}",
                 f"--storage.tsdb.path={os.path.join(self.dir, 'data')}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                wait_for("Prometheus to be ready", self._ready_or_exited, timeout=60)
            except AssertionError:
                self.stop()
                raise
            if self.proc.poll() is None:
                return
            self._log.close()
            if "address already in use" not in self.log():
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log()}")
        raise RuntimeError(f"prometheus found no free port in {attempts} attempts")

    def _ready_or_exited(self):
        if self.proc.poll() is not None:
            return True
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")[-4000:]

    def query(self, promql):
        """The instant query's result vector: [(labels, float value)]."""
        url = (f"http://127.0.0.1:{self.port}/api/v1/query?"
               + urllib.parse.urlencode({"query": promql}))
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read().decode())
        assert body["status"] == "success", body
        return [(s["metric"], float(s["value"][1])) for s in body["data"]["result"]]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self._log.closed:
            self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Trainer:
    """metrics_worker.py run: a job of two local ranks that stays attached
    until finish()."""

    def __init__(self, daemon, job_id, iterations):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "metrics_worker.py"), "run", daemon.socket,
             job_id, str(iterations)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True)
        line = self.proc.stdout.readline().decode().strip()  # bounded: wait_timeout
        if line != "READY":
            self.proc.kill()
            out, err = self.proc.communicate()
            raise AssertionError(f"trainer did not get ready ({line!r}):\n{err.decode()}\n"
                                 f"{daemon.log()}")

    def finish(self):
        out, err = self.proc.communicate(input=b"go\n", timeout=60)
        assert self.proc.returncode == 0 and b"DONE" in out, err.decode()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
