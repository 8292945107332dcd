"""One rank of the torch.distributed backend "gradd" tests whose future
callbacks wait for collectives of the same group (test_gradd_backend_hooks.py).

usage: backend_hook_worker.py MODE INIT_FILE STEPS   (RANK, WORLD_SIZE,
GRADD_SOCKET set). The default group is "gradd"; Gloo groups are made beside
it where a mode compares against Gloo. Prints one JSON line at the end; any
failed check raises. A watchdog (faulthandler) dumps every thread's stack and
exits if the mode runs past HANG_S seconds, so a hang is a failure that shows
where it stuck.

Modes:
  powersgd  torch's own DistributedDataParallel with torch's powerSGD_hook
            (start_powerSGD_iter=2) over the default group "gradd" and over a
            Gloo group, side by side, same initial weights, inputs and
            PowerSGD seed; gradients and parameters compared every step.
  quant     the same with torch's quantization_pertensor_hook.
  nested    async all_reduces whose callbacks issue further all_reduces of
            the group and wait for them (three deep); completion order.
  error     a failed collective's error reaches .then and add_done_callback.
  shutdown  gradd subgroups destroyed with work and blocking callbacks in
            flight, one destroyed from its own future callback; the group's
            threads (named "gradd-pg") all end.
"""
import faulthandler
import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook, quantization_hooks

import gradd.distributed  # noqa: F401  (registers the backend "gradd")
import models
from parity_util import rel_err

HANG_S = 150
THREAD_NAME = "gradd-pg"


def pool_threads():
    """Threads of this process named like ProcessGroupGradd's."""
    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                n += f.read().strip() == THREAD_NAME
        except OSError:  # ended while listing
            pass
    return n


def this_thread_name():
    with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
        return f.read().strip()


def wait_for(cond, what, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def cpu_quantization_hook(state, bucket):
    """torch 1.13's quantization_pertensor_hook on CPU tensors. It is written
    for NCCL on CUDA: it calls .cuda(tensor.device) and reads an all_gather
    future's value as NCCL's ([outputs stacked]), where Gloo's and gradd's
    are the output list. Adapted identically for both groups."""
    from user_hook_worker import cpu_quantization

    if not getattr(cpu_quantization_hook, "patched", False):
        cpu_quantization()
        cpu_quantization_hook.patched = True
    return quantization_hooks.quantization_pertensor_hook(state, bucket)


_KEEP = []


def ddp_parity(rank, world, steps, hook_name):
    """torch's DDP over "gradd" and over Gloo with the same hook; returns the
    per-step [grad_err, param_err] (largest over parameters; rel_err)."""
    gloo = dist.new_group(list(range(world)), backend="gloo")
    torch.manual_seed(0)
    model_gradd, make_input, loss_fn = models.build("mlp")
    torch.manual_seed(0)
    model_gloo, _, _ = models.build("mlp")
    ddp_gradd = torch.nn.parallel.DistributedDataParallel(model_gradd)  # default group
    ddp_gloo = torch.nn.parallel.DistributedDataParallel(model_gloo, process_group=gloo)
    assert dist.get_backend(ddp_gradd.process_group) == "gradd"
    states = {}
    if hook_name == "powersgd":
        for name, ddp, group in (("gradd", ddp_gradd, None), ("gloo", ddp_gloo, gloo)):
            # Same seed on both sides: the same random projections.
            states[name] = powerSGD_hook.PowerSGDState(
                process_group=group, matrix_approximation_rank=1, start_powerSGD_iter=2,
                random_seed=0)
            ddp.register_comm_hook(states[name], powerSGD_hook.powerSGD_hook)
    else:
        ddp_gradd.register_comm_hook(None, cpu_quantization_hook)
        ddp_gloo.register_comm_hook(gloo, cpu_quantization_hook)
    opt_gradd = torch.optim.SGD(ddp_gradd.parameters(), lr=0.1, momentum=0.9)
    opt_gloo = torch.optim.SGD(ddp_gloo.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    per_step = []
    for step in range(steps):
        x = make_input(g)
        y = torch.randint(0, 10, (x.shape[0],), generator=g)
        for ddp, opt in ((ddp_gradd, opt_gradd), (ddp_gloo, opt_gloo)):
            opt.zero_grad()
            loss_fn(ddp(x), y).backward()
        grad_err = max(rel_err(a.grad, b.grad)
                       for a, b in zip(model_gradd.parameters(), model_gloo.parameters()))
        opt_gradd.step()
        opt_gloo.step()
        param_err = max(rel_err(a, b)
                        for a, b in zip(model_gradd.parameters(), model_gloo.parameters()))
        per_step.append([grad_err, param_err])
    flat = torch.cat([p.detach().reshape(-1) for p in model_gradd.parameters()])
    out = {"per_step": per_step, "param0": flat[:8].tolist()}
    if states:
        # PowerSGD compressed (its P/Q memory exists) from start_powerSGD_iter on.
        out["powersgd"] = {name: {"iter": st.iter, "compressed": len(st.p_memory_dict) > 0}
                           for name, st in states.items()}
    # The Gloo side is kept until the process leaves (os._exit in main):
    # torch 1.13's Reducer keeps its last iteration's future, whose callbacks
    # hold the hook state and with it the Gloo group; freed here, the
    # group's last reference can go on one of its own worker threads, whose
    # destructor then joins itself ("Resource deadlock avoided": the process
    # aborted in 2 of 16 runs, at f76c809 too). Keeping the gradd side
    # alive is not needed (20 of 20 runs pass with only this).
    _KEEP.extend([ddp_gloo, states.get("gloo"), gloo])
    return out


def nested(rank, world, steps):
    """Top-level async all_reduces; the first one's callback waits for a
    second collective whose callback waits for a third (attached once every
    top-level one is issued, so every rank issues the same sequence). Rank
    0's first callback runs on a pool thread for certain: rank 1 issues
    only after a Gloo barrier that rank 0 enters once it attached it. Each
    top-level future's callback notes which earlier futures were complete."""
    gloo = dist.new_group(list(range(world)), backend="gloo")
    n_top = 6
    want = float(world * (world + 1) // 2)
    seen = [None] * n_top
    depth_values = []
    first_ran_on = []
    futs = []

    def deep(_f):
        t = torch.full((5,), float(rank + 1))
        v = dist.all_reduce(t, async_op=True).get_future().wait()[0]
        depth_values.append(v[0].item())
        return v

    def middle(_f):
        t = torch.full((7,), float(rank + 1))
        inner = dist.all_reduce(t, async_op=True).get_future().then(deep)
        depth_values.append(inner.wait()[0].item())
        return t

    def first(f):
        first_ran_on.append(this_thread_name())
        t = torch.full((3,), float(rank + 1))
        mid = dist.all_reduce(t, async_op=True).get_future().then(middle)
        mid.wait()
        depth_values.append(t[0].item())
        return f.value()

    def recorder(k):
        def cb(f):
            seen[k] = [futs[i].done() for i in range(k)]
        return cb

    for step in range(steps):
        depth_values.clear()
        first_ran_on.clear()
        futs.clear()
        seen[:] = [None] * n_top
        tensors = [torch.full((4 + k,), float(rank + 1)) for k in range(n_top)]
        if rank != 0:
            dist.barrier(group=gloo)
        for k in range(n_top):
            fut = dist.all_reduce(tensors[k], async_op=True).get_future()
            futs.append(fut)
            fut.add_done_callback(recorder(k))
        chained = futs[0].then(first)
        if rank == 0:
            dist.barrier(group=gloo)
        chained.wait()
        for k, fut in enumerate(futs):
            assert fut.wait()[0].eq(want).all(), (k, fut.wait()[0])
        wait_for(lambda: all(s is not None for s in seen), "every recorder callback")
        for k in range(n_top):
            assert all(seen[k]), f"future {k} completed before earlier ones: {seen[k]}"
        assert depth_values == [want] * 3, depth_values
        if rank == 0:
            assert first_ran_on == [THREAD_NAME], first_ran_on
    return {"pool_threads": pool_threads()}


def error(rank, world, steps):
    """Mismatched sizes: the collective fails on every rank; the error
    reaches a .then callback (as an exception from value()) and an
    add_done_callback."""
    got = {}
    done = threading.Event()

    def then_cb(f):
        try:
            f.value()
        except RuntimeError as e:
            got["then"] = str(e)
            raise
        got["then"] = "no error"

    def done_cb(f):
        try:
            f.value()
        except RuntimeError as e:
            got["done"] = str(e)
        else:
            got["done"] = "no error"
        done.set()

    fut = dist.all_reduce(torch.ones(10 if rank == 0 else 20), async_op=True).get_future()
    child = fut.then(then_cb)
    fut.add_done_callback(done_cb)
    try:
        child.wait()
    except RuntimeError as e:
        got["child"] = str(e)
    else:
        got["child"] = "no error"
    assert done.wait(60), "add_done_callback never ran"
    for where in ("then", "done", "child"):
        assert "gradd allreduce failed" in got[where], (where, got[where])
    return {"errors": got}


def shutdown(rank, world, steps):
    base = pool_threads()  # the default group's
    gloo = dist.new_group(list(range(world)), backend="gloo")
    want = float(world * (world + 1) // 2)
    for rnd in range(3):
        group = dist.new_group(list(range(world)), backend="gradd")
        assert pool_threads() > base
        values = []
        works = []

        def waits_for_last(f):
            # A blocking callback: it waits for the group's last collective
            # (which old single-thread groups ran only after it returned).
            last_work, last_t = works[-1]
            last_work.get_future().wait()
            values.append(last_t[0].item())

        # Rank 0's callback is attached before its collective can complete
        # (rank 1 issues after the barrier), so it blocks a pool thread
        # while the group is destroyed.
        if rank != 0:
            dist.barrier(group=gloo)
        for k in range(8):
            t = torch.full((100 + k,), float(rank + 1))
            works.append((dist.all_reduce(t, group=group, async_op=True), t))
        works[0][0].get_future().add_done_callback(waits_for_last)
        if rank == 0:
            dist.barrier(group=gloo)
        dist.destroy_process_group(group)
        del group, waits_for_last
        # The destructor ran every queued collective and callback, then
        # joined the group's threads.
        assert pool_threads() == base, (rnd, pool_threads(), base)
        assert values == [want], values
        for work, t in works:
            assert work.is_completed() and t.eq(want).all()
        del works
    # Destroyed on its own thread: the last reference is a future
    # callback's, dropped once the callback ran on a pool thread. On rank 0
    # the collective cannot complete before its callback is attached (rank
    # 1 issues after a Gloo barrier), so the callback runs on a pool thread,
    # and it returns only once this thread dropped every other reference.
    group = dist.new_group(list(range(world)), backend="gradd")
    ran_on = []
    released = threading.Event()

    def holds_group(f, group=group):
        ran_on.append(this_thread_name())
        if rank == 0:
            released.wait()
        return f.value()[0] * group.size()

    t = torch.full((4,), float(rank + 1))
    if rank == 0:
        child = dist.all_reduce(t, group=group, async_op=True).get_future().then(holds_group)
        dist.barrier(group=gloo)
    else:
        dist.barrier(group=gloo)
        child = dist.all_reduce(t, group=group, async_op=True).get_future().then(holds_group)
    dist.destroy_process_group(group)
    del group, holds_group
    released.set()
    assert child.wait().eq(want * world).all()
    if rank == 0:
        assert ran_on == [THREAD_NAME], ran_on
    wait_for(lambda: pool_threads() == base, "the destroyed group's threads to end")
    return {"base_threads": base, "ran_on": ran_on}


def main():
    mode, init_file, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gradd", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    if mode in ("powersgd", "quant"):
        result = ddp_parity(rank, world, steps, mode)
    else:
        result = {"nested": nested, "error": error, "shutdown": shutdown}[mode](rank, world, steps)
    faulthandler.cancel_dump_traceback_later()
    result["rank"] = rank
    print(json.dumps(result), flush=True)
    if mode != "error":  # the failed job is not waited for
        dist.destroy_process_group()
    sys.stdout.flush()
    # torch 1.13's Gloo threads can hold futures with Python callbacks
    # (torch's Reducer keeps the last iteration's), which abort the process
    # when destroyed during interpreter finalisation. Everything is
    # reported: leave now.
    os._exit(0)


if __name__ == "__main__":
    main()
