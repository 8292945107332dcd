"""The stall inspector (docs/operations.md, "Stalls"): a trainer process whose
local rank 1 stops handing over one bucket. The daemon logs the stall naming
the rank and the bucket's parameters, counts it in gradd_stalls_total, and
past stall_shutdown_ms fails the job with that report at every waiting
trainer."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from conftest import HERE, graddctl, node_token_args
from metrics_util import MetricsDaemon, read_port, value, wait_for


@pytest.fixture
def stall_daemon(gradd_binary):
    d = MetricsDaemon(gradd_binary, "stall_warning_ms: 300\nstall_shutdown_ms: 3000\n")
    yield d
    alive, log = d.proc.poll() is None, d.log()
    d.stop()
    assert alive, f"gradd died during the test:\n{log}"


def test_withheld_bucket_is_reported_counted_and_fails_the_job(stall_daemon, job_id):
    proc = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "metrics_worker.py"), "stall", stall_daemon.socket,
         job_id],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        # While the ranks wait: the warning is logged and counted (the log
        # line comes first, so the counter is up once it is there).
        # (Matched on iteration 2: on a loaded machine a rank may also be
        # slow enough in iteration 1 to be reported.)
        warning = _log_line(stall_daemon, "stall: job", "of iteration 2")
        assert value(stall_daemon.scrape(), "gradd_stalls_total") >= 1
        # ... and graddctl (the admin API) lists the stall while it lasts.
        ctl = subprocess.run(
            [graddctl(), "--socket", stall_daemon.socket, "--json", "job", job_id],
            capture_output=True, timeout=30)
        assert ctl.returncode == 0, ctl.stderr.decode() + ctl.stdout.decode()
        stalls = json.loads(ctl.stdout)["job"].get("stalls", [])
        assert any(s.get("missing_local_ranks") == [1] and "'b'" in s.get("message", "")
                   for s in stalls), stalls
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err.decode()
    errors = json.loads(out.decode().strip().splitlines()[-1])
    for needle in (f"job '{job_id}'", "local rank 1 has not handed it over", "'b'"):
        assert needle in warning, warning
    # Only the bucket holding "b" is missing: the others were handed over.
    assert "'a'" not in warning and "'c'" not in warning, warning
    # The waiting rank's wait ends in the report, with the shutdown reason;
    # the culprit itself was not waiting.
    e = errors[0]
    assert e is not None, "rank 0's wait did not fail"
    assert e.startswith("DeadlineExceededError"), e
    assert "local rank 1 has not handed it over" in e and "'b'" in e, e
    assert "stall_shutdown_ms (3000)" in e, e
    assert errors[1] is None, errors[1]
    text = stall_daemon.scrape()
    assert value(text, "gradd_stalls_total") >= 1
    assert value(text, "gradd_job_failures_total", code="DEADLINE_EXCEEDED") == 1


def _worker(daemon, job_id, *nodes):
    return subprocess.Popen(
        [sys.executable, os.path.join(HERE, "metrics_worker.py"), "stall", daemon.socket, job_id,
         *nodes], stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _log_line(daemon, *needles):
    """The first line of the daemon's log holding every needle (bounded wait)."""
    return wait_for(
        f"a line with {needles} in {daemon.log_path}",
        lambda: next((l for l in daemon.log().splitlines() if all(n in l for n in needles)),
                     None),
        timeout=60)


def test_multi_node_stall_names_the_node_and_its_missing_rank(gradd_binary, job_id):
    """Node b's local rank 1 withholds a bucket: node b names the rank, node a
    (whose ranks handed everything over) names node b as the one the
    inter-node allreduce waits for; node b's stall_shutdown fails the job."""
    tmp = tempfile.mkdtemp(prefix="gradd-stall-2n-")
    port_file = os.path.join(tmp, "coordinator.port")
    a = b = None
    procs = []
    try:
        auth = node_token_args(tmp)
        a = MetricsDaemon(gradd_binary, "stall_warning_ms: 300\n",
                          ["--node-id", "node-a", "--rendezvous-listen", "127.0.0.1:0",
                           "--rendezvous-port-file", port_file, *auth])
        coordinator = f"127.0.0.1:{wait_for('the coordinator port', lambda: read_port(port_file))}"
        b = MetricsDaemon(gradd_binary, "stall_warning_ms: 300\nstall_shutdown_ms: 3000\n",
                          ["--node-id", "node-b", "--coordinator", coordinator, *auth])
        procs = [_worker(a, job_id, "0", "2", coordinator, "0"),
                 _worker(b, job_id, "1", "2", coordinator, "1")]
        on_b = _log_line(b, "stall: job", "of iteration 2")
        on_a = _log_line(a, "stall: job", "of iteration 2")
        outs = [p.communicate(timeout=90) for p in procs]
        # The coordinator counted the formation's rendezvous requests, and
        # node a's buckets went through the inter-node allreduce.
        text_a = a.scrape()
        assert value(text_a, "gradd_rendezvous_requests_total", method="Set") > 0
        assert value(text_a, "gradd_phase_seconds_count", phase="network") >= 3
        assert value(b.scrape(), "gradd_rendezvous_requests_total", method="Set") == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
        logs = "".join(d.log() for d in (a, b) if d is not None)
        for d in (a, b):
            if d is not None:
                d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    assert "local rank 1 has not handed it over" in on_b and "'b'" in on_b, on_b
    assert "in the inter-node allreduce" in on_a and "'node-b' (node rank 1)" in on_a, on_a
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err.decode() + logs
    errors_a = json.loads(outs[0][0].decode().strip().splitlines()[-1])
    errors_b = json.loads(outs[1][0].decode().strip().splitlines()[-1])
    # Node b's waiting rank gets the report; node a's ranks fail too, as the
    # job is gone on node b, and are told which node went away.
    assert errors_b[0] is not None and "local rank 1 has not handed it over" in errors_b[0], \
        f"{errors_b}\n{logs}"
    assert errors_b[1] is None, errors_b[1]
    for e in errors_a:
        assert e is not None and "node-b" in e, f"{errors_a}\n{logs}"
