"""The stall inspector (docs/operations.md, "Stalls"): a trainer process whose
local rank 1 stops handing over one bucket. The daemon logs the stall naming
the rank and the bucket's parameters, counts it in gradd_stalls_total, and
past stall_shutdown_ms fails the job with that report at every waiting
trainer."""
import json
import os
import subprocess
import sys

import pytest

from conftest import HERE
from metrics_util import MetricsDaemon, value, wait_for


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
        log = wait_for("the stall warning in the daemon's log",
                       lambda: (lambda t: t if "stall: job" in t else None)(stall_daemon.log()),
                       timeout=60)
        assert value(stall_daemon.scrape(), "gradd_stalls_total") >= 1
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err.decode()
    errors = json.loads(out.decode().strip().splitlines()[-1])
    warning = next(line for line in log.splitlines() if "stall: job" in line)
    for needle in (f"job '{job_id}'", "of iteration 2", "local rank 1 has not handed it over",
                   "'b'"):
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
    assert value(text, "gradd_stalls_total") == 1
    assert value(text, "gradd_job_failures_total", code="DEADLINE_EXCEEDED") == 1
