"""Bucket rebuild vs torch's own DDP (Gloo): a model registered in another
order than forward uses it, so the order gradients become ready in differs
from reverse registration. gradd must rebuild exactly when torch does (the
second forward; the third with static_graph; never with
find_unused_parameters), end up with torch's rebuilt buckets (sizes and
parameters, from torch's _get_ddp_logging_data()), and keep gradients and
parameters equal to torch's after every step across the switch.

Runs 2 ranks on one daemon, and 2 daemons x 2 ranks (a multi-node job over
loopback, node rank 0's order winning)."""
import pytest

from conftest import rank_threads, run_workers
from rebuild_checks import STEPS
from rebuild_checks import check as _check
from rebuild_checks import results as _results


@pytest.mark.parametrize(
    "mode,rebuild_at,world",
    [("plain", 1, 2), ("static", 2, 2), ("unused", None, 2), ("plain", 1, 3)],
)
def test_rebuild_matches_torch_one_node(daemon, job_id, tmp_path, mode, rebuild_at, world):
    outs = run_workers(
        "rebuild_worker.py",
        world,
        [mode, str(tmp_path / "gloo_init"), str(STEPS)],
        {"GRADD_SOCKET": daemon.socket, "GRADD_JOB": job_id},
        timeout=150,
    )
    _check(_results(outs), rebuild_at)


def test_rebuild_matches_torch_two_daemons(two_daemons, job_id, tmp_path):
    outs = run_workers(
        "rebuild_worker.py",
        4,
        ["plain", str(tmp_path / "gloo_init"), str(STEPS)],
        {"GRADD_JOB": job_id},
        timeout=200,
        rank_env=lambda r: two_daemons.rank_env(r, 2),
        logs=two_daemons.logs,
    )
    _check(_results(outs), 1)


# --- the binding (gradd._C) directly, ranks as threads ---------------------

_PARAMS = [("w0", (64,), "float32"), ("w1", (64,), "float32"), ("w2", (64,), "float32"), ("w3", (64,), "float32")]
_CAP = 256 / (1 << 20)  # 256 bytes: one float32 tensor of 64 per bucket


def _attach(daemon, job_id, rank):
    import gradd

    return gradd.attach(_PARAMS, socket=daemon.socket, job_id=job_id, local_rank=rank, local_world_size=2,
                        bucket_cap_mb=_CAP, first_bucket_cap_mb=_CAP, attach_timeout=20.0)


def _iteration(c, rank, order):
    for i in order:
        c.gradient(i)[...] = (rank + 1) * (i + 1) + c.iteration
        c.mark_ready(i)
    c.wait_all()


def test_client_rebuild_moves_gradients_and_follows_rank_zero(daemon, job_id):
    import numpy as np

    def fn(rank):
        c = _attach(daemon, job_id, rank)
        before = [c.bucket(b)["params"] for b in range(c.num_buckets)]
        # Rank 0 marks 0, 2, 1, 3; rank 1 the reverse: rank 0's order wins.
        _iteration(c, rank, [0, 2, 1, 3] if rank == 0 else [3, 1, 2, 0])
        order = list(c.ready_order)
        averaged = [c.gradient(i).copy() for i in range(4)]
        assert c.rebuild_buckets() and c.has_rebuilt_buckets
        assert not c.rebuild_buckets()  # once
        after = [c.bucket(b)["params"] for b in range(c.num_buckets)]
        moved = all(np.array_equal(c.gradient(i), averaged[i]) for i in range(4))
        _iteration(c, rank, [0, 1, 2, 3])
        values = [c.gradient(i).copy() for i in range(4)]
        c.detach()
        return before, order, after, moved, values

    results, errors = rank_threads(2, fn)
    assert errors == [None, None], errors
    for before, order, after, moved, values in results:
        assert before == [[3], [2], [1], [0]]
        assert after == [[0], [2], [1], [3]]
        assert moved, "a gradient lost its averaged value in the move"
        for i in range(4):  # iteration 2: average of (r + 1) * (i + 1) + 2
            assert (values[i] == 1.5 * (i + 1) + 2).all()
    assert results[0][1] == [0, 2, 1, 3] and results[1][1] == [3, 1, 2, 0]


def test_client_rank_skipping_rebuild_fails_both(daemon, job_id):
    import gradd

    def fn(rank):
        c = _attach(daemon, job_id, rank)
        _iteration(c, rank, [0, 1, 2, 3])
        try:
            if rank == 0:
                c.rebuild_buckets()
            else:
                _iteration(c, rank, [0, 1, 2, 3])  # goes on without rebuilding
        finally:
            c.detach()

    _, errors = rank_threads(2, fn)
    for e in errors:
        assert isinstance(e, gradd.GraddError), errors
        assert "started iteration 2 without rebuilding buckets" in str(e), e
