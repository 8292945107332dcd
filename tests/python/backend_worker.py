"""One rank of the torch.distributed backend "gradd" tests (test_gradd_backend.py).

usage: backend_worker.py MODE INIT_FILE   (RANK, WORLD_SIZE, GRADD_SOCKET set)

Modes (each prints "OK <mode>" at the end; any failed check raises):
  collectives  every collective, several dtypes and sizes, against values
               computed here
  logging      dist.all_reduce(loss) as a training loop logs it
  subgroup     dist.new_group([0, world-1], backend="gradd") next to the world
  mismatch     ranks issue different allreduces: a clear error, not a hang
  ddp          torch's own DistributedDataParallel over the default group
               "gradd" and over a Gloo group, parameters equal every step
"""
import os
import sys
import time

import torch
import torch.distributed as dist

import gradd.distributed  # noqa: F401  (registers the backend "gradd")
from models import build
from parity_util import rel_err

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
          torch.int32, torch.int64, torch.uint8, torch.int8]
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
# 1.25 M float32 = 5 MB: more than the default 4 MiB collective area.
SIZES = [1, 1000, 1_250_000]


def data(rank, n, dtype):
    """Rank `rank`'s input: small integers (exact in every dtype and in sums)."""
    base = torch.arange(n, dtype=torch.int64) % 7 + rank + 1
    return base.to(dtype)


def expect_equal(got, want, what):
    if got.dtype in (torch.float16, torch.bfloat16):
        ok = torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2)
    elif got.dtype in (torch.float32, torch.float64):
        ok = torch.allclose(got, want, rtol=1e-6, atol=0)
    else:
        ok = torch.equal(got, want)
    if not ok:
        diff = (got.double() - want.double()).abs()
        raise AssertionError(f"{what}: max diff {diff.max().item()} at {diff.argmax().item()}")


def reduced(world, n, dtype, op):
    stack = torch.stack([data(r, n, dtype).double() for r in range(world)])
    if op == dist.ReduceOp.SUM:
        out = stack.sum(0)
    elif op == dist.ReduceOp.MIN:
        out = stack.min(0).values
    elif op == dist.ReduceOp.MAX:
        out = stack.max(0).values
    else:  # AVG
        out = stack.mean(0)
    return out.to(dtype)


def collectives(rank, world):
    for dtype in DTYPES:
        sizes = SIZES if dtype in (torch.float32, torch.int64) else SIZES[:2]
        ops = [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
        if dtype in FLOATS:
            ops.append(dist.ReduceOp.AVG)
        for n in sizes:
            for op in ops:
                t = data(rank, n, dtype)
                dist.all_reduce(t, op=op)
                expect_equal(t, reduced(world, n, dtype, op), f"all_reduce {dtype} {n} {op}")
            # async + future, as DDP's reducer uses it
            t = data(rank, n, dtype)
            fut = dist.all_reduce(t, async_op=True).get_future()
            expect_equal(fut.wait()[0], reduced(world, n, dtype, dist.ReduceOp.SUM),
                         f"all_reduce future {dtype} {n}")
            # broadcast from the last rank
            t = data(rank, n, dtype)
            dist.broadcast(t, src=world - 1)
            expect_equal(t, data(world - 1, n, dtype), f"broadcast {dtype} {n}")
            # all_gather (list) and _all_gather_base
            outs = [torch.empty(n, dtype=dtype) for _ in range(world)]
            dist.all_gather(outs, data(rank, n, dtype))
            for r in range(world):
                expect_equal(outs[r], data(r, n, dtype), f"all_gather {dtype} {n} block {r}")
            flat = torch.empty(world * n, dtype=dtype)
            dist._all_gather_base(flat, data(rank, n, dtype))
            expect_equal(flat, torch.cat([data(r, n, dtype) for r in range(world)]),
                         f"_all_gather_base {dtype} {n}")
            # reduce_scatter (list) and _reduce_scatter_base: rank r's block b
            # is data(r, n) + b
            ins = [data(rank, n, dtype) + b for b in range(world)]
            out = torch.empty(n, dtype=dtype)
            dist.reduce_scatter(out, ins)
            want = (sum(data(r, n, dtype).double() + rank for r in range(world))).to(dtype)
            expect_equal(out, want, f"reduce_scatter {dtype} {n}")
            out = torch.empty(n, dtype=dtype)
            dist._reduce_scatter_base(out, torch.cat(ins))
            expect_equal(out, want, f"_reduce_scatter_base {dtype} {n}")
    # non-contiguous tensor: reduced in a copy, copied back
    t = torch.arange(12, dtype=torch.float32).view(3, 4).t() * (rank + 1)
    assert not t.is_contiguous()
    dist.all_reduce(t)
    expect_equal(t, torch.arange(12, dtype=torch.float32).view(3, 4).t()
                 * (world * (world + 1) // 2), "all_reduce non-contiguous")
    # coalesced
    ts = [data(rank, 5, torch.float32), data(rank, 3, torch.float32).view(3, 1)]
    dist.all_reduce_coalesced(ts)
    expect_equal(ts[0], reduced(world, 5, torch.float32, dist.ReduceOp.SUM), "coalesced 0")
    expect_equal(ts[1].view(3), reduced(world, 3, torch.float32, dist.ReduceOp.SUM), "coalesced 1")
    # reduce, gather, scatter to/from rank 0
    t = data(rank, 9, torch.float64)
    dist.reduce(t, dst=0)
    if rank == 0:
        expect_equal(t, reduced(world, 9, torch.float64, dist.ReduceOp.SUM), "reduce")
    else:
        expect_equal(t, data(rank, 9, torch.float64), "reduce leaves non-root alone")
    gathered = [torch.empty(4, dtype=torch.int32) for _ in range(world)] if rank == 0 else None
    dist.gather(data(rank, 4, torch.int32), gathered, dst=0)
    if rank == 0:
        for r in range(world):
            expect_equal(gathered[r], data(r, 4, torch.int32), f"gather block {r}")
    out = torch.empty(6, dtype=torch.float32)
    dist.scatter(out, [data(r, 6, torch.float32) * 10 for r in range(world)] if rank == 0 else None,
                 src=0)
    expect_equal(out, data(rank, 6, torch.float32) * 10, "scatter")
    dist.barrier()
    # refused at the call, with what is supported
    for bad, words in ((lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.PRODUCT),
                        "SUM, AVG, MIN and MAX"),
                       (lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool)),
                        "does not support dtype")):
        try:
            bad()
        except RuntimeError as e:
            assert words in str(e), str(e)
        else:
            raise AssertionError(f"expected an error naming {words!r}")
    assert dist.get_backend() == "gradd", dist.get_backend()


def logging_loop(rank, world):
    for step in range(3):
        loss = torch.tensor(float(rank + 1) * (step + 1))
        dist.all_reduce(loss)
        want = float(world * (world + 1) // 2) * (step + 1)
        assert loss.item() == want, (loss.item(), want)
        loss = torch.tensor(float(rank + 1))
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        assert abs(loss.item() - (world + 1) / 2) < 1e-6, loss.item()


def subgroup(rank, world):
    members = [0, world - 1]
    group = dist.new_group(members, backend="gradd")
    if rank in members:
        t = torch.full((10,), float(rank + 1))
        dist.all_reduce(t, group=group)
        expect_equal(t, torch.full((10,), float(sum(m + 1 for m in members))), "subgroup all_reduce")
        b = torch.full((3,), float(rank))
        dist.broadcast(b, src=world - 1, group=group)  # src is a global rank
        expect_equal(b, torch.full((3,), float(world - 1)), "subgroup broadcast")
    # the world group still works, interleaved with the subgroup's job
    t = torch.ones(4)
    dist.all_reduce(t)
    expect_equal(t, torch.full((4,), float(world)), "world all_reduce after subgroup")


def mismatch(rank, world):
    n = 10 if rank == 0 else 20
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(n))
    except RuntimeError as e:
        msg = str(e)
        assert "gradd" in msg, msg
        print(f"ERROR {time.monotonic() - start:.1f}s {msg}")
    else:
        raise AssertionError("a mismatched all_reduce succeeded")


def ddp(rank, world, steps=4):
    gloo = dist.new_group(list(range(world)), backend="gloo")
    torch.manual_seed(0)
    model_gradd, make_input, loss_fn = build("mlp")
    torch.manual_seed(0)
    model_gloo, _, _ = build("mlp")
    ddp_gradd = torch.nn.parallel.DistributedDataParallel(model_gradd)  # default group: gradd
    ddp_gloo = torch.nn.parallel.DistributedDataParallel(model_gloo, process_group=gloo)
    assert dist.get_backend(ddp_gradd.process_group) == "gradd"
    opt_gradd = torch.optim.SGD(ddp_gradd.parameters(), lr=0.1, momentum=0.9)
    opt_gloo = torch.optim.SGD(ddp_gloo.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(100 + rank)
    worst = 0.0
    for step in range(steps):
        x = make_input(g)
        y = torch.randint(0, 10, (x.shape[0],), generator=g)
        for m, opt in ((ddp_gradd, opt_gradd), (ddp_gloo, opt_gloo)):
            opt.zero_grad()
            loss_fn(m(x), y).backward()
            opt.step()
        for (name, a), (_, b) in zip(model_gradd.named_parameters(), model_gloo.named_parameters()):
            err = rel_err(a, b)
            worst = max(worst, err)
            assert err < 1e-5, f"step {step}: {name} differs by {err}"
    print(f"WORST {worst:.3g}")


def main():
    mode, init_file = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gradd", init_method=f"file://{init_file}", rank=rank, world_size=world)
    {"collectives": collectives, "logging": logging_loop, "subgroup": subgroup,
     "mismatch": mismatch, "ddp": ddp}[mode](rank, world)
    if mode != "mismatch":
        dist.destroy_process_group()
    print(f"OK {mode}", flush=True)


if __name__ == "__main__":
    main()
