"""join() for uneven inputs vs torch's own DDP + join (Gloo).

Each worker (join_worker.py) trains first with torch DDP under torch's join
and then, with no torch process group at all, with gradd under join: same
model, seed and per-rank data, different initial weights per rank, rank r
gets 3 + 2r batches. Gradients, parameters and buffers must agree after every
step, the final (synced) model must agree, and with
throw_on_early_termination every rank must raise at the same step.
One node (2 and 3 ranks) and two daemons x two ranks (torch: 4 processes).
"""
import json

import pytest

from conftest import run_workers

TOL = 1e-5


def _results(outs):
    return sorted((json.loads(o.strip().splitlines()[-1]) for o in outs), key=lambda r: r["rank"])


def _check(results, world, throw=False, enable=True):
    for r in results:
        ref_steps, our_steps = r["steps"]
        ref_error, our_error = r["errors"]
        assert our_steps == ref_steps, r
        assert len(r["per_step"]) == our_steps
        for step, err in enumerate(r["per_step"]):
            assert err <= TOL, f"rank {r['rank']} step {step}: relative error {err}"
        assert r["num_buckets"] > 1, r
        assert not r["in_join_after"], r
        if throw:
            # torch: the rank that ran out raises "Rank 0 exhausted all
            # inputs.", the others "Detected at least one rank ...".
            assert ref_error is not None and our_error is not None, r
            if r["rank"] == 0:
                assert "Rank 0 exhausted all inputs" in our_error, our_error
            else:
                assert "Detected at least one rank that exhausted inputs" in our_error
                assert "global rank 0" in our_error, our_error
        else:
            assert ref_error is None and our_error is None, r
            assert r["final_err"] <= TOL, r
            if enable:
                # The last to join, highest rank among them (torch's rule).
                assert r["authoritative"] == world - 1, r
    if not throw:
        assert len({r["checksum"] for r in results}) == 1, "ranks ended with different models"


@pytest.mark.parametrize(
    "world,model,api,divide",
    [
        (2, "mlp", "method", 1),
        (2, "mlp", "generic", 0),
        (3, "cnn_bn", "generic", 1),  # BatchNorm buffers, broadcast_buffers
        (3, "mlp", "method", 0),
    ],
)
def test_join_matches_torch(daemon, job_id, tmp_path, world, model, api, divide):
    outs = run_workers(
        "join_worker.py",
        world,
        [model, str(tmp_path / "gloo_init"), api, str(divide), "0", "1"],
        {"GRADD_SOCKET": daemon.socket, "GRADD_JOB": job_id},
        timeout=150,
    )
    _check(_results(outs), world)


def test_join_throw_on_early_termination(daemon, job_id, tmp_path):
    outs = run_workers(
        "join_worker.py",
        3,
        ["mlp", str(tmp_path / "gloo_init"), "generic", "1", "1", "1"],
        {"GRADD_SOCKET": daemon.socket, "GRADD_JOB": job_id},
        timeout=150,
    )
    results = _results(outs)
    _check(results, 3, throw=True)
    assert all(r["steps"][1] == 3 for r in results), results


def test_join_disabled_is_a_no_op(daemon, job_id, tmp_path):
    # enable=False with even inputs: plain DDP on both sides.
    outs = run_workers(
        "join_worker.py",
        2,
        ["mlp", str(tmp_path / "gloo_init"), "method", "1", "0", "0"],
        {"GRADD_SOCKET": daemon.socket, "GRADD_JOB": job_id},
        timeout=150,
    )
    results = _results(outs)
    _check(results, 2, enable=False)
    assert all(r["authoritative"] is None for r in results)


# ---------------------------------------------------------------- 2 nodes
def _run_two_nodes(two_daemons, job_id, args, timeout=180):
    """4 workers: global rank r on node r // 2 as local rank r % 2."""
    return run_workers(
        "join_worker.py",
        4,
        args,
        {"GRADD_JOB": job_id, "GRADD_NUM_NODES": "2"},
        timeout=timeout,
        rank_env=lambda r: two_daemons.rank_env(r, 2),
        logs=two_daemons.logs,
    )


@pytest.mark.parametrize("model,divide", [("cnn_bn", 0), ("mlp", 1)])
def test_join_two_daemons_matches_torch(two_daemons, job_id, tmp_path, model, divide):
    # Node a (ranks 0, 1: 3 and 5 batches) runs out first; its daemon keeps
    # matching node b's collectives (zeros, buffer syncs) until rank 3 joins.
    outs = _run_two_nodes(
        two_daemons, job_id, [model, str(tmp_path / "gloo_init"), "generic", str(divide), "0", "1"]
    )
    _check(_results(outs), 4)


def test_join_two_daemons_throw(two_daemons, job_id, tmp_path):
    outs = _run_two_nodes(
        two_daemons, job_id, ["mlp", str(tmp_path / "gloo_init"), "method", "1", "1", "1"]
    )
    results = _results(outs)
    _check(results, 4, throw=True)
    assert all(r["steps"][1] == 3 for r in results), results
