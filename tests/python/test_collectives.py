"""gradd._C collectives (allreduce, allgather, reduce_scatter, barrier and
chunked broadcast) on numpy arrays: two ranks as processes of a
collective-only job against a real daemon, every value checked against its
closed form; argument errors; a mismatched call failing both ranks."""
import multiprocessing as mp
import traceback

import numpy as np
import pytest

import gradd

AREA = 4096  # small: most calls take several rounds


def _bf16(values):
    """float32 values (exact in bfloat16) as bfloat16 bits in int16."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32) >> 16
    return bits.astype(np.uint16).view(np.int16)


def _from_bf16(bits):
    return (bits.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def _worker(rank, socket, job_id, mode, queue):
    try:
        queue.put((rank, _run(rank, socket, job_id, mode)))
    except BaseException as e:  # report, do not hang the parent
        queue.put((rank, (type(e).__name__, str(e), traceback.format_exc())))


def _run(rank, socket, job_id, mode):
    c = gradd.attach([], socket=socket, job_id=job_id, local_rank=rank, local_world_size=2,
                     collective_bytes=AREA, wait_timeout=60.0)
    assert c.num_params == 0 and c.num_buckets == 0 and c.world_size == 2
    if mode == "mismatch":
        a = np.ones(100, dtype=np.float32)
        c.allreduce(a, op="max" if rank == 1 else "sum")
        return "unexpected success"
    out = {}
    i = np.arange(3001)
    f = (i % 7 - 3).astype(np.float64)
    for dtype in (np.float32, np.float64, np.float16):
        for op in ("sum", "avg", "min", "max"):
            a = ((rank + 1) * f).astype(dtype)
            c.allreduce(a, op)
            out[(np.dtype(dtype).name, op)] = a.astype(np.float64)
    b = _bf16((rank + 1) * f)
    c.allreduce(b, "sum", bfloat16=True)
    out["bfloat16"] = _from_bf16(b).astype(np.float64)
    for dtype in (np.int32, np.int64, np.int8, np.uint8):
        for op in ("sum", "min", "max"):
            h = (i % 5) if dtype == np.uint8 else (i % 5 - 2)
            a = ((rank + 1) * h).astype(dtype)
            c.allreduce(a, op=op)
            out[(np.dtype(dtype).name, op)] = a.astype(np.int64)
    g_in = (np.arange(5000) * 3 + rank * 101).astype(np.uint8)
    g_out = np.zeros(10000, dtype=np.uint8)
    c.allgather(g_in, g_out)
    out["allgather"] = g_out
    rs_in = ((rank + 1) * np.arange(2 * 1500)).astype(np.float32)
    rs_out = np.zeros(1500, dtype=np.float32)
    c.reduce_scatter(rs_in, rs_out, op="sum")
    out["reduce_scatter"] = rs_out
    empty = np.zeros(0, dtype=np.float32)
    c.allreduce(empty)  # zero-size: a no-op round on every rank
    c.barrier()
    big = np.arange(3 * AREA + 5, dtype=np.int64) * (rank == 1)
    c.broadcast(big, root=1)  # larger than the area: several rounds
    out["broadcast"] = big
    c.detach()
    return out


def _spawn(socket, job_id, mode="all", timeout=90):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, socket, job_id, mode, queue))
             for r in range(2)]
    for p in procs:
        p.start()
    results = [None, None]
    try:
        for _ in procs:
            rank, value = queue.get(timeout=timeout)
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return results


def test_every_collective_between_two_processes(daemon, job_id):
    results = _spawn(daemon.socket, job_id)
    i = np.arange(3001)
    f = (i % 7 - 3).astype(np.float64)
    want = {"sum": 3 * f, "avg": 1.5 * f, "min": np.where(f >= 0, f, 2 * f),
            "max": np.where(f >= 0, 2 * f, f)}
    for rank, out in enumerate(results):
        assert isinstance(out, dict), f"rank {rank}: {out}"
        for dtype in ("float32", "float64", "float16"):
            for op, w in want.items():
                np.testing.assert_array_equal(out[(dtype, op)], w, err_msg=f"{dtype} {op}")
        np.testing.assert_array_equal(out["bfloat16"], 3 * f)
        for dtype in ("int32", "int64", "int8", "uint8"):
            h = (i % 5) if dtype == "uint8" else (i % 5 - 2)
            np.testing.assert_array_equal(out[(dtype, "sum")], 3 * h)
            np.testing.assert_array_equal(out[(dtype, "min")], np.where(h >= 0, h, 2 * h))
            np.testing.assert_array_equal(out[(dtype, "max")], np.where(h >= 0, 2 * h, h))
        for r in range(2):
            np.testing.assert_array_equal(
                out["allgather"][r * 5000:(r + 1) * 5000],
                (np.arange(5000) * 3 + r * 101).astype(np.uint8))
        np.testing.assert_array_equal(
            out["reduce_scatter"], 3 * np.arange(rank * 1500, (rank + 1) * 1500, dtype=np.float32))
        np.testing.assert_array_equal(out["broadcast"], np.arange(3 * AREA + 5))


def test_mismatched_op_fails_both_ranks(daemon, job_id):
    for rank, (name, message, tb) in enumerate(_spawn(daemon.socket, job_id, "mismatch")):
        assert name == "InvalidArgumentError", tb
        assert "local rank 0 (global rank 0) issued allreduce (float32, sum" in message
        assert "local rank 1 (global rank 1) issued allreduce (float32, max" in message


def test_argument_errors(daemon, job_id):
    c = gradd.attach([], socket=daemon.socket, job_id=job_id)  # default area
    with pytest.raises(gradd.InvalidArgumentError, match="avg is not supported for int32"):
        c.allreduce(np.ones(4, dtype=np.int32), op="avg")
    with pytest.raises(ValueError, match="unknown reduce op 'prod'"):
        c.allreduce(np.ones(4, dtype=np.float32), op="prod")
    with pytest.raises(ValueError, match="unsupported dtype"):
        c.allreduce(np.ones(4, dtype=np.complex64))
    with pytest.raises(ValueError, match="C-contiguous"):
        c.allreduce(np.ones((4, 4), dtype=np.float32)[:, 1])
    with pytest.raises(ValueError, match="writable"):
        ro = np.ones(4, dtype=np.float32)
        ro.setflags(write=False)
        c.allreduce(ro)
    with pytest.raises(TypeError):
        c.allreduce([1.0, 2.0])  # no silent copy: the result would be lost
    with pytest.raises(ValueError, match="world_size"):
        c.allgather(np.ones(4, dtype=np.uint8), np.ones(5, dtype=np.uint8))
    with pytest.raises(ValueError, match="world_size"):
        c.reduce_scatter(np.ones(4, dtype=np.float32), np.ones(3, dtype=np.float32))
    # World of one: every collective is the identity.
    a = np.arange(10, dtype=np.float64)
    c.allreduce(a, "avg")
    np.testing.assert_array_equal(a, np.arange(10))
    c.barrier()
    c.detach()

    # A job with parameters gets no collective area unless it asks.
    d = gradd.attach([("w", (4,), "float32")], socket=daemon.socket, job_id=job_id + "-p")
    with pytest.raises(gradd.FailedPreconditionError, match="collective_bytes > 0"):
        d.barrier()
    d.detach()
