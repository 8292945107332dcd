"""gradd.collectives: the collective API with torch.futures.Future results,
ranks as threads of this process over a real daemon (the binding releases
the GIL while a collective waits)."""
import pytest

from conftest import rank_threads

# torch (python3-torch, which scripts/setup installs) and this build's gradd
# are what is tested: without them the module fails, it does not skip.
import torch  # noqa: E402
import gradd  # noqa: E402
from gradd.collectives import Collectives  # noqa: E402


def _attach(daemon, job_id, rank, world):
    if not hasattr(gradd.Client, "allreduce"):
        pytest.fail("daemon collectives missing: gradd._C has no Client.allreduce",
                    pytrace=False)
    return gradd.attach([], socket=daemon.socket, job_id=job_id, local_rank=rank,
                        local_world_size=world)


def _unavailable(errors):
    for e in errors:
        if e is not None and "UNIMPLEMENTED" in str(e).upper():
            pytest.fail(f"daemon collectives missing: {e}", pytrace=False)


def test_futures_in_issue_order(daemon, job_id):
    world = 2

    def body(rank):
        client = _attach(daemon, job_id, rank, world)
        with Collectives(client) as coll:
            a = torch.arange(6, dtype=torch.float32) * (rank + 1)
            b = torch.full((3,), rank + 1, dtype=torch.int64)
            chained = coll.allreduce(a, op="sum").then(lambda f: f.value() * 2)
            futs = [coll.allreduce(b, op="max"),
                    coll.allgather(torch.tensor([rank, rank * 10], dtype=torch.int32)),
                    coll.reduce_scatter(torch.ones(4, 2) * (rank + 1), op="sum"),
                    coll.broadcast(torch.full((5,), float(rank)), root=1),
                    coll.barrier()]
            out = [chained.wait()] + [f.wait() for f in futs]
        client.detach()
        return out

    results, errors = rank_threads(world, body)
    _unavailable(errors)
    assert errors == [None, None], errors
    for rank, (summed, mx, gathered, scattered, bcast, barrier) in enumerate(results):
        assert torch.equal(summed, torch.arange(6, dtype=torch.float32) * 3 * 2)
        assert torch.equal(mx, torch.full((3,), 2, dtype=torch.int64))
        assert torch.equal(gathered, torch.tensor([[0, 0], [1, 10]], dtype=torch.int32))
        assert torch.equal(scattered, torch.full((2, 2), 3.0))
        assert torch.equal(bcast, torch.full((5,), 1.0))
        assert barrier is None


def test_errors_reach_the_future(daemon, job_id):
    client = _attach(daemon, job_id, 0, 1)
    with Collectives(client) as coll:
        with pytest.raises(ValueError, match="op must be one of"):
            coll.allreduce(torch.ones(2), op="prod")
        with pytest.raises(TypeError, match="bfloat16"):
            coll.allreduce(torch.ones(2, dtype=torch.bfloat16))
        fut = coll.broadcast(torch.ones(2), root=5)  # not a rank of the job
        with pytest.raises(gradd.GraddError) as err:
            fut.wait()
        _unavailable([err.value])
        assert "root" in str(err.value)
    client.detach()
