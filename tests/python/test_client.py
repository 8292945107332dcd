"""gradd._C: the binding over the C++ client, two ranks as threads of this
process (attach, mark_ready and wait_all release the GIL)."""
import time

import numpy as np
import pytest

import gradd
from conftest import rank_threads


def run_ranks(world, fn, timeout=60):
    """fn(rank) in `world` threads; returns results, re-raises the first error."""
    results, errors = rank_threads(world, fn, timeout)
    for e in errors:
        if e is not None:
            raise e
    return results


PARAMS = [("a", (300, 7), "float32"), ("b", (5000,), "float32"), ("c", (33,), "float64"),
          ("d", (10, 10), "float16")]


def test_average_and_views(daemon, job_id):
    def rank_fn(rank):
        c = gradd.attach(PARAMS, socket=daemon.socket, job_id=job_id, local_rank=rank,
                         local_world_size=2, bucket_cap_mb=0.005, first_bucket_cap_mb=0.005)
        assert (c.global_rank, c.world_size, c.local_rank, c.local_world_size) == (rank, 2, rank, 2)
        assert c.num_params == 4 and c.num_buckets > 1
        assert sorted(i for b in range(c.num_buckets) for i in c.bucket(b)["params"]) == [0, 1, 2, 3]
        out = []
        for it in range(3):
            assert c.iteration == it + 1
            for i in reversed(range(c.num_params)):
                g = c.gradient(i)
                assert g.ctypes.data == c.gradient_address(i)
                assert g.nbytes == c.gradient_nbytes(i)
                g[...] = (rank + 1) * (i + 1) + it
                c.mark_ready(i)
            c.wait_all()
            out.append([c.gradient(i).astype(np.float64).copy() for i in range(c.num_params)])
        c.detach()
        return out

    results = run_ranks(2, rank_fn)
    for rank in range(2):
        for it in range(3):
            for i in range(4):
                expected = (1 + 2) * (i + 1) / 2 + it
                np.testing.assert_allclose(results[rank][it][i], expected, rtol=1e-3)


def test_view_outlives_client_object(daemon, job_id):
    c = gradd.attach([("w", (1000,), "float32")], socket=daemon.socket, job_id=job_id)
    g = c.gradient(0)
    g[:] = 3.0
    c.mark_ready(0)
    c.wait_all()
    c.detach()
    del c  # the view holds the client (and its mapping)
    assert float(g.sum()) == 3000.0


def test_broadcast(daemon, job_id):
    def rank_fn(rank):
        c = gradd.attach([("w", (4,), "float32")], socket=daemon.socket, job_id=job_id,
                         local_rank=rank, local_world_size=2, broadcast_bytes=1 << 16)
        buf = np.full(1000, rank + 7, dtype=np.int32)
        c.broadcast(buf, 0)
        first = buf.copy()
        buf2 = np.full(10, rank + 100, dtype=np.uint8)
        c.broadcast(buf2, root=1)
        c.detach()
        return first, buf2

    for first, second in run_ranks(2, rank_fn):
        assert (first == 7).all()
        assert (second == 101).all()


def test_errors(daemon, job_id, tmp_path):
    # No daemon at the socket: a clear, bounded error naming the path.
    missing = str(tmp_path / "nowhere.sock")
    with pytest.raises(gradd.GraddError) as e:
        gradd.attach([("w", (4,), "float32")], socket=missing, job_id=job_id, connect_timeout=0.5)
    assert missing in str(e.value)
    assert e.value.code == "UNAVAILABLE" and isinstance(e.value, gradd.UnavailableError)
    assert isinstance(e.value, RuntimeError)

    with pytest.raises(ValueError, match="unsupported dtype"):
        gradd.attach([("w", (4,), "int32")], socket=daemon.socket, job_id=job_id)

    c = gradd.attach([("weight", (4,), "float32")], socket=daemon.socket, job_id=job_id)
    with pytest.raises(IndexError):
        c.gradient(1)
    c.mark_ready(0)
    with pytest.raises(gradd.GraddError) as e:
        c.mark_ready(0)
    assert "weight" in str(e.value) and "twice" in str(e.value)
    assert e.value.code == "FAILED_PRECONDITION"
    c.detach()


def test_mismatched_models(daemon, job_id):
    def rank_fn(rank):
        shape = (10, 20) if rank == 0 else (10, 21)
        try:
            gradd.attach([("bias", (4,), "float32"), ("layer.weight", shape, "float32")],
                         socket=daemon.socket, job_id=job_id, local_rank=rank,
                         local_world_size=2, attach_timeout=20)
        except gradd.GraddError as e:
            return e
        return None

    for err in run_ranks(2, rank_fn):
        assert isinstance(err, gradd.GraddError)
        assert "layer.weight" in str(err), str(err)


@pytest.mark.parametrize("wait", ["wait_all", "wait_bucket"])
def test_peer_leaving_is_an_error_not_a_hang(daemon, job_id, wait):
    def rank_fn(rank):
        c = gradd.attach([("w", (100,), "float32")], socket=daemon.socket, job_id=job_id,
                         local_rank=rank, local_world_size=2)
        if rank == 1:
            time.sleep(0.3)
            c.detach()
            return None
        c.mark_ready(0)
        start = time.monotonic()
        with pytest.raises(gradd.GraddError) as e:
            getattr(c, wait)(*([0] if wait == "wait_bucket" else []))
        return time.monotonic() - start, e.value

    waited, err = run_ranks(2, rank_fn)[0]
    assert waited < 10
    assert "rank 1" in str(err) and job_id in str(err)


def test_wait_bucket(daemon, job_id):
    """wait_bucket returns with one bucket's average, the iteration still
    open; wait_all then ends it at once. Errors as wait_all's."""

    def rank_fn(rank):
        c = gradd.attach(PARAMS, socket=daemon.socket, job_id=job_id, local_rank=rank,
                         local_world_size=2, bucket_cap_mb=0.005, first_bucket_cap_mb=0.005)
        nb = c.num_buckets
        assert nb > 1
        with pytest.raises(IndexError):
            c.wait_bucket(nb)
        with pytest.raises(gradd.GraddError) as e:
            c.wait_bucket(0)  # nothing marked yet
        assert e.value.code == "FAILED_PRECONDITION" and "bucket" in str(e.value)
        seen = []
        for it in range(3):
            for i in reversed(range(c.num_params)):
                c.gradient(i)[...] = (rank + 1) * (i + 1) + it
                c.mark_ready(i)
            got = {}
            for b in reversed(range(nb)):  # the first layers' bucket first
                c.wait_bucket(b)
                assert c.bucket_done(b) and c.iteration == it + 1
                got.update({i: c.gradient(i).astype(np.float64).copy()
                            for i in c.bucket(b)["params"]})
                c.wait_bucket(b)  # again: at once
            c.wait_all()
            assert c.iteration == it + 2
            seen.append(got)
        c.detach()
        with pytest.raises(gradd.GraddError):
            c.wait_bucket(0)
        return seen

    for seen in run_ranks(2, rank_fn):
        for it, got in enumerate(seen):
            assert sorted(got) == [0, 1, 2, 3]
            for i, g in got.items():
                np.testing.assert_allclose(g, (1 + 2) * (i + 1) / 2 + it, rtol=1e-3)
