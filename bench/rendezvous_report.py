"""The report of bench/rendezvous_bench.py: per-figure min / median / max
over the rounds, etcd and store calls by method, and the table it prints
(the JSON it writes is summarize()'s result). Pure functions of the
rounds' records; split out of rendezvous_bench.py to keep each file under
800 lines."""
import os
import statistics

NODES = 3


def stats(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values),
            "n": len(values)}


def fmt_methods(d, digits=0):
    items = sorted(((k, v) for k, v in d.items() if round(v, digits) != 0),
                   key=lambda kv: -abs(kv[1]))
    return "(" + ", ".join(f"{k} {v:.{digits}f}" for k, v in items) + ")" if items else "()"


def median_by_method(dicts):
    keys = set().union(*dicts) if dicts else set()
    return {k: statistics.median(d.get(k, 0.0) for d in dicts) for k in keys}


def summarize(args, results, rates, failures):
    def total(d):
        return sum(d.values())

    figures = [
        ("formation: last attach -> formed on all nodes", "ms",
         lambda r: r.get("formed_ms")),
        ("formation: last attach -> first step on all", "ms",
         lambda r: r.get("first_step_ms")),
        ("node loss: kill -> next step on survivors", "ms",
         lambda r: r.get("node_loss_ms")),
        ("rank restart: kill -> next step on survivors", "ms",
         lambda r: r.get("restart_ms")),
        ("rank restart: new attach -> next step", "ms",
         lambda r: r.get("rejoin_ms")),
        ("ordinary step (node loss job, before the kill)", "ms",
         lambda r: r.get("step_ms")),
        ("rendezvous calls per formation", "calls",
         lambda r: total(r["formation_calls"]) if "formation_calls" in r else None),
        ("rendezvous calls per job end", "calls",
         lambda r: total(r["end_calls"]) if "end_calls" in r else None),
        ("rendezvous calls/s, idle elastic job", "calls/s",
         lambda r: total(r["idle_calls_per_s"]) if "idle_calls_per_s" in r else None),
    ]
    summary = {"config": {k: getattr(args, k) for k in (
        "rounds", "idle_s", "lease_ttl_ms", "reformation_silence_ms", "reformation_settle_ms",
        "step_sleep_ms", "grace_ms", "warmup", "tail_steps", "etcd_members")},
        "machine": {"cpus": os.cpu_count(), "load_start": args.load_start,
                    "load_end": os.getloadavg()},
        "figures": [], "failures": failures}
    for label, unit, get in figures:
        row = {"figure": label, "unit": unit}
        for name in results:
            row[name] = stats([get(r) for r in results[name]])
        summary["figures"].append(row)
    summary["figures"].append({"figure": "rendezvous calls/s, no job (daemons only)",
                               "unit": "calls/s", **{
                                   name: stats([total(rates[name])]) for name in rates}})
    breakdown = {}
    for name in results:
        recs = [r for r in results[name] if "formation_calls" in r]
        breakdown[name] = {
            "formation": median_by_method([r["formation_calls"] for r in recs]),
            "job_end": median_by_method([r["end_calls"] for r in recs]),
            "idle_per_s": median_by_method([r["idle_calls_per_s"] for r in recs]),
            "no_job_per_s": rates[name],
        }
        if name == "etcd":
            breakdown[name]["daemons_formation"] = median_by_method(
                [r["formation_calls_daemons"] for r in recs])
            breakdown[name]["daemons_idle_per_s"] = median_by_method(
                [r["idle_calls_daemons_per_s"] for r in recs])
    summary["by_method"] = breakdown
    summary["raw"] = results
    return summary


def print_table(args, summary):
    c = summary["config"]
    print(f"rendezvous_bench: {NODES} nodes on loopback, one gradd.torch trainer each "
          f"(tests/python elastic_worker / restart_worker), {c['rounds']} rounds, "
          f"backends alternating")
    print(f"  builtin: node-0 serves the store, reformation_silence_ms {c['reformation_silence_ms']}; "
          f"etcd: {c['etcd_members']} member(s), mTLS, lease_ttl_ms {c['lease_ttl_ms']}; "
          f"both: reformation_settle_ms {c['reformation_settle_ms']}, step sleep {c['step_sleep_ms']} ms, "
          f"rank_restart_grace_ms {c['grace_ms']}, idle window {c['idle_s']:g} s")
    m = summary["machine"]
    print(f"  machine: {m['cpus']} CPUs; load average (1, 5, 15 min) at the start "
          f"{', '.join(f'{x:.2f}' for x in m['load_start'])}, at the end "
          f"{', '.join(f'{x:.2f}' for x in m['load_end'])}")
    names = [n for n in ("builtin", "etcd") if n in summary["figures"][0]]
    head = f"{'figure':46s} {'unit':>7s}"
    for n in names:
        head += f" | {n + ' min':>11s} {'median':>8s} {'max':>8s}"
    print(head)
    for row in summary["figures"]:
        line = f"{row['figure']:46s} {row['unit']:>7s}"
        for n in names:
            s = row.get(n)
            if s is None:
                line += f" | {'n/a':>11s} {'':>8s} {'':>8s}"
            else:
                digits = 0 if row["unit"] == "calls" else 1
                line += (f" | {s['min']:11.{digits}f} {s['median']:8.{digits}f} "
                         f"{s['max']:8.{digits}f}")
        print(line)
    print("calls by method (median over rounds; builtin: node-0's rendezvous service, "
          "etcd: etcd's gRPC server):")
    for n in names:
        b = summary["by_method"][n]
        print(f"  {n:8s} formation {fmt_methods(b['formation'])}")
        print(f"  {'':8s} job end   {fmt_methods(b['job_end'])}")
        print(f"  {'':8s} idle /s   {fmt_methods(b['idle_per_s'], 2)}")
        print(f"  {'':8s} no job /s {fmt_methods(b['no_job_per_s'], 2)}")
        if n == "etcd":
            print(f"  {'':8s} as the daemons count their etcd calls "
                  f"(gradd_etcd_requests_total, 3 nodes): formation "
                  f"{fmt_methods(b['daemons_formation'])}, idle /s "
                  f"{fmt_methods(b['daemons_idle_per_s'], 2)}")
    for n, fails in summary["failures"].items():
        for f in fails:
            print(f"FAILED [{n}] {f.splitlines()[0]}")
