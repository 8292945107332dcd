"""gradd's collective API for tensors, with torch.futures.Future results.

::

    import gradd
    from gradd.collectives import Collectives
    client = gradd.attach([], job_id="j", local_rank=r, local_world_size=n)
    coll = Collectives(client)
    fut = coll.allreduce(torch.ones(10), op="sum")   # returns at once
    total = fut.wait()                                # the tensor, reduced in place

Every call queues the collective on one worker thread per Collectives (the
client runs one collective at a time, and every rank must issue the same
sequence, as with torch.distributed) and returns a ``torch.futures.Future``
that completes with the result, or raises the ``gradd.GraddError`` from the
client (its message names the job, the rank and what went wrong) in
``wait()``. Callbacks added with ``then`` / ``add_done_callback`` run on the
worker thread.

Tensors: CPU; float32/64, float16, int32/64, uint8, int8 (bfloat16 has no
numpy type: use the torch.distributed backend, gradd.distributed, for it).
A non-contiguous tensor is reduced in a contiguous copy that is copied back.
"""
from __future__ import annotations

import queue
import threading
from typing import Optional

import torch

__all__ = ["Collectives"]

_OPS = ("sum", "avg", "min", "max")


def _check(tensor: torch.Tensor, what: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"gradd {what}: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(f"gradd {what}: CPU tensors only, got a tensor on {tensor.device}")
    if tensor.dtype == torch.bfloat16:
        raise TypeError(f"gradd {what}: bfloat16 has no numpy type; use the "
                        "torch.distributed backend (gradd.distributed) for it")


def _check_op(op: str, what: str) -> str:
    if op not in _OPS:
        raise ValueError(f"gradd {what}: op must be one of {', '.join(_OPS)}, got {op!r}")
    return op


class Collectives:
    """Asynchronous collectives over an attached ``gradd.Client`` (see module doc).

    ``close()`` (or the context manager) finishes the queued collectives and
    stops the worker; the client stays attached (detach it yourself)."""

    def __init__(self, client):
        self._client = client
        self._queue: "queue.Queue[Optional[tuple]]" = queue.Queue()
        self._closed = False
        self._lock = threading.Lock()
        self._worker = threading.Thread(target=self._run, name="gradd-collectives", daemon=True)
        self._worker.start()

    @property
    def world_size(self) -> int:
        return self._client.world_size

    @property
    def rank(self) -> int:
        return self._client.global_rank

    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            fut, body = item
            try:
                result = body()
            except BaseException as e:  # noqa: BLE001 - handed to the future
                fut.set_exception(e)
            else:
                fut.set_result(result)

    def _submit(self, body) -> torch.futures.Future:
        fut = torch.futures.Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("gradd collectives: closed")
            self._queue.put((fut, body))
        return fut

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(None)
        self._worker.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def allreduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.futures.Future:
        """In place: tensor = op over every rank's tensor. Future[tensor]."""
        _check(tensor, "allreduce")
        _check_op(op, "allreduce")
        buf = tensor if tensor.is_contiguous() else tensor.contiguous()

        def body():
            self._client.allreduce(buf.numpy(), op=op)
            if buf is not tensor:
                tensor.copy_(buf)
            return tensor

        return self._submit(body)

    def allgather(self, tensor: torch.Tensor) -> torch.futures.Future:
        """Future[Tensor of shape (world_size, *tensor.shape)]: every rank's
        tensor in rank order."""
        _check(tensor, "allgather")
        src = tensor.contiguous()

        def body():
            out = torch.empty((self.world_size, *src.shape), dtype=src.dtype)
            self._client.allgather(src.numpy(), out.numpy())
            return out

        return self._submit(body)

    def reduce_scatter(self, tensor: torch.Tensor, op: str = "sum") -> torch.futures.Future:
        """`tensor` holds world_size equal blocks along dim 0; Future[this
        rank's block of the element-wise reduction]."""
        _check(tensor, "reduce_scatter")
        _check_op(op, "reduce_scatter")
        world = self.world_size
        if tensor.dim() == 0 or tensor.shape[0] % world != 0:
            raise ValueError(f"gradd reduce_scatter: dim 0 of shape {tuple(tensor.shape)} "
                             f"is not a multiple of the world size {world}")
        src = tensor.contiguous()

        def body():
            out = torch.empty((src.shape[0] // world, *src.shape[1:]), dtype=src.dtype)
            self._client.reduce_scatter(src.numpy(), out.numpy(), op=op)
            return out

        return self._submit(body)

    def broadcast(self, tensor: torch.Tensor, root: int = 0) -> torch.futures.Future:
        """In place: tensor = rank `root`'s tensor. Future[tensor]."""
        _check(tensor, "broadcast")
        buf = tensor if tensor.is_contiguous() else tensor.contiguous()

        def body():
            self._client.broadcast(buf.numpy(), root)
            if buf is not tensor:
                tensor.copy_(buf)
            return tensor

        return self._submit(body)

    def barrier(self) -> torch.futures.Future:
        """Future[None], completed once every rank entered the barrier."""
        return self._submit(lambda: self._client.barrier())
