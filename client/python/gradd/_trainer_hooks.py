"""Communication hooks that run in the trainer (any hook torch accepts that
the daemon does not run itself; see gradd/_comm_hooks.py for which is which).

What it owns: the per-iteration bucket state of a model whose hook runs in
this process: which parameters of each bucket are ready, which buckets have
been handed to the hook and their futures, the locally used map. It runs on
the thread that runs autograd for the model (hooks are launched from the
autograd hooks and waited for in the end-of-backward callback), as torch's
c10d Reducer does. It depends on torch and torch.distributed, and on
gradd/_hook_group.py for the job's own gradd collectives; the daemon's
bucket machinery is not involved in the backward pass at all.

Which group a hook communicates over (gradd/_hook_group.py): a state that
means the DDP's own ranks (None for a DDP over the default group, the DDP's
``process_group``, a state object whose ``process_group`` is one of these)
is handed to the hook as the job's gradd process group (the torch.distributed
backend "gradd" over the DDP's ranks), so the hook's collectives go through
the daemon; any other state is handed over unchanged, and the hook uses the
group it names. Without gradd._c10d, or for CUDA modules, every state is
the user's.

torch 1.13's semantics (c10d ``Reducer`` with a comm hook):

* torch's buckets, exactly (TrainerComm's doc): one bucket per dtype in
  the first iteration, re-planned from the gradients' ready order after it,
  as torch does; ``bucket.buffer()`` holds this rank's local gradients,
  summed over the backward, not divided (the hook divides). A bucket that
  is one of gradd's plan buckets is gradd's shared bucket memory itself
  (``.grad`` views point into it); others are staged through a tensor;
* a bucket is handed to the hook as soon as all its parameters are ready and
  every bucket before it has been handed over (bucket-index order), from the
  autograd thread, during backward;
* at the end of backward every future is waited for, in bucket order; its
  result (a tensor of the bucket's size) is copied into the bucket, i.e.
  into every ``.grad`` view;
* with ``find_unused_parameters`` (or the first iteration of a static
  graph) the locally used map is summed over the DDP's ranks (the job's
  gradd group, else the DDP's process group, the default group when none
  was given), as torch does, after the hooks' futures completed;
* the re-plan uses rank 0's ready order (the daemon broadcasts it), as
  torch's ``sync_bucket_indices`` makes every rank use rank 0's buckets.

The daemon's own bucket rebuild is off in this mode (the daemon re-plans
from the ready order it sees, and here it sees none; the layout above is
torch's anyway). ``join()`` follows torch's protocol for hooks
(gradd/_trainer_join.py): a rank that ran out of inputs runs the hook on
zero buckets (:meth:`TrainerComm.shadow_iteration`) while others train.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, List, Optional

import numpy as np
import torch

from gradd import _hook_group

log = logging.getLogger("gradd.torch")

_TYPESTR = {
    torch.float32: "<f4",
    torch.float64: "<f8",
    torch.float16: "<f2",
    torch.bfloat16: "<i2",  # raw bits; viewed as bfloat16 below
}
_TORCH = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16}


class GradBucket:
    """What a hook receives: torch's ``dist.GradBucket`` API (buffer(),
    index(), is_last(), parameters(), gradients(), set_buffer()). torch's
    class cannot be constructed from Python; hooks only call its methods."""

    def __init__(self, index: int, num_buckets: int, buffer: torch.Tensor,
                 params: List[torch.nn.Parameter]):
        self._index = index
        self._last = index == num_buckets - 1
        self._buffer = buffer
        self._params = params
        self._offsets = []
        at = 0
        for p in params:
            self._offsets.append(at)
            at += p.numel()

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._last

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def set_buffer(self, buffer: torch.Tensor) -> None:
        self._buffer = buffer

    def parameters(self) -> List[torch.Tensor]:
        return list(self._params)

    def gradients(self) -> List[torch.Tensor]:
        """Per parameter, its view into the current buffer (as torch's)."""
        return [
            self._buffer[at:at + p.numel()].view(p.shape)
            for at, p in zip(self._offsets, self._params)
        ]

    def __repr__(self) -> str:
        return f"gradd.GradBucket(index={self._index}, numel={self._buffer.numel()})"


def flat_bucket(client, bucket: int, device: torch.device) -> torch.Tensor:
    """Bucket `bucket`'s flat memory as a 1-D tensor (no copy); the gradient
    views of its parameters alias it. Parameters lie packed in bucket order
    from the bucket's start (common/bucket_planner.cc)."""
    info = client.bucket(bucket)
    dtype = _TORCH[info["dtype"]]
    first = info["params"][0]
    elem = torch.empty((), dtype=dtype).element_size()
    numel = int(info["size_bytes"]) // elem
    if device.type == "cuda":
        class _Device:
            __cuda_array_interface__ = {
                "shape": (numel,),
                "typestr": _TYPESTR[dtype],
                "data": (int(client.gradient_address(first)), False),
                "version": 2,
                "strides": None,
            }

        with torch.cuda.device(device):
            flat = torch.as_tensor(_Device(), device=device)
    else:
        # The first parameter's array keeps the client (and its mapping)
        # alive; the strided view over the whole bucket keeps that array.
        base = client.gradient(first).reshape(-1)
        arr = np.lib.stride_tricks.as_strided(base, shape=(numel,), strides=(base.itemsize,))
        flat = torch.from_numpy(arr)
    if dtype == torch.bfloat16:
        flat = flat.view(torch.bfloat16)
    return flat


def hook_name(hook: Any) -> str:
    return getattr(hook, "__qualname__", None) or getattr(hook, "__name__", None) or repr(hook)


def _no_group_note() -> str:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return ""
    return (
        " (no torch.distributed process group is initialized: a communication hook "
        "that gradd runs in the trainer communicates over torch.distributed, so call "
        "torch.distributed.init_process_group(...) first, e.g. with backend 'gloo', "
        "or pass the hook a process group as its state)"
    )


def assign_buckets(params: List[torch.Tensor], order: List[int], limits: List[float],
                   registration_order: bool) -> List[List[int]]:
    """torch's own bucket assignment (``_compute_bucket_assignment_by_size``,
    what DDP and its rebuild call): parameters in `order` fill one open
    bucket per dtype, closed at its size limit (limits[0] for a dtype's
    first bucket, then limits[1], ...). With the registration order torch
    sorts the buckets by smallest index."""
    import torch.distributed as dist

    limits = [int(min(x, 1 << 62)) for x in limits]
    sparse = [False] * len(order)
    tensors = [params[i].detach() for i in order]
    if registration_order:
        got, _ = dist._compute_bucket_assignment_by_size(tensors, limits, sparse)
        return [[order[j] for j in b] for b in got]
    got, _ = dist._compute_bucket_assignment_by_size(tensors, limits, sparse, list(order))
    return [list(b) for b in got]


class TrainerComm:
    """Stands in for the client in the Reducer (same methods: mark_ready,
    mark_unused, skip_used_map, wait_all, globally_used_all) and runs the
    hook per bucket.

    Buckets follow torch 1.13's DDP exactly, which differs from gradd's plan
    before the rebuild: torch starts with ONE bucket per dtype in
    registration order (unless find_unused_parameters without static graph:
    then the size-capped buckets of the registration order, reversed), and
    after the first synced iteration (the second with static graph; never
    with find_unused_parameters without it) re-plans from the order the
    gradients became ready, with the first bucket capped at
    first_bucket_cap_mb. A bucket that is one of gradd's plan buckets (same
    parameters, same order) hands the hook gradd's shared bucket memory
    (no copy); any other is staged through a flat tensor of its own:
    gradients copied in before the hook, the result copied out into the
    ``.grad`` views after it.

    What it is given: the DDP's `reducer` (its client, parameters, names,
    gradient views, ``find_unused_parameters`` and ``static_graph``, read
    as they are at each backward), the DDP's placement `world` (a
    gradd._world.World: ranks, job id, process group), `socket` and
    `wait_timeout` for the job's gradd group, the bucket caps in MiB
    (`first_bucket_cap_mb` None: torch's 1 MiB) and `broadcast(tensors,
    root)`, the DDP's broadcast through the daemon (the rebuild's agreed
    order)."""

    def __init__(self, reducer, state: Any, hook: Callable, *, world, socket: Optional[str],
                 wait_timeout: float, first_bucket_cap_mb: Optional[float],
                 bucket_cap_mb: float, broadcast: Callable[[List[torch.Tensor], int], None]):
        self._reducer = reducer
        self._world = world
        self._broadcast = broadcast
        self.hook = hook
        self.name = hook_name(hook)
        # The job's gradd collectives (attached at first use), unless they
        # cannot stand in for the DDP's group; then the state the hook gets.
        reason = _hook_group.unusable_reason(world, reducer.device)
        self.unusable = reason
        self.job_group = _hook_group.JobGroup(
            world, socket=socket, wait_timeout=wait_timeout) if reason is None else None
        self.state, why = _hook_group.hook_state(world, state, self.job_group)
        log.info(_hook_group.describe(self.name, world, self.state, why, reason))
        self.device = reducer.device
        self.who = reducer.who
        self._params = reducer.params
        self._names = reducer.names
        self.nbytes = [p.numel() * p.element_size() for p in self._params]
        first_mb = first_bucket_cap_mb
        self.first_cap = int((first_mb if first_mb else 1.0) * (1 << 20))
        self.cap = int(bucket_cap_mb * (1 << 20))
        # Ready order of the iteration in progress and of the last one
        # completed (the rebuild's input, as torch's rebuilt_params_).
        self.order: List[int] = []
        self.last_order: List[int] = []
        self.completed = 0
        self.rebuilt = False
        # Laid out at the first backward (static_graph may be set after
        # the hook is registered).
        self.buckets: Optional[List[List[int]]] = None
        self._used: Optional[List[bool]] = None
        self._reset()

    def _set_layout(self, buckets: List[List[int]]) -> None:
        client = self._reducer.client
        plan = {}
        for b in range(client.num_buckets):
            ps = client.bucket(b)["params"]
            if ps:
                plan[tuple(ps)] = b
        self.buckets = buckets
        self.bucket_of = [0] * len(self.nbytes)
        self.buffers: List[torch.Tensor] = []
        self.staged: List[bool] = []
        for k, ps in enumerate(buckets):
            for i in ps:
                self.bucket_of[i] = k
            b = plan.get(tuple(ps))
            if b is not None:
                self.buffers.append(flat_bucket(client, b, self.device))
                self.staged.append(False)
            else:
                numel = sum(self._params[i].numel() for i in ps)
                self.buffers.append(torch.zeros(numel, dtype=self._params[ps[0]].dtype,
                                                device=self.device))
                self.staged.append(True)
        self.bucket_params = [[self._params[i] for i in ps] for ps in buckets]

    def _initial_layout(self) -> List[List[int]]:
        r, n = self._reducer, len(self.nbytes)
        if r.static_graph or not r.find_unused_parameters:
            return assign_buckets(self._params, list(range(n)), [float("inf")], True)
        return assign_buckets(self._params, list(range(n)), [self.first_cap, self.cap],
                              True)[::-1]

    def _maybe_rebuild(self) -> None:
        """Where torch's forward rebuilds its buckets (first mark of an
        iteration here: the layout only matters to backward). Every rank
        plans from rank 0's ready order (torch broadcasts rank 0's bucket
        assignment); a rank that has none (it ran out of inputs before
        completing an iteration) offers the registration order, as torch's
        joined rank does."""
        r = self._reducer
        if self.rebuilt or (r.find_unused_parameters and not r.static_graph):
            return
        if self.completed < (2 if r.static_graph else 1):
            return
        n = len(self.nbytes)
        order = self.last_order if len(self.last_order) == n else list(range(n))
        if self._world.world_size > 1:
            agreed = torch.tensor(order, dtype=torch.int64)
            self._broadcast([agreed], 0)
            order = agreed.tolist()
        self._set_layout(assign_buckets(self._params, order, [self.first_cap, self.cap], False))
        self.rebuilt = True

    # ------------------------------------------------------- per iteration
    def _reset(self) -> None:
        self.order = []
        self.next_bucket = 0
        self.futures: List[Any] = []
        self.local_used = [False] * len(self.nbytes)
        self.need_used_map = True
        self.started = False

    def _start(self) -> None:
        if self.started:
            return
        self.started = True
        if self.buckets is None:
            self._set_layout(self._initial_layout())
        else:
            self._maybe_rebuild()
        self.pending = [len(ps) for ps in self.buckets]

    def mark_ready(self, i: int, stream: int = 0) -> None:
        self._start()
        self.local_used[i] = True
        self._ready(i)

    def mark_unused(self, i: int, keep: bool = False) -> None:
        self._start()
        if not keep:
            with torch.no_grad():
                self._reducer.views[i].zero_()
        self._ready(i)

    def skip_used_map(self) -> None:
        self.need_used_map = False

    def _ready(self, i: int) -> None:
        self.order.append(i)
        k = self.bucket_of[i]
        self.pending[k] -= 1
        if self.pending[k] < 0:
            raise RuntimeError(
                f"gradd ({self.who}): parameter '{self._names[i]}' was marked "
                "ready twice in one backward"
            )
        while self.next_bucket < len(self.buckets) and self.pending[self.next_bucket] == 0:
            self._launch(self.next_bucket)
            self.next_bucket += 1

    def _launch(self, k: int) -> None:
        if self.staged[k]:
            self._stage_in(k)
        bucket = GradBucket(k, len(self.buckets), self.buffers[k], self.bucket_params[k])
        self.futures.append(self._call_hook(k, bucket))

    def _call_hook(self, k: int, bucket: GradBucket):
        try:
            fut = self.hook(_hook_group.resolve(self.state), bucket)
        except Exception as e:
            raise RuntimeError(
                f"gradd ({self.who}): communication hook {self.name} raised on bucket {k}: "
                f"{type(e).__name__}: {e}{_no_group_note()}"
            ) from e
        if not isinstance(fut, torch._C.Future):  # torch.futures.Future, .then()
            raise RuntimeError(
                f"gradd ({self.who}): communication hook {self.name} must return a "
                f"torch.futures.Future[torch.Tensor]; it returned {type(fut).__name__} "
                f"for bucket {k}"
            )
        return fut

    def wait_all(self, stream: int = 0) -> None:
        try:
            if not self.started:  # nothing was marked: nothing to wait for
                return
            if self.next_bucket != len(self.buckets):
                missing = [
                    self._names[i]
                    for ps in self.buckets[self.next_bucket:]
                    for i in ps
                ]
                raise RuntimeError(
                    f"gradd ({self.who}): buckets were not all handed to the communication "
                    f"hook; parameters not ready: {', '.join(missing[:10])}"
                )
            for k, fut in enumerate(self.futures):
                self._take_result(k, fut)
            self._used = None
            if self.need_used_map:
                self._used = self._reduce_used_map(self.local_used)
            if len(self.order) == len(self.nbytes):
                self.last_order = list(self.order)
            self.completed += 1
        finally:
            self._reset()

    def shadow_iteration(self) -> None:
        """join(): this rank ran out of inputs while others train. As
        torch's joined rank (``_DDPJoinHook.main_hook``:
        ``_match_all_reduce_for_bwd_pass``), run the hook on zero buckets of
        the current layout, in bucket order, so that its collectives match
        the active ranks'; wait for every future and drop the results
        (.grad is untouched); then match the used-map reduce when theirs
        runs (zeros: nothing used here)."""
        try:
            self._start()
            futures = []
            for k in range(len(self.buckets)):
                like = self.buffers[k]
                zeros = torch.zeros(like.numel(), dtype=like.dtype, device=like.device)
                bucket = GradBucket(k, len(self.buckets), zeros, self.bucket_params[k])
                futures.append(self._call_hook(k, bucket))
            for k, fut in enumerate(futures):
                self._result(k, fut)
            r = self._reducer
            if (r.find_unused_parameters and not r.static_graph) or (
                    r.static_graph and self.completed == 0):
                self._reduce_used_map([False] * len(self.nbytes))
            self.completed += 1
        finally:
            self._reset()

    def _result(self, k: int, fut) -> torch.Tensor:
        """Waits for bucket k's future; its tensor of the bucket's size."""
        try:
            result = fut.wait()
        except Exception as e:
            raise RuntimeError(
                f"gradd ({self.who}): the future of communication hook {self.name} failed "
                f"for bucket {k}: {type(e).__name__}: {e}{_no_group_note()}"
            ) from e
        if isinstance(result, (list, tuple)) and len(result) == 1:
            result = result[0]
        buf = self.buffers[k]
        if not isinstance(result, torch.Tensor) or result.numel() != buf.numel():
            got = (f"a tensor of {result.numel()} elements" if isinstance(result, torch.Tensor)
                   else type(result).__name__)
            raise RuntimeError(
                f"gradd ({self.who}): communication hook {self.name} must complete its "
                f"future with a tensor of the bucket's {buf.numel()} elements; bucket {k} "
                f"got {got}"
            )
        return result

    def _take_result(self, k: int, fut) -> None:
        result = self._result(k, fut)
        buf = self.buffers[k]
        with torch.no_grad():
            if self.staged[k]:
                flat = result.reshape(-1)
                views = self._reducer.views
                at = 0
                for i in self.buckets[k]:
                    v = views[i]
                    v.copy_(flat[at:at + v.numel()].view(v.shape))
                    at += v.numel()
            elif result.data_ptr() != buf.data_ptr() or result.dtype != buf.dtype:
                buf.copy_(result.reshape(-1))

    def _stage_in(self, k: int) -> None:
        buf = self.buffers[k]
        views = self._reducer.views
        at = 0
        with torch.no_grad():
            for i in self.buckets[k]:
                v = views[i]
                buf[at:at + v.numel()].copy_(v.reshape(-1))
                at += v.numel()

    def group(self):
        """The process group of the DDP's ranks for gradd's own collectives
        on this path (the used map, join's per-iteration step): the job's
        gradd group when usable, else the DDP's torch.distributed group (the
        default group for None); None without either."""
        import torch.distributed as dist

        if self.job_group is not None:
            return self.job_group.raw()
        if not (dist.is_available() and dist.is_initialized()):
            return None
        return self._world.group if self._world.group is not None else dist.group.WORLD

    def close(self) -> None:
        if self.job_group is not None:
            self.job_group.close()

    def _reduce_used_map(self, local_used: List[bool]) -> List[bool]:
        import torch.distributed as dist

        group = self.group()
        if group is None:
            raise RuntimeError(
                f"gradd ({self.who}): find_unused_parameters / static_graph with the "
                f"communication hook {self.name}, which runs in the trainer, reduces the "
                "used-parameter map over the DDP's ranks as torch's DDP does: the job's "
                f"gradd group is not usable ({self.unusable}) and no torch.distributed "
                "process group is initialized; call torch.distributed.init_process_group "
                "first"
            )
        used = torch.tensor([1 if u else 0 for u in local_used], dtype=torch.int32)
        if self.device.type == "cuda" and dist.get_backend(group) != "gloo":
            used = used.to(self.device)
        dist.all_reduce(used, group=group)
        return [bool(v) for v in used.cpu().tolist()]

    def globally_used_all(self) -> List[bool]:
        if self._used is None:
            return [True] * len(self.nbytes)
        return list(self._used)
