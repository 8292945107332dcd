"""The backward machinery of gradd.torch.DistributedDataParallel: what torch's
c10d ``Reducer`` does, over a gradd client.

One ``Reducer`` per DDP model. It owns the per-parameter gradient views into
the shared buckets, the autograd hooks' per-iteration state and the static
graph record. Every call runs on the thread that runs autograd for the model
(CPU autograd runs hooks and callbacks on the caller's thread, under the GIL).

Iteration state machine (torch: ``expect_autograd_hooks_``)::

         DDP forward with grad sync               hooks fire: hand over
   IDLE ---------------------------> EXPECTING ---------------------------+
    ^     (forward without sync,        |  ^                              |
    |      ddp.module(...): stay IDLE,  |  | another DDP forward before   |
    |      hooks ignored)               |  | any hook: start afresh       |
    |                                   |  +------------------------------+
    |      end-of-backward callback     v
    +---------------------------- FINISHING: mark the rest unused, wait,
                                  apply torch's gradient rules

Gradient rules (torch 1.13 ``mark_variable_ready_dense`` /
``finalize_bucket_dense``, gradient_as_bucket_view or not -- the values are
the same):

* a parameter whose hook fired with a gradient contributes it; afterwards
  ``.grad`` is its view into the bucket, holding the average;
* a parameter no hook fired for (or whose hook saw no gradient) contributes
  its existing ``.grad`` if it has one, zeros otherwise, and counts as
  unused on this rank;
* with find_unused_parameters, a parameter that got a gradient in a local
  backward (under no_sync(), or through ``ddp.module``) since the last synced
  one counts as used by this rank, as in torch 2.x. (torch 1.13 forgets such
  use and leaves the parameter's gradient untouched where nobody used it in
  the synced backward, so ranks end up with different gradients; gradd keeps
  them identical.)
* without find_unused_parameters / static_graph every parameter ends with
  the average; with them, a parameter some rank used ends with the average on
  every rank (None becomes the view), and one no rank used keeps ``.grad``
  exactly as it was (None stays None; an existing gradient is neither zeroed
  nor averaged).

The "used by some rank" answer comes from the client's used map, which the
daemon reduces like a gradient (client/src/data/used_map_client.h).

Static graph (torch ``static_graph=True``): the first synced backward hands
everything over at its end and records how often each parameter's hook fired
and which parameters were unused (locally and globally); later backwards hand
a parameter over at its last hook firing, mark the recorded unused ones at
the first hook and skip the used map. Without static graph a second firing
for one parameter in one backward is torch's "marked ready twice" error.
"""
from __future__ import annotations

import time
import weakref
from typing import Callable, Dict, List, Optional

import torch
from torch.utils import _pytree

from gradd import _cuda, _torch_compat
from gradd._C import IterationAbortedError

_MARKED_TWICE = (
    "Expected to mark a variable ready only once. This error is caused by one of the "
    "following reasons: 1) Use of a module parameter outside the `forward` function. "
    "Please make sure model parameters are not shared across multiple concurrent "
    "forward-backward passes. or try to use _set_static_graph() as a workaround if this "
    "module graph does not change during training loop.2) Reused parameters in multiple "
    "reentrant backward passes. For example, if you use multiple `checkpoint` functions "
    "to wrap the same part of your model, it would result in the same set of parameters "
    "been used by different reentrant backward passes multiple times, and hence marking "
    "a variable ready multiple times. DDP does not support such use cases in default. You "
    "can try to use _set_static_graph() (or static_graph=True) as a workaround if your "
    "module graph does not change over iterations."
)

# torch's messages for _set_static_graph() (gradd/torch.py).
STATIC_GRAPH_TOO_LATE = (
    "set_static_graph() should be called before training loop starts and after "
    "DistributedDataParallel is constructed"
)
STATIC_GRAPH_FINDS_UNUSED = (
    "You passed find_unused_parameters=true to DistributedDataParallel, "
    "`_set_static_graph` will detect unused parameters automatically, so you do not need "
    "to set find_unused_parameters=true, just be sure these unused parameters will not "
    "change during training loop while calling `_set_static_graph`."
)


class _Sink(torch.autograd.Function):
    """Passes a DDP forward's outputs through so that the first thing the
    outer backward runs queues the end-of-backward callback on the OUTER
    graph task (a hook firing inside a reentrant backward, e.g. activation
    checkpointing, would otherwise queue it on the inner one, which ends too
    early). torch's _DDPSink does the same."""

    @staticmethod
    def forward(ctx, reducer_ref, *tensors):
        ctx.set_materialize_grads(False)  # None gradients stay None
        ctx.reducer_ref = reducer_ref
        return tuple(t.clone() for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        reducer = ctx.reducer_ref()
        if reducer is not None:
            if _torch_compat.in_compiled_autograd():  # see _make_hook
                _torch_compat.refuse_compiled_autograd("backward")
            reducer.queue_finish()
        return (None, *grads)


class Reducer:
    def __init__(
        self,
        client,
        params: List[torch.nn.Parameter],
        names: List[str],
        views: List[torch.Tensor],
        *,
        find_unused_parameters: bool,
        who: str,
        fail: Callable[[BaseException], None],
        done: Optional[Callable[[], None]] = None,
        device: Optional[torch.device] = None,
        sparse=None,
    ):
        self.client = client
        # Where gradients go when they are ready: the client (the daemon
        # reduces them) or, for a communication hook that runs in the
        # trainer, gradd/_trainer_hooks.py's TrainerComm (same methods).
        self.comm = client
        # CUDA modules: mark_ready / wait_all name the current stream
        # (gradd/_cuda.py); 0 for CPU modules.
        self.device = device if device is not None else torch.device("cpu")
        self.params = params
        self.names = names
        self.views = views
        self.find_unused_parameters = find_unused_parameters
        self.static_graph = False
        self.who = who
        self._fail = fail
        # Called at the end of every synced backward that completed.
        self._done = done
        # gradd.torch.OptimizerWrapper: an iteration aborted by a rank
        # restart ends backward() normally (the wrapper's step() skips it)
        # instead of raising IterationAbortedError out of it.
        self.abort_quietly = False
        # Forward overlap (gradd/_overlap.py): set, the end of backward hands
        # the waits to it (the next forward waits bucket by bucket).
        self.overlap = None
        # Sparse parameters (gradd/_sparse.py): reduced after the dense
        # buckets of every synced backward, outside the bucket machinery.
        self.sparse = sparse
        self._sparse_fired = False
        n = len(params)
        self.expect_hooks = False
        self._fired = [0] * n
        self._marked = [False] * n
        self._any_marked = False
        self._first_hook_done = False
        self._callback_queued = False
        # Locally unused parameters handed over this iteration: index ->
        # "none" (grad was None), "view" (grad is the view; its value saved
        # in _saved) or "other" (grad is another tensor, left alone).
        # Parameters that got a gradient in a local backward since the last
        # synced one (find_unused_parameters; torch 2.x's local_used_map
        # survives no_sync iterations).
        self._used_since_sync = [False] * n
        self._unused: Dict[int, str] = {}
        self._saved: Dict[int, torch.Tensor] = {}
        # Static graph record (after its first synced backward).
        self._static_counts: Optional[List[int]] = None
        self._static_unused: List[int] = []
        self._static_globally_used: List[bool] = []
        self._remaining: List[int] = []
        # Statistics (nanoseconds), for _get_ddp_logging_data. `last` holds
        # the latest synced iteration's durations, its monotonic stamps
        # ("t_forward_start", "t_forward_end" = backward compute start,
        # "t_compute_end", "t_first_mark" = comm start, "t_done") and
        # "ready_order": the parameter indices in the order this rank handed
        # their gradients over (used or unused).
        self.iterations_done = 0
        self.unused_parameter_size = 0
        self.totals = {"forward": 0, "backward_compute": 0, "backward_comm": 0, "overlap": 0}
        self.last = dict(self.totals)
        self._t_forward_end = 0
        self._t_first_mark = 0
        self._ready_order: List[int] = []
        self._hooks = []
        self_ref = weakref.ref(self)
        with torch.enable_grad():
            for i, p in enumerate(params):
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
                acc.register_hook(_make_hook(self_ref, i))
                self._hooks.append(acc)  # the param holds its accumulator weakly
            for p in sparse.params if sparse is not None else ():
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
                acc.register_hook(_make_hook(self_ref, -1))
                self._hooks.append(acc)

    # ----------------------------------------------------------- iteration
    @property
    def static_first_iteration(self) -> bool:
        return self.static_graph and self._static_counts is None

    @property
    def backward_in_progress(self) -> bool:
        return self._any_marked

    def prepare_for_backward(self, forward_start_ns: int) -> None:
        """A DDP forward with gradient sync ran (its module forward started
        at `forward_start_ns`, time.monotonic_ns()): the next backward
        syncs."""
        self._reset()
        self.expect_hooks = True
        self._t_forward_end = time.monotonic_ns()
        self.last["forward"] = max(0, self._t_forward_end - forward_start_ns)
        self.last["t_forward_start"] = forward_start_ns
        self.last["t_forward_end"] = self._t_forward_end

    def wrap_output(self, output):
        """Routes the output's tensors that need a gradient through _Sink."""
        try:
            leaves, spec = _pytree.tree_flatten(output)
        except Exception:  # an output pytree cannot describe: hooks queue
            return output
        idx = [k for k, t in enumerate(leaves) if isinstance(t, torch.Tensor) and t.requires_grad]
        if not idx:
            return output
        passed = _Sink.apply(weakref.ref(self), *[leaves[k] for k in idx])
        for k, t in zip(idx, passed):
            leaves[k] = t
        return _pytree.tree_unflatten(leaves, spec)

    def queue_finish(self) -> None:
        if self.expect_hooks and not self._callback_queued and self.client is not None:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)

    def _reset(self) -> None:
        n = len(self.params)
        self._sparse_fired = False
        self._fired = [0] * n
        self._marked = [False] * n
        self._any_marked = False
        self._first_hook_done = False
        self._ready_order = []
        self._unused.clear()
        self._saved.clear()
        if self._static_counts is not None:
            self._remaining = list(self._static_counts)

    # --------------------------------------------------------------- hooks
    def on_grad_ready(self, i: int) -> None:
        if i < 0:  # a sparse parameter: only makes sure the finish runs
            if self.expect_hooks and self.client is not None:
                self.queue_finish()
                self._sparse_fired = True
            return
        overlap = self.overlap
        if overlap is not None and overlap.pending:
            overlap.finish()  # any backward needs the finished iteration
        if not self.expect_hooks or self.client is None:
            # No DDP forward with sync before this backward: purely local.
            if self.find_unused_parameters and self.params[i].grad is not None:
                self._used_since_sync[i] = True
            return
        self.queue_finish()
        self._fired[i] += 1
        if self.static_first_iteration:
            return  # torch delays every reduction of the first iteration
        if self.static_graph:
            if self._remaining[i] <= 0:
                self._fail(RuntimeError(
                    f"gradd ({self.who}): parameter '{self.names[i]}' (index {i}) received "
                    "a gradient more often than in the first iteration. Your training graph "
                    "has changed in this iteration, e.g., one parameter is unused in first "
                    "iteration, but then got used in the second iteration. this is not "
                    "compatible with static_graph set to True."
                ))
            self._on_first_hook()
            self._remaining[i] -= 1
            if self._remaining[i] == 0:
                self._hand_over(i)
            return
        if self._fired[i] > 1:
            self._fail(RuntimeError(
                f"{_MARKED_TWICE} Parameter at index {i} with name {self.names[i]} has been "
                "marked as ready twice. This means that multiple autograd engine hooks have "
                f"fired for this particular parameter during this iteration ({self.who})."
            ))
        self._on_first_hook()
        self._hand_over(i)

    def _on_first_hook(self) -> None:
        if self._first_hook_done:
            return
        self._first_hook_done = True
        if self.static_graph:
            # The unused set is fixed: hand those over now, as torch does.
            for j in self._static_unused:
                self._mark_unused(j)
        if not self.static_graph and self.find_unused_parameters:
            return  # this iteration's used map is needed
        self._call(self.comm.skip_used_map)

    def _hand_over(self, i: int) -> None:
        """Parameter i's gradient is final: into its view, and ready."""
        p, view = self.params[i], self.views[i]
        g = p.grad
        if g is None:  # the hook saw no gradient: torch treats it as unused
            self._mark_unused(i)
            return
        if not _is_view(g, view):
            # First use, zero_grad(set_to_none=True), no_sync accumulation or
            # a replaced .grad: bring the gradient into shared memory.
            with torch.no_grad():
                view.copy_(g)
            p.grad = view
        self._mark(i)
        self._call(self.comm.mark_ready, i, _cuda.stream_handle(self.device))

    def _mark_unused(self, i: int) -> None:
        p, view = self.params[i], self.views[i]
        g = p.grad
        if g is None:
            self._unused[i] = "none"
            keep = False
        elif _is_view(g, view):
            self._unused[i] = "view"
            self._saved[i] = g.detach().clone()
            keep = True
        else:
            self._unused[i] = "other"
            with torch.no_grad():
                view.copy_(g)
            keep = True
        if not keep and self.device.type == "cuda":
            # The library cannot zero device memory without a stream: zero
            # it on the current one and contribute what it then holds.
            with torch.no_grad():
                view.zero_()
            keep = True
        self._mark(i)
        self._call(self.comm.mark_unused, i, keep)

    def _mark(self, i: int) -> None:
        if not self._any_marked:
            self._any_marked = True
            self._t_first_mark = time.monotonic_ns()
        self._marked[i] = True
        self._ready_order.append(i)

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except RuntimeError as e:  # GraddError: the job cannot go on
            self._fail(e)

    # -------------------------------------------------------------- finish
    def _finish(self) -> None:
        self._callback_queued = False
        if not self.expect_hooks or self.client is None:
            return
        if (
            not any(self._fired)
            and not self.static_first_iteration
            and not self._sparse_fired
        ):
            return  # no parameter took part: nothing was handed over
        t_compute_end = time.monotonic_ns()
        first_static = self.static_first_iteration
        n = len(self.params)
        if first_static:
            self._first_hook_done = True  # no skip: the used map is needed
            for i in range(n):
                if self._fired[i] > 0:
                    self._hand_over(i)
                else:
                    self._mark_unused(i)
        elif self.static_graph:
            short = [i for i in range(n) if not self._marked[i] and self._remaining[i] > 0]
            if short:
                self._fail(RuntimeError(
                    f"gradd ({self.who}): with static_graph=True, parameters "
                    f"{self._names(short)} received fewer gradients in this backward than in "
                    "the first iteration; the training graph must not change with "
                    "static_graph"
                ))
            for i in range(n):
                if not self._marked[i]:
                    self._mark_unused(i)
        else:
            missing = [i for i in range(n) if not self._marked[i]]
            if missing and not self.find_unused_parameters:
                self._fail(RuntimeError(
                    f"gradd ({self.who}): parameters that did not receive a gradient in "
                    f"this backward pass: {self._names(missing)}. Pass "
                    "find_unused_parameters=True to DistributedDataParallel if the module "
                    "has parameters that do not take part in the loss, and make sure all "
                    "forward outputs contribute to it."
                ))
            for i in missing:
                if self._used_since_sync[i] and self.params[i].grad is not None:
                    self._hand_over(i)  # used locally: counts, contributes
                else:
                    self._mark_unused(i)
        if self.overlap is not None:
            self._hand_waits_to_overlap(t_compute_end)
            return
        try:
            self._call(self.comm.wait_all, _cuda.stream_handle(self.device))
        except IterationAbortedError:
            if self.abort_quietly:
                # _fail -> _restart.on_aborted has reset this iteration and
                # marked it uncommitted; _done is not called, so it stays so.
                return
            raise
        if self.sparse is not None and len(self.sparse):
            self._call(self.sparse.reduce)
        t_done = time.monotonic_ns()

        if first_static:
            self._static_counts = list(self._fired)
            self._static_unused = [i for i in range(n) if self._fired[i] == 0]
            self._static_globally_used = self.comm.globally_used_all()
        used = self._globally_used(first_static)
        unused_bytes = 0
        for i, kind in self._unused.items():
            view = self.views[i]
            if used is None or used[i]:
                self.params[i].grad = view  # the average (None became it)
                continue
            unused_bytes += view.numel() * view.element_size()
            if kind == "view":  # nobody used it: as it was, not averaged
                with torch.no_grad():
                    view.copy_(self._saved[i])
        self.unused_parameter_size = unused_bytes
        self._record_times(t_compute_end, t_done)
        self.last["ready_order"] = tuple(self._ready_order)
        self._reset()
        self._used_since_sync = [False] * n
        self.expect_hooks = False
        self.iterations_done += 1
        if self._done is not None:
            self._done()

    def _hand_waits_to_overlap(self, t_compute_end: int) -> None:
        """Forward overlap: every bucket is handed over; the iteration ends
        in the next forward (gradd/_overlap.py), which then calls
        complete_overlapped. Without find_unused_parameters / static_graph
        (refused with overlap) every parameter ends with the average."""
        for i in self._unused:
            self.params[i].grad = self.views[i]
        self.unused_parameter_size = 0
        self.last["ready_order"] = tuple(self._ready_order)
        self._reset()
        self._used_since_sync = [False] * len(self.params)
        self.expect_hooks = False
        self.iterations_done += 1
        self.overlap.begin(t_compute_end)

    def complete_overlapped(self, t_compute_end: int, t_done: int) -> None:
        """The overlapped iteration's buckets are all averaged."""
        self._record_times(t_compute_end, t_done)
        if self._done is not None:
            self._done()

    def abort_iteration(self) -> None:
        """The iteration was aborted by a rank restart (gradd/_restart.py):
        forget what this backward handed over, as if it had not run, so the
        batch can be retried with a new forward. The client library has
        moved on to the next iteration itself."""
        self._reset()
        self._callback_queued = False
        self.expect_hooks = False

    def _globally_used(self, first_static: bool) -> Optional[List[bool]]:
        """None: every parameter counts as used (no find_unused / static)."""
        if self.static_graph and not first_static:
            return self._static_globally_used
        if self.static_graph or self.find_unused_parameters:
            return self.comm.globally_used_all()
        return None

    def _record_times(self, t_compute_end: int, t_done: int) -> None:
        compute = max(0, t_compute_end - self._t_forward_end)
        comm = max(0, t_done - self._t_first_mark)
        self.last.update(
            backward_compute=compute,
            backward_comm=comm,
            overlap=max(0, t_compute_end - self._t_first_mark),
            t_compute_end=t_compute_end,
            t_first_mark=self._t_first_mark,
            t_done=t_done,
        )
        for k in self.totals:
            self.totals[k] += self.last[k]

    def _names(self, idx: List[int]) -> str:
        shown = ", ".join(self.names[i] for i in idx[:10])
        return shown + (f" and {len(idx) - 10} more" if len(idx) > 10 else "")

    def detach(self) -> None:
        self.client = None
        self.expect_hooks = False


def _make_hook(reducer_ref, index: int):
    def hook(*unused):
        reducer = reducer_ref()
        if reducer is not None:
            if _torch_compat.in_compiled_autograd():
                # A backward run by compiled autograd (enabled around the
                # backward only, so the forward's check did not see it).
                _torch_compat.refuse_compiled_autograd("backward")
            reducer.on_grad_ready(index)

    return hook


def _is_view(g: torch.Tensor, view: torch.Tensor) -> bool:
    return (
        g.data_ptr() == view.data_ptr()
        and g.dtype == view.dtype
        and g.shape == view.shape
        and g.stride() == view.stride()
    )
