"""Forward overlap for gradd.torch.DistributedDataParallel: the next forward
starts on the parameters whose gradients are done.

``DistributedDataParallel._register_fused_optim(optim_cls, ..., overlap_forward=True)`` (torch's
optimizer overlap: the optimizer steps each bucket's parameters; the user
calls no ``optimizer.step()``) with gradd's daemon path: buckets go to the
daemon as usual (so its scheduling orders them on the wire, first layers
first), but ``backward()`` returns once every bucket is handed over,
without waiting for the averages. The next DDP forward waits per submodule:
a forward pre-hook on every submodule that owns parameters waits
(``client.wait_bucket``) only for the buckets holding that submodule's own
parameters, steps those parameters with the functional optimizer (torch's
``step_param``, as torch's ``_hook_then_optimizer`` does per bucket) and
lets the submodule run; the buckets left are waited for and stepped at the
end of that forward, before anything can start a backward. The optimizer
step is per parameter, so the values are bitwise those of the same
training that waits at the end of backward and then steps.

Why an argument of ``_register_fused_optim`` and not of the constructor:
starting the forward early is only right when the optimizer step is taken
out of the user's hands and done per parameter by DDP, which is exactly
what ``_register_fused_optim`` is; with a user's ``optimizer.step()`` after
``backward()`` the gradients must all be there when backward returns.

Anything that needs the finished iteration finishes it first
(``finish()``): ``ddp.wait_gradients()``, reading parameters or the state
through the DDP (``parameters()``, ``named_parameters()``,
``state_dict()``), ``no_sync()``, ``join()``, pickling, ``shutdown()``, a
forward that may rebuild the buckets (until the rebuild after the first
iteration, and around an autotune plan switch), any backward, and
``ddp.zero_grad()`` is deferred until the iteration is finished (the same
values as zeroing after the step). What it cannot see: reading
``p.grad`` or parameters through ``ddp.module`` or the user's own
references, a submodule whose forward uses parameters another submodule
owns before that one ran, and torch.distributed collectives; call
``ddp.wait_gradients()`` first.

Refused (ValueError at registration): find_unused_parameters, static_graph,
sparse gradients, CUDA modules (the per-bucket stream wait exists in the
client library but has not run on a GPU), rank restart or node loss (an
aborted iteration would have stepped some buckets already).

Runs on the trainer's main thread (forward pre-hooks, the autograd
engine's end-of-backward callback on CPU).
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable, Dict, List, Optional

import torch

_WHY = "gradd: _register_fused_optim(..., overlap_forward=True) "


def check_supported(*, find_unused_parameters: bool, static_graph: bool, sparse: int,
                    device: torch.device, restart_enabled: bool) -> None:
    """The combinations forward overlap cannot support (module doc)."""
    refused = []
    if find_unused_parameters:
        refused.append("find_unused_parameters=True (the used map is only known at the end)")
    if static_graph:
        refused.append("static_graph (its first iteration reduces at the end of backward)")
    if sparse:
        refused.append("sparse gradients (reduced by the trainer at the end of backward)")
    if device.type != "cpu":
        refused.append(f"a module on {device} (CPU modules only so far)")
    if restart_enabled:
        refused.append("rank restart or node loss (rank_restart_grace_ms / min_nodes > 0: an "
                       "aborted iteration could have stepped some buckets already)")
    if refused:
        raise ValueError(_WHY + "does not support " + "; ".join(refused))


def refuse_static_graph(overlap) -> None:
    """_set_static_graph() after forward overlap was registered."""
    if overlap is not None:
        raise ValueError(_WHY + "does not support static_graph (its first iteration reduces "
                         "at the end of backward)")


class ForwardOverlap:
    """One DDP's forward overlap (module doc). The DDP gives it its module,
    client, reducer (whose gradient views it reads), its parameters in
    registration order, the functional optimizer, the parameters to step
    (None: all) and its ``fail``. ``pending`` is True between a backward
    that handed everything over and the end of the iteration."""

    def __init__(self, module: torch.nn.Module, client, reducer, params: List[torch.Tensor],
                 functional, optim_params: Optional[List[torch.Tensor]],
                 fail: Callable[[BaseException], None]):
        self._client = client
        self._reducer = reducer
        self._params = params
        self._functional = functional
        self._to_step = None if optim_params is None else {id(p) for p in optim_params}
        self._fail = fail
        self.pending = False
        self._finishing = False
        self._done: List[bool] = []
        self._bucket_params: List[List[int]] = []
        self._bucket_of: List[int] = []
        self._t_compute_end = 0
        self._deferred: List[Callable[[], None]] = []
        # Buckets finished by a submodule's pre-hook / by finish(), and
        # overlapped iterations (for tests and benchmarks).
        self.stats = {"prehook_buckets": 0, "finish_buckets": 0, "iterations": 0}
        index = {id(p): i for i, p in enumerate(params)}
        # Every submodule that owns parameters: its own, as indices.
        self._owned: Dict[int, List[int]] = {}
        self._handles = []
        for m in module.modules():
            own = [index[id(p)] for p in m.parameters(recurse=False) if id(p) in index]
            if own:
                self._owned[id(m)] = own
                self._handles.append(m.register_forward_pre_hook(self._pre_hook))

    # ------------------------------------------------------------ backward
    def begin(self, t_compute_end: int) -> None:
        """The reducer's end of backward: everything is handed over; the
        waits move to the next forward."""
        client = self._client
        nb = client.num_buckets
        self._bucket_params = [list(client.bucket(b)["params"]) for b in range(nb)]
        self._bucket_of = [0] * len(self._params)
        for b, idx in enumerate(self._bucket_params):
            for i in idx:
                self._bucket_of[i] = b
        self._done = [False] * nb
        self._t_compute_end = t_compute_end
        self.pending = True

    # ------------------------------------------------------------- forward
    def before_forward(self, *, join: bool, rebuild) -> None:
        """A DDP forward starts: finish first in join mode, or when the
        forward may rebuild the buckets (the rebuild after the first
        iteration, an autotune plan switch): a rebuild needs the iteration
        ended."""
        if not self.pending:
            return
        client = self._client
        if join or (rebuild.enabled and (not client.has_rebuilt_buckets
                                         or getattr(client, "next_plan_switch", 0))):
            self.finish()

    def _pre_hook(self, module, inputs) -> None:
        if not self.pending or self._finishing:
            return
        own = self._owned.get(id(module))
        if own is None:
            return
        for b in sorted({self._bucket_of[i] for i in own}):
            if not self._done[b]:
                self._finish_bucket(b)
                self.stats["prehook_buckets"] += 1

    def _finish_bucket(self, b: int) -> None:
        """Waits for bucket b, then steps its parameters (torch's
        _hook_then_optimizer order: the bucket's parameters in order)."""
        try:
            self._client.wait_bucket(b)
        except RuntimeError as e:  # GraddError: the job cannot go on
            self.pending = False
            self._fail(e)
        self._done[b] = True
        views = self._reducer.views
        step = self._functional.step_param
        to_step = self._to_step
        for i in self._bucket_params[b]:
            p = self._params[i]
            if to_step is None or id(p) in to_step:
                step(p, views[i])

    def finish(self) -> None:
        """Waits for and steps every bucket left, ends the iteration, runs
        what was deferred to its end. A no-op when nothing is pending."""
        if not self.pending or self._finishing:
            return
        self._finishing = True
        try:
            for b, done in enumerate(self._done):
                if not done:
                    self._finish_bucket(b)
                    self.stats["finish_buckets"] += 1
            self.stats["iterations"] += 1
            try:
                self._client.wait_all()  # every bucket is done: ends the iteration
            except RuntimeError as e:
                self.pending = False
                self._fail(e)
            self.pending = False
            self._reducer.complete_overlapped(self._t_compute_end, time.monotonic_ns())
            deferred, self._deferred = self._deferred, []
            for fn in deferred:
                fn()
        finally:
            self._finishing = False

    def defer(self, fn: Callable[[], None]) -> bool:
        """Runs `fn` once the pending iteration is finished (now if none
        is); returns whether it was deferred."""
        if not self.pending:
            fn()
            return False
        self._deferred.append(fn)
        return True

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def functional_optimizer(optim, args, kwargs):
    """torch's functional counterpart of `optim` (as torch's
    _OverlappedStandardOptimizer builds it): ``step_param(param, grad)``."""
    from torch.distributed.optim import as_functional_optim

    return as_functional_optim(optim, *args, **kwargs)


class ForwardOverlapAPI:
    """The DDP's methods around forward overlap (a base of
    gradd.torch.DistributedDataParallel, before torch.nn.Module so that its
    overrides win): ``_register_fused_optim``, ``wait_gradients``, and the
    methods that finish a pending iteration first (module doc). The DDP's
    ``_overlap`` is None without overlap."""

    def _finish_overlap(self, quietly: bool = False) -> None:
        """Finishes a pending iteration; `quietly`: a failure (already
        recorded by the DDP's fail) is not raised (shutdown)."""
        overlap = self.__dict__.get("_overlap")
        if overlap is not None and overlap.pending:
            try:
                overlap.finish()
            except Exception:
                if not quietly:
                    raise

    def wait_gradients(self) -> None:
        """Forward overlap: finishes the iteration the next forward would
        otherwise finish (every bucket waited for, its parameters stepped).
        A no-op without overlap or when nothing is pending."""
        self._finish_overlap()

    def _register_fused_optim(self, optim, *args, optim_params=None, overlap_forward=False,
                              **kwargs):
        """torch's optimizer overlap: the optimizer steps each bucket's
        parameters as soon as its allreduce is done (a hook that runs in the
        trainer; built by gradd because torch 1.13's own path imports FSDP,
        which fails on Python 3.11).

        gradd's ``overlap_forward=True``: the buckets are reduced by the
        daemon and the step moves into the next forward, bucket by bucket
        as its submodules need them (gradd/_overlap.py), so that forward
        starts while the last buckets are still on the wire."""
        if not overlap_forward:
            from gradd import _comm_hooks

            hook = _comm_hooks.fused_optim_hook(
                optim, *args, optim_params=optim_params, **kwargs)
            self.register_comm_hook(None, hook)
            return
        self._raise_if_failed()
        if self._client is None:
            raise RuntimeError("gradd: the model is detached from the daemon")
        if self._hooks.registered is not None or self.__dict__.get("_overlap") is not None:
            raise RuntimeError(
                "register_comm_hook or register_builtin_comm_hook can only be called once.")
        reducer = self._reducer
        if reducer.iterations_done > 0 or reducer.backward_in_progress:
            raise RuntimeError(f"gradd ({reducer.who}): _register_fused_optim must be called "
                               "before the first backward")
        check_supported(find_unused_parameters=self.find_unused_parameters,
                        static_graph=self.static_graph, sparse=len(self._sparse_params),
                        device=self._device, restart_enabled=self._restart.enabled)
        overlap = ForwardOverlap(self.module, self._client, reducer, self._params,
                                 functional_optimizer(optim, args, kwargs), optim_params,
                                 self._fail)
        self._overlap = reducer.overlap = overlap
        self._hooks.registered = "fused_optim(overlap_forward)"

    @contextlib.contextmanager
    def no_sync(self):
        """Inside, forward+backward accumulate gradients locally without
        talking to the daemon; the first synced backward after it averages
        the accumulated gradients. (Forward overlap: finishes a pending
        iteration first.)"""
        self._finish_overlap()
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def zero_grad(self, *args, **kwargs):
        """torch.nn.Module's. Forward overlap: while an iteration is
        pending, the zeroing waits until it is finished (its steps read the
        gradients), which gives the values zeroing right after the step
        would."""
        overlap = self.__dict__.get("_overlap")
        if overlap is not None and overlap.pending:
            module = self.module
            overlap.defer(lambda: module.zero_grad(*args, **kwargs))
            return
        super().zero_grad(*args, **kwargs)

    def named_parameters(self, *args, **kwargs):
        self._finish_overlap()
        return super().named_parameters(*args, **kwargs)

    def state_dict(self, *args, **kwargs):
        self._finish_overlap()
        return super().state_dict(*args, **kwargs)
