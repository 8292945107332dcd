"""deploy/grafana/gradd-dashboard.json: every query of the dashboard names
only metrics a real daemon exports (read from a scrape of a daemon running a
job), and, when Prometheus is installed, every query is valid PromQL that a
real Prometheus scraping that daemon evaluates."""
import json
import os
import re
import shutil

import pytest

from conftest import HERE
from metrics_util import MetricsDaemon, Prometheus, Trainer, metric_families, wait_for

DASHBOARD = os.path.join(HERE, "..", "..", "deploy", "grafana", "gradd-dashboard.json")

# PromQL words that are not metric names.
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
             "or", "unless", "offset", "inf", "nan"}


def metric_names(expr):
    """The metric names an expression (or a Grafana label_values() query)
    selects: identifiers outside label matchers, grouping clauses, ranges and
    strings that are not function calls, keywords or Grafana variables."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    e = re.sub(r"\{[^}]*\}", " ", e)  # label matchers
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)  # ranges
    e = re.sub(r"\$\{?\w+\}?", " ", e)  # Grafana variables
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\()?", e):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    if expr.startswith("label_values("):
        names -= {re.search(r",\s*(\w+)\s*\)$", expr).group(1)}  # the label
    return names


def test_metric_names_finds_what_a_query_selects():
    assert metric_names('histogram_quantile(0.9, sum by (le, phase) '
                        '(rate(gradd_phase_seconds_bucket{instance=~"$instance"}'
                        '[$__rate_interval])))') == {"gradd_phase_seconds_bucket"}
    assert metric_names("rate(a_total[5m]) / on(job) group_left b + 2 * c") == {
        "a_total", "b", "c"}
    assert metric_names('label_values(gradd_jobs{x="y"}, instance)') == {"gradd_jobs"}


def dashboard_queries():
    with open(DASHBOARD) as f:
        dash = json.load(f)
    queries = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                queries.append((p["title"], t["expr"]))
            walk(p.get("panels", []))

    walk(dash["panels"])
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            queries.append((f"variable {v['name']}", q))
    return queries


def exported_names(text):
    names = set()
    for name, kind in metric_families(text).items():
        names.add(name)
        if kind == "histogram":
            names |= {name + "_bucket", name + "_sum", name + "_count"}
    return names


def test_every_dashboard_query_names_an_exported_metric(gradd_binary, job_id):
    queries = dashboard_queries()
    assert len(queries) >= 20
    d = MetricsDaemon(gradd_binary)
    trainer = prom = None
    try:
        trainer = Trainer(d, job_id, 5)
        exported = exported_names(d.scrape())
        used = set()
        for title, expr in queries:
            names = metric_names(expr)
            assert names, f"{title}: no metric in {expr!r}"
            missing = names - exported
            assert not missing, f"panel '{title}' queries {sorted(missing)}, which gradd does not export"
            used |= names
        # Every metric family the daemon exports is on the dashboard.
        families = {n for n in metric_families(d.scrape()) if n.startswith("gradd_")}
        unshown = {f for f in families if not any(u == f or u.startswith(f + "_") for u in used)}
        assert not unshown, f"not on the dashboard: {sorted(unshown)}"

        if shutil.which("prometheus") is None:
            pytest.fail("Prometheus is not installed (scripts/setup installs "
                        "it): PromQL not evaluated", pytrace=False)
        prom = Prometheus([f"127.0.0.1:{d.metrics_port}"])
        wait_for("a scrape", lambda: prom.query("gradd_jobs"), timeout=60)
        for title, expr in queries:
            if expr.startswith("label_values("):
                continue  # Grafana's, not PromQL
            promql = (expr.replace("$__rate_interval", "1m").replace("$instance", ".*")
                      .replace("$job_id", ".*"))
            prom.query(promql)  # asserts status success (valid PromQL)
        assert prom.query(f'gradd_buckets_reduced_total{{job_id=~".*"}}')
    finally:
        if prom is not None:
            prom.stop()
        if trainer is not None and trainer.proc.poll() is None:
            trainer.finish()
        d.stop()
