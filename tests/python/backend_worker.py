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
  into_tensor  all_gather_into_tensor / reduce_scatter_tensor (flat and
               stacked forms, non-contiguous output, async)
  coalesced    all_reduce_coalesced, all_gather_coalesced, and torch 2.x's
               _coalescing_manager fast paths (allreduce_coalesced,
               allgather_into_tensor_coalesced, reduce_scatter_tensor_coalesced)
  split        the group objects: get_backend, size / rank, new_group with
               backend "gradd"; on torch 2.x the Backend under torch's
               ProcessGroup for the device "cpu"
  unsupported  point-to-point (send/recv, batch_isend_irecv), all_to_all,
               non-CPU tensors: a RuntimeError naming the operation, and the
               group still works afterwards
"""
import inspect
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


def into_tensor(rank, world):
    n = 5
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        want = torch.cat([data(r, n, dtype) for r in range(world)])
        out = torch.empty(world * n, dtype=dtype)
        dist.all_gather_into_tensor(out, data(rank, n, dtype))
        expect_equal(out, want, f"all_gather_into_tensor {dtype}")
        # the stacked form: output [world, n]
        out = torch.empty(world, n, dtype=dtype)
        dist.all_gather_into_tensor(out, data(rank, n, dtype))
        expect_equal(out.view(-1), want, f"all_gather_into_tensor stacked {dtype}")
        # rank r's block b is data(r, n) + b
        ins = torch.cat([data(rank, n, dtype) + b for b in range(world)])
        out = torch.empty(n, dtype=dtype)
        dist.reduce_scatter_tensor(out, ins)
        want_rs = (sum(data(r, n, dtype).double() + rank for r in range(world))).to(dtype)
        expect_equal(out, want_rs, f"reduce_scatter_tensor {dtype}")
        out = torch.empty(n, dtype=dtype)
        dist.reduce_scatter_tensor(out, ins.view(world, n))  # stacked input
        expect_equal(out, want_rs, f"reduce_scatter_tensor stacked {dtype}")
    # MAX, async, and a non-contiguous output (reduced into a copy)
    ins = torch.cat([torch.full((4,), float(rank * 10 + b)) for b in range(world)])
    holder = torch.zeros(4, 2)
    out = holder[:, 0]
    assert not out.is_contiguous()
    work = dist.reduce_scatter_tensor(out, ins, op=dist.ReduceOp.MAX, async_op=True)
    work.wait()
    expect_equal(holder[:, 0], torch.full((4,), float((world - 1) * 10 + rank)),
                 "reduce_scatter_tensor MAX async non-contiguous")
    expect_equal(holder[:, 1], torch.zeros(4), "reduce_scatter_tensor left the rest alone")
    fut = dist.all_gather_into_tensor(torch.empty(world * 3), torch.full((3,), float(rank)),
                                      async_op=True).get_future()
    got = fut.wait()[0]
    expect_equal(got, torch.arange(world, dtype=torch.float32).repeat_interleave(3),
                 "all_gather_into_tensor future")
    # a wrongly sized output is refused at the call
    try:
        dist.all_gather_into_tensor(torch.empty(world * n + 1), torch.ones(n))
    except (RuntimeError, ValueError) as e:
        assert "all" in str(e).lower() and "gather" in str(e).lower(), str(e)
    else:
        raise AssertionError("a wrongly sized all_gather_into_tensor output was accepted")


def has_coalescing_manager():
    """torch 2.x's dist._coalescing_manager(group, device, async_ops) with the
    fast paths (1.13 has another one, for NCCL's point-to-point only)."""
    cm = getattr(dist, "_coalescing_manager", None)
    return cm is not None and "async_ops" in inspect.signature(cm).parameters


def coalesced(rank, world):
    # all_reduce_coalesced: several shapes, one dtype; MAX too
    ts = [data(rank, 7, torch.float64), data(rank, 6, torch.float64).view(2, 3)]
    dist.all_reduce_coalesced(ts, op=dist.ReduceOp.MAX)
    expect_equal(ts[0], reduced(world, 7, torch.float64, dist.ReduceOp.MAX), "coalesced MAX 0")
    expect_equal(ts[1].view(-1), reduced(world, 6, torch.float64, dist.ReduceOp.MAX),
                 "coalesced MAX 1")
    # all_gather_coalesced (deprecated): outs[r][i] is rank r's input i
    if hasattr(dist, "all_gather_coalesced"):
        import warnings
        ins = [data(rank, 3, torch.float32), data(rank, 4, torch.float32).view(2, 2)]
        outs = [[torch.empty(3), torch.empty(2, 2)] for _ in range(world)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dist.all_gather_coalesced(outs, ins)
        for r in range(world):
            expect_equal(outs[r][0], data(r, 3, torch.float32), f"all_gather_coalesced 0 {r}")
            expect_equal(outs[r][1].view(-1), data(r, 4, torch.float32),
                         f"all_gather_coalesced 1 {r}")
    if not has_coalescing_manager():
        print("SKIP coalescing_manager (this torch has none)")
        return
    # torch 2.x: the coalescing manager's fast paths, synchronous ...
    a, b = data(rank, 5, torch.float32), data(rank, 9, torch.float32)
    with dist._coalescing_manager():
        dist.all_reduce(a)
        dist.all_reduce(b)
    expect_equal(a, reduced(world, 5, torch.float32, dist.ReduceOp.SUM), "cm all_reduce a")
    expect_equal(b, reduced(world, 9, torch.float32, dist.ReduceOp.SUM), "cm all_reduce b")
    outs = [torch.empty(world * 4, dtype=torch.int64), torch.empty(world * 2, dtype=torch.float64)]
    with dist._coalescing_manager():
        dist.all_gather_into_tensor(outs[0], data(rank, 4, torch.int64))
        dist.all_gather_into_tensor(outs[1], data(rank, 2, torch.float64))
    expect_equal(outs[0], torch.cat([data(r, 4, torch.int64) for r in range(world)]),
                 "cm all_gather_into_tensor 0")
    expect_equal(outs[1], torch.cat([data(r, 2, torch.float64) for r in range(world)]),
                 "cm all_gather_into_tensor 1")
    # ... and asynchronous
    outs = [torch.empty(3), torch.empty(2, dtype=torch.int32)]
    ins = [torch.cat([data(rank, 3, torch.float32) + k for k in range(world)]),
           torch.cat([data(rank, 2, torch.int32) * (k + 1) for k in range(world)])]
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.reduce_scatter_tensor(outs[0], ins[0])
        dist.reduce_scatter_tensor(outs[1], ins[1])
    cm.wait()
    expect_equal(outs[0], (sum(data(r, 3, torch.float32) for r in range(world)) + world * rank),
                 "cm reduce_scatter_tensor 0")
    expect_equal(outs[1], sum(data(r, 2, torch.int32) for r in range(world)) * (rank + 1),
                 "cm reduce_scatter_tensor 1")
    print("COALESCING_MANAGER ok")


def split(rank, world):
    assert dist.get_backend() == "gradd", dist.get_backend()
    assert dist.get_rank() == rank and dist.get_world_size() == world
    world_group = dist.group.WORLD
    assert world_group.rank() == rank and world_group.size() == world, (
        world_group.rank(), world_group.size())
    import gradd._c10d as c10d
    if hasattr(world_group, "_get_backend"):
        # torch 2.x: torch's own ProcessGroup over gradd's Backend for "cpu"
        backend = world_group._get_backend(torch.device("cpu"))
        assert isinstance(backend, c10d.ProcessGroupGradd), type(backend)
        assert not isinstance(world_group, c10d.ProcessGroupGradd)
        assert backend.rank() == rank and backend.size() == world
        assert backend.job_id.startswith("torch-"), backend.job_id
        print("SPLIT backend", c10d.TORCH_VERSION)
    else:
        assert isinstance(world_group, c10d.ProcessGroupGradd), type(world_group)
        print("SPLIT process_group", c10d.TORCH_VERSION)
    # a subgroup of the higher ranks, in reverse order of creation on purpose
    members = list(range(world - 1, 0, -1)) if world > 2 else [0, 1]
    sub = dist.new_group(members, backend="gradd")
    if rank in members:
        assert dist.get_backend(sub) == "gradd", dist.get_backend(sub)
        want_rank = sorted(members).index(rank)
        assert sub.rank() == want_rank and sub.size() == len(members), (sub.rank(), sub.size())
        assert dist.get_rank(sub) == want_rank
        t = torch.full((3,), float(rank))
        dist.all_reduce(t, group=sub)
        expect_equal(t, torch.full((3,), float(sum(members))), "subgroup all_reduce")
        out = torch.empty(len(members))
        dist.all_gather_into_tensor(out, torch.tensor([float(rank)]), group=sub)
        expect_equal(out, torch.tensor([float(m) for m in sorted(members)]),
                     "subgroup all_gather_into_tensor")
    else:
        assert sub == dist.GroupMember.NON_GROUP_MEMBER
    t = torch.ones(2)
    dist.all_reduce(t)
    expect_equal(t, torch.full((2,), float(world)), "world after subgroup")


def expect_error(fn, *words, what):
    try:
        fn()
    except RuntimeError as e:
        msg = str(e)
        for w in words:
            assert w.lower() in msg.lower(), f"{what}: {w!r} not in {msg!r}"
        print(f"REFUSED {what}: {msg.splitlines()[0][:200]}")
    else:
        raise AssertionError(f"{what} did not raise")


def unsupported(rank, world):
    peer = (rank + 1) % world
    expect_error(lambda: dist.send(torch.ones(2), dst=peer), "gradd", "send", what="send")
    expect_error(lambda: dist.recv(torch.ones(2), src=peer), "gradd", "recv", what="recv")
    expect_error(lambda: dist.isend(torch.ones(2), dst=peer), "gradd", "send", what="isend")
    ops = [dist.P2POp(dist.isend, torch.ones(2), peer),
           dist.P2POp(dist.irecv, torch.empty(2), (rank - 1) % world)]
    expect_error(lambda: dist.batch_isend_irecv(ops), "gradd", "point-to-point",
                 what="batch_isend_irecv")
    expect_error(lambda: dist.all_to_all_single(torch.empty(world), torch.ones(world)),
                 "gradd", "all_to_all", what="all_to_all_single")
    expect_error(lambda: dist.all_to_all([torch.empty(1) for _ in range(world)],
                                         [torch.ones(1) for _ in range(world)]),
                 "gradd", "all_to_all", what="all_to_all")
    # a tensor on another device: refused by torch (2.x: gradd serves "cpu"
    # only; a meta tensor finds no c10d kernel) or by gradd (1.13), naming
    # the device either way
    expect_error(lambda: dist.all_reduce(torch.ones(2, device="meta")), "meta",
                 what="all_reduce on meta")
    pg = dist.group.WORLD
    backend = pg._get_backend(torch.device("cpu")) if hasattr(pg, "_get_backend") else pg
    # the group object's own method: torch 2.x's Backend binding calls gradd
    # straight away, 1.13's ProcessGroup binding goes through the dispatcher
    try:
        backend.allreduce([torch.ones(2, device="meta")]).wait()
    except RuntimeError as e:
        msg = str(e)
        assert "meta" in msg.lower(), msg
        if "gradd backend" in msg:
            assert "CPU tensors only" in msg, msg
        print(f"REFUSED backend allreduce on meta: {msg.splitlines()[0][:200]}")
    else:
        raise AssertionError("backend allreduce on meta did not raise")
    # a sparse CPU tensor reaches gradd on both (1.13: allreduce refuses the
    # layout; 2.x: allreduce_sparse is not gradd's)
    sparse = torch.ones(2).to_sparse()
    expect_error(lambda: dist.all_reduce(sparse), "gradd", "sparse", what="sparse all_reduce")
    if torch.cuda.is_available():
        expect_error(lambda: dist.all_reduce(torch.ones(2, device="cuda")), "cuda",
                     what="all_reduce on cuda")
        expect_error(lambda: backend.allreduce([torch.ones(2, device="cuda")]),
                     "gradd backend", "CPU tensors only", what="backend allreduce on cuda")
    # nothing was queued: the group still runs collectives
    t = torch.ones(3)
    dist.all_reduce(t)
    expect_equal(t, torch.full((3,), float(world)), "all_reduce after refusals")


def main():
    mode, init_file = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gradd", init_method=f"file://{init_file}", rank=rank, world_size=world)
    {"collectives": collectives, "logging": logging_loop, "subgroup": subgroup,
     "mismatch": mismatch, "ddp": ddp, "into_tensor": into_tensor, "coalesced": coalesced,
     "split": split, "unsupported": unsupported}[mode](rank, world)
    if mode != "mismatch":
        dist.destroy_process_group()
    print(f"OK {mode}", flush=True)


if __name__ == "__main__":
    main()
