"""The client library's used map (ClientOptions::find_unused_parameters)
through gradd._C, two ranks as threads: the hidden parameter is invisible
(indices, num_params, bucket contents), GloballyUsed is the OR over ranks of
MarkReady (an exactly-zero gradient counts as used), MarkUnused contributes
zeros or the memory as it is, SkipUsedMap counts everything as used, and
errors name the caller's indices."""
import numpy as np
import pytest

import gradd
from test_client import run_ranks

PARAMS = [("a", (40,), "float32"), ("b", (3, 5), "float32"), ("c", (7,), "float64"),
          ("d", (9,), "float32")]


def attach(daemon, job_id, rank):
    return gradd.attach(PARAMS, socket=daemon.socket, job_id=job_id, local_rank=rank,
                        local_world_size=2, bucket_cap_mb=0.0001, first_bucket_cap_mb=0.0001,
                        find_unused_parameters=True)


def test_used_map_is_hidden_and_reduced(daemon, job_id):
    def rank_fn(rank):
        c = attach(daemon, job_id, rank)
        try:
            assert c.num_params == 4
            listed = sorted(i for b in range(c.num_buckets) for i in c.bucket(b)["params"])
            assert listed == [0, 1, 2, 3]
            with pytest.raises(IndexError):
                c.mark_ready(4)
            out = []
            # it 1: a used by rank 0 only (zero gradient!), b by nobody, c by
            #       rank 1 with kept memory on rank 0, d by both.
            for i in range(4):
                c.gradient(i)[...] = rank + 1
            c.gradient(0)[...] = 0.0
            if rank == 0:
                c.mark_ready(0)
                c.mark_unused(2, keep=True)
            else:
                c.mark_unused(0)
                c.mark_ready(2)
            c.mark_unused(1)
            c.mark_ready(3)
            c.wait_all()
            out.append(([c.globally_used(i) for i in range(4)], c.globally_used_all(),
                        [c.gradient(i).astype(np.float64).copy() for i in range(4)]))
            # it 2: nobody uses anything; it 3: the map skipped.
            for i in range(4):
                c.mark_unused(i)
            c.wait_all()
            out.append(c.globally_used_all())
            c.skip_used_map()
            for i in range(4):
                c.mark_unused(i)
            c.wait_all()
            out.append(c.globally_used_all())
            # Errors name the caller's indices and names.
            c.mark_ready(1)
            with pytest.raises(gradd.FailedPreconditionError, match=r"'b' \(index 1\).*twice"):
                c.mark_unused(1)
            with pytest.raises(gradd.FailedPreconditionError,
                               match=r"3 of 4 parameters.*'a' \(index 0\)"):
                c.wait_all()
            for i in (0, 2, 3):
                c.mark_ready(i)
            c.wait_all()
            out.append(c.globally_used_all())
            return out
        finally:
            c.detach()

    for first, nobody, skipped, last in run_ranks(2, rank_fn):
        used, used_all, grads = first
        assert used == used_all == [True, False, True, True]
        assert np.all(grads[0] == 0)               # an exactly-zero gradient still counts
        assert np.all(grads[1] == 0)               # zeros from both
        assert np.allclose(grads[2], (1 + 2) / 2)  # rank 0 kept its memory (1)
        assert np.allclose(grads[3], 1.5)
        assert nobody == [False] * 4
        assert skipped == [True] * 4
        assert last == [True] * 4


def test_used_map_iterations(daemon, job_id):
    def rank_fn(rank):
        c = attach(daemon, job_id, rank)
        try:
            res = []
            for it in range(3):
                for i in range(4):
                    if (i + it + rank) % 3 == 0:
                        c.mark_ready(i)
                    else:
                        c.mark_unused(i)
                c.wait_all()
                res.append(c.globally_used_all())
            return res
        finally:
            c.detach()

    r0, r1 = run_ranks(2, rank_fn)
    assert r0 == r1
    for it in range(3):
        assert r0[it] == [any((i + it + r) % 3 == 0 for r in range(2)) for i in range(4)]


def test_without_used_map(daemon, job_id):
    c = gradd.attach([("w", (4,), "float32")], socket=daemon.socket, job_id=job_id)
    try:
        with pytest.raises(gradd.FailedPreconditionError, match="find_unused_parameters"):
            c.mark_unused(0)
        c.skip_used_map()  # a no-op
        c.mark_ready(0)
        c.wait_all()
        assert c.globally_used(0)
    finally:
        c.detach()


def test_ranks_disagreeing_on_the_used_map(daemon, job_id):
    def rank_fn(rank):
        try:
            gradd.attach(PARAMS, socket=daemon.socket, job_id=job_id, local_rank=rank,
                         local_world_size=2, attach_timeout=20,
                         find_unused_parameters=rank == 0)
        except gradd.GraddError as e:
            return e
        return None

    for err in run_ranks(2, rank_fn):
        assert isinstance(err, gradd.InvalidArgumentError), err
        assert "find_unused_parameters used map" in str(err), str(err)
