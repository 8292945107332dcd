"""Join (uneven inputs) through gradd._C directly, ranks as threads: exact
averages with both divide factors, the joined rank's memory untouched, the
sync from the highest active rank, the catch-up after the join (plain
iterations and broadcasts go on), throw_on_early_termination, misuse, and a
rank that dies while the others are in join mode."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import gradd
from test_client import run_ranks

PARAMS = [("w", (1000,), "float32"), ("v", (64,), "float64")]


def attach(daemon, job_id, rank, world):
    return gradd.attach(PARAMS, socket=daemon.socket, job_id=job_id, local_rank=rank,
                        local_world_size=world, bucket_cap_mb=0.001, first_bucket_cap_mb=0.001,
                        broadcast_bytes=4096, wait_timeout=60)


def step(c, value):
    for i in reversed(range(c.num_params)):
        c.gradient(i)[...] = value
        c.mark_ready(i)
    c.wait_all()
    return [c.gradient(i).copy() for i in range(c.num_params)]


@pytest.mark.parametrize("divide", [True, False])
def test_joined_ranks_contribute_zeros(daemon, job_id, divide):
    # Rank r has 3 - r inputs and writes 10 * (r + 1) + it: the highest
    # rank runs out first, so the sync root moves down and rank 0 is last.
    world = 3

    def inputs(r):
        return world - r

    def rank_fn(rank):
        c = attach(daemon, job_id, rank, world)
        assert c.num_buckets > 1
        c.join_enter(divide_by_initial_world_size=divide)
        assert c.in_join
        got = []
        for it in range(inputs(rank)):
            sync = np.full(16, rank, dtype=np.uint8)
            c.join_active(sync)
            # Buffers come from the highest rank active in the iteration.
            want_root = max(r for r in range(world) if it < inputs(r))
            assert (sync == want_root).all(), (rank, it, sync)
            got.append(step(c, 10 * (rank + 1) + it))
        mine = [c.gradient(i).copy() for i in range(c.num_params)]
        authoritative = c.join()
        assert not c.in_join
        # The joined rank's gradients were never written after it joined.
        for a, b in zip(mine, [c.gradient(i) for i in range(c.num_params)]):
            assert (a == b).all()
        # After the join: plain iterations and broadcasts line up again.
        after = step(c, rank)
        buf = np.full(8, rank, dtype=np.uint8)
        c.broadcast(buf, authoritative)
        it_after = c.iteration
        c.detach()
        return got, authoritative, after, buf, it_after

    results = run_ranks(world, rank_fn)
    for rank, (got, authoritative, after, buf, it_after) in enumerate(results):
        assert authoritative == 0  # the last to join
        assert (buf == 0).all()
        assert it_after == world + 2  # iterations 1..3 joined, 4 plain
        for it, grads in enumerate(got):
            active = [r for r in range(world) if it < inputs(r)]
            total = sum(10 * (r + 1) + it for r in active)
            want = total / (world if divide else len(active))
            for g in grads:
                assert np.allclose(g, want, rtol=1e-6), (rank, it, g[:3], want)
        for g in after:
            assert np.allclose(g, sum(range(world)) / world)


def test_rank_without_inputs(daemon, job_id):
    # Rank 1 has no inputs at all: it joins before the first iteration.
    def rank_fn(rank):
        c = attach(daemon, job_id, rank, 2)
        c.join_enter(divide_by_initial_world_size=False)
        got = [step(c, 4.0) for _ in range(2 if rank == 0 else 0)]
        authoritative = c.join()
        c.detach()
        return got, authoritative

    (got0, a0), (got1, a1) = run_ranks(2, rank_fn)
    assert a0 == a1 == 0
    assert not got1
    for grads in got0:
        for g in grads:
            assert np.allclose(g, 4.0)  # alone: divided by 1 active rank


def test_throw_on_early_termination(daemon, job_id):
    def rank_fn(rank):
        c = attach(daemon, job_id, rank, 2)
        c.join_enter(throw_on_early_termination=True)
        steps = 0
        try:
            for it in range(1 + 3 * rank):  # rank 0: 1 input, rank 1: 4
                c.join_active()
                step(c, 1.0)
                steps += 1
            c.join()
        except gradd.AbortedError as e:
            msg = str(e)
        else:
            msg = None
        in_join = c.in_join
        after = step(c, rank)  # the job goes on
        c.detach()
        return steps, msg, in_join, after

    (s0, m0, j0, a0), (s1, m1, j1, a1) = run_ranks(2, rank_fn)
    assert (s0, s1) == (1, 1)
    assert "Rank 0 exhausted all inputs" in m0
    assert "Detected at least one rank that exhausted inputs (global rank 0)" in m1
    assert not j0 and not j1
    assert np.allclose(a0[0], 0.5) and np.allclose(a1[0], 0.5)


def test_misuse_is_reported(daemon, job_id):
    def rank_fn(rank):
        c = attach(daemon, job_id, rank, 1)
        with pytest.raises(gradd.FailedPreconditionError, match="outside join mode"):
            c.join()
        c.mark_ready(1)
        with pytest.raises(gradd.FailedPreconditionError, match="middle of iteration"):
            c.join_enter()
        c.mark_ready(0)
        c.wait_all()
        c.join_enter(throw_on_early_termination=True)
        with pytest.raises(gradd.FailedPreconditionError, match="before JoinActive"):
            c.mark_ready(0)
        with pytest.raises(gradd.FailedPreconditionError, match="entered twice"):
            c.join_enter()
        with pytest.raises(gradd.FailedPreconditionError, match="Broadcast in join mode"):
            c.broadcast(np.zeros(4, dtype=np.uint8), 0)
        c.join_active(np.zeros(4, dtype=np.uint8))
        with pytest.raises(gradd.FailedPreconditionError, match="twice"):
            c.join_active(np.zeros(4, dtype=np.uint8))
        step(c, 1.0)
        assert c.join() == 0
        c.detach()

    run_ranks(1, rank_fn)


DYING_RANK = textwrap.dedent(
    """
    import os, sys
    import gradd
    c = gradd.attach([("w", (100,), "float32")], socket=sys.argv[1], job_id=sys.argv[2],
                     local_rank=1, local_world_size=2)
    c.join_enter()
    c.join_active()
    os._exit(3)  # dies in the middle of its iteration
    """
)


def test_rank_dying_in_join_fails_the_others(daemon, job_id):
    proc = subprocess.Popen([sys.executable, "-c", DYING_RANK, daemon.socket, job_id],
                            env=dict(os.environ))
    try:
        c = gradd.attach([("w", (100,), "float32")], socket=daemon.socket, job_id=job_id,
                         local_rank=0, local_world_size=2, wait_timeout=60)
        c.join_enter()
        with pytest.raises(gradd.GraddError, match="local rank 1 .*(disconnected|left)"):
            c.join()
    finally:
        assert proc.wait(timeout=30) == 3
