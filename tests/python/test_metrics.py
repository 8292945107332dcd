"""The daemon's Prometheus /metrics endpoint (docs/operations.md, "Metrics"),
scraped by a real Prometheus while a real trainer process runs a job."""
import shutil
import subprocess

import pytest

from metrics_util import (MetricsDaemon, Prometheus, Trainer, metric_families, value,
                          wait_for)

# What docs/operations.md promises; every one must be in a scrape.
EXPORTED = {
    "gradd_jobs": "gauge",
    "gradd_ranks_attached": "gauge",
    "gradd_shared_memory_bytes": "gauge",
    "gradd_attaches_total": "counter",
    "gradd_detaches_total": "counter",
    "gradd_job_failures_total": "counter",
    "gradd_stalls_total": "counter",
    "gradd_rendezvous_requests_total": "counter",
    "gradd_buckets_reduced_total": "counter",
    "gradd_reduced_bytes_total": "counter",
    "gradd_iterations_total": "counter",
    "gradd_communication_seconds_total": "counter",
    "gradd_communication_overlapped_seconds_total": "counter",
    "gradd_backward_overlap_ratio": "gauge",
    "gradd_phase_seconds": "histogram",
    "gradd_handover_wait_seconds": "histogram",
    "gradd_iteration_seconds": "histogram",
    "gradd_rank_restarts_total": "counter",
    "gradd_iterations_aborted_total": "counter",
    "gradd_job_world_size": "gauge",
}

ITERATIONS = 20


@pytest.fixture
def metrics_daemon(gradd_binary):
    d = MetricsDaemon(gradd_binary)
    yield d
    alive, log = d.proc.poll() is None, d.log()
    d.stop()
    assert alive, f"gradd died during the test:\n{log}"


def test_scrape_has_every_documented_metric_and_passes_promtool(metrics_daemon, job_id):
    trainer = Trainer(metrics_daemon, job_id, ITERATIONS)
    try:
        text = metrics_daemon.scrape()
        families = metric_families(text)
        for name, kind in EXPORTED.items():
            assert families.get(name) == kind, f"{name} ({kind}) missing from\n{text}"
        for name in families:
            assert name.startswith(("gradd_", "exposer_")), name
        assert value(text, "gradd_jobs") == 1
        assert value(text, "gradd_ranks_attached") == 2
        assert value(text, "gradd_attaches_total", code="OK") == 2
        assert value(text, "gradd_shared_memory_bytes") > 2 * 12000
        # 3 model buckets (one per parameter) a rank per iteration, plus the
        # client's own used-map bucket when it has one.
        buckets = value(text, "gradd_buckets_reduced_total", job_id=job_id)
        assert buckets >= 3 * ITERATIONS
        assert value(text, "gradd_reduced_bytes_total", job_id=job_id) >= 3 * 4000 * ITERATIONS
        assert value(text, "gradd_iterations_total", job_id=job_id) == ITERATIONS
        assert value(text, "gradd_job_world_size", job_id=job_id) == 2
        assert value(text, "gradd_rank_restarts_total") == 0
        assert value(text, "gradd_phase_seconds_count", phase="local_reduce") == buckets
        assert value(text, "gradd_iteration_seconds_count") == ITERATIONS - 1
        ratio = value(text, "gradd_backward_overlap_ratio", job_id=job_id)
        assert ratio is not None and 0 <= ratio <= 1
        if shutil.which("promtool"):
            check = subprocess.run(["promtool", "check", "metrics"], input=text.encode(),
                                   capture_output=True, timeout=60)
            assert check.returncode == 0, (check.stdout + check.stderr).decode()
    finally:
        if trainer.proc.poll() is None:
            trainer.finish()
    # The job's series go away with it; the daemon-wide ones stay.
    text = wait_for("the job's series to go",
                    lambda: (lambda t: t if job_id not in t else None)(metrics_daemon.scrape()))
    assert value(text, "gradd_jobs") == 0
    assert value(text, "gradd_ranks_attached") == 0
    assert value(text, "gradd_detaches_total", reason="detach") == 2
    assert value(text, "gradd_shared_memory_bytes") == 0


def test_failed_attach_is_counted_by_code(metrics_daemon, job_id):
    import gradd
    with pytest.raises(gradd.InvalidArgumentError):
        gradd.attach([("w", (4,), "float32")], socket=metrics_daemon.socket, job_id=job_id,
                     local_rank=5, local_world_size=2)
    text = metrics_daemon.scrape()
    assert value(text, "gradd_attaches_total", code="INVALID_ARGUMENT") == 1


def test_real_prometheus_scrapes_a_running_job(metrics_daemon, job_id):
    if shutil.which("prometheus") is None:
        pytest.fail("Prometheus is not installed (Debian package 'prometheus', "
                    "which scripts/setup installs)", pytrace=False)
    trainer = Trainer(metrics_daemon, job_id, ITERATIONS)
    prom = None
    try:
        prom = Prometheus([f"127.0.0.1:{metrics_daemon.metrics_port}"])

        def series(promql):
            return prom.query(promql)

        got = wait_for(
            "Prometheus to have scraped the job's buckets",
            lambda: series(f'gradd_buckets_reduced_total{{job_id="{job_id}"}}'), timeout=60)
        assert got[0][0]["job"] == "gradd"  # Prometheus' own scrape-job label
        assert got[0][1] >= 3 * ITERATIONS
        assert series('up{job="gradd"}')[0][1] == 1
        assert series("gradd_jobs")[0][1] == 1
        assert series('gradd_attaches_total{code="OK"}')[0][1] == 2
        phases = {m["phase"] for m, _ in series("gradd_phase_seconds_count")}
        assert phases == {"local_reduce", "network", "write_back"}
        assert series(f'gradd_iterations_total{{job_id="{job_id}"}}')[0][1] == ITERATIONS
        quantile = series("histogram_quantile(0.5, gradd_phase_seconds_bucket"
                          '{phase="local_reduce"})')
        assert quantile and quantile[0][1] > 0
    except Exception:
        if prom is not None:
            print(prom.log())
        raise
    finally:
        if prom is not None:
            prom.stop()
        if trainer.proc.poll() is None:
            trainer.finish()
