"""Ranks as a user starts them: ``torch.multiprocessing`` spawn, one
process per rank, the worker a function of this directory's modules. Used by
the gradd.torch integration tests (process groups, subgroups, pickling,
PyTorch's tutorial examples)."""
import os
import socket
import time

import torch
import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(fn, world, args=(), timeout=120):
    """Runs fn(rank, *args) in `world` spawned processes and returns their
    return values (each rank's, by rank, through a queue); raises the first
    worker's error with its traceback, or TimeoutError naming the ranks
    still running after `timeout` seconds (they are killed)."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    context = mp.start_processes(
        _run, args=(fn, queue, args), nprocs=world, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + timeout
    try:
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                alive = [i for i, p in enumerate(context.processes) if p.is_alive()]
                raise TimeoutError(f"ranks {alive} still running after {timeout} s")
    finally:
        for p in context.processes:
            if p.is_alive():
                p.kill()
    results = [None] * world
    while not queue.empty():
        rank, value = queue.get()
        results[rank] = value
    return results


def _run(rank, fn, queue, args):
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    queue.put((rank, fn(rank, *args)))


def clean_env(extra=None):
    """The environment a spawned rank should see: no launcher variables
    (the tests' parent may run under a launcher itself), plus `extra`."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "NODE_RANK", "GROUP_WORLD_SIZE", "GRADD_JOB", "GRADD_COORDINATOR",
                "GRADD_SOCKET", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"):
        os.environ.pop(var, None)
    os.environ.update(extra or {})
