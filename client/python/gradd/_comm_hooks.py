"""Communication hooks for gradd.torch.DistributedDataParallel.

Any hook torch's DDP accepts works; it takes one of two paths.

**Daemon path.** torch's own allreduce, fp16/bf16 compression and PowerSGD
hooks are recognised and run by the daemon, between the local reduce and
the network (server/hooks/): ``register_comm_hook`` does not install the
Python callable but tells the daemon which hook the job uses
(``Node.SetCommHook``). Every rank must register the same hook before its
first backward. Recognised:

==============================================  ==========================
torch                                           daemon hook
==============================================  ==========================
``default_hooks.allreduce_hook``                ``allreduce``
``default_hooks.fp16_compress_hook``            ``fp16_compress``
``default_hooks.bf16_compress_hook``            ``bf16_compress`` (also on
                                                CPU: the daemon has no CUDA
                                                restriction)
``powerSGD_hook.powerSGD_hook`` + state         ``powerSGD``
``powerSGD_hook.batched_powerSGD_hook`` + state ``batched_powerSGD``
``dist.BuiltinCommHookType.ALLREDUCE`` /
``FP16_COMPRESS`` (``_register_builtin_comm_hook``)
``DDPCommHookType.*`` of the hooks above        (they call register_comm_hook)
==============================================  ==========================

For the default hooks the state (a process group or None) is ignored: the
daemon's job is the group. For PowerSGD the ``PowerSGDState``'s settings are
handed to the daemon, which keeps the hook's state (error feedback, P/Q
memory, iteration count) per job.

**Trainer path.** Every other callable (a user-written hook, ``noop_hook``,
the quantization hooks, ``post_localSGD_hook``, ``_hook_then_optimizer``
wrappers, so ``_register_fused_optim`` too, torch's hooks wrapped in
anything) runs in the trainer with torch 1.13's semantics
(gradd/_trainer_hooks.py): it gets a GradBucket over torch's bucket layout
(gradd's shared bucket memory where the two plans agree) and communicates
over the group its state means: when that is the DDP's own ranks (state
None for a DDP over the default group, the DDP's process group, or a state
object whose ``process_group`` is one of these) the job's own gradd
collectives (gradd/_hook_group.py: the torch.distributed backend "gradd"
over the DDP's ranks), otherwise the group the state names. The daemon's
bucket machinery then does not take part in backward: buckets are not
handed to it, the used map of find_unused_parameters is reduced over the
DDP's ranks as torch does, the daemon's bucket rebuild is off (the hook's
buckets follow torch's own rebuild), and join() runs torch's protocol in
the trainers (gradd/_trainer_join.py).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

__all__ = ["CommHooks", "fused_optim_hook", "supported_hooks"]

_ONCE = "register_comm_hook or register_builtin_comm_hook can only be called once."


def _torch_hooks() -> Dict[Callable, str]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    hooks = {
        default_hooks.allreduce_hook: "allreduce",
        default_hooks.fp16_compress_hook: "fp16_compress",
        powerSGD_hook.powerSGD_hook: "powerSGD",
        powerSGD_hook.batched_powerSGD_hook: "batched_powerSGD",
    }
    bf16 = getattr(default_hooks, "bf16_compress_hook", None)
    if bf16 is not None:
        hooks[bf16] = "bf16_compress"
    return hooks


def supported_hooks() -> str:
    """The hooks gradd runs, for error messages."""
    return (
        "torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook, "
        "fp16_compress_hook, bf16_compress_hook, powerSGD_hook.powerSGD_hook and "
        "batched_powerSGD_hook (with a PowerSGDState), or "
        "torch.distributed.BuiltinCommHookType.ALLREDUCE / FP16_COMPRESS"
    )


def _hook_name(hook: Any) -> str:
    return getattr(hook, "__qualname__", None) or repr(hook)


def _powersgd_settings(state: Any, name: str) -> Dict[str, Any]:
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    if not isinstance(state, PowerSGDState):
        raise TypeError(
            f"gradd: {name} needs a torch PowerSGDState as its state, got {type(state).__name__}"
        )
    if getattr(state, "iter", 0) != 0:
        raise ValueError(
            "gradd: the PowerSGDState has already run "
            f"{state.iter} iterations; the daemon starts PowerSGD state from scratch"
        )
    return dict(
        matrix_approximation_rank=int(state.matrix_approximation_rank),
        start_powersgd_iter=int(state.start_powerSGD_iter),
        min_compression_rate=float(state.min_compression_rate),
        use_error_feedback=bool(state.use_error_feedback),
        warm_start=bool(state.warm_start),
        orthogonalization_epsilon=float(state.orthogonalization_epsilon),
        batch_tensors_with_same_shape=bool(getattr(state, "batch_tensors_with_same_shape", False)),
    )


def _check_callable(hook: Any) -> None:
    # torch's DistributedDataParallel._check_comm_hook, first rule.
    if not callable(hook):
        raise TypeError("Communication hook must be callable.")


def _check_annotations(hook: Callable) -> None:
    """torch's DistributedDataParallel._check_comm_hook, the signature rules
    (same messages)."""
    import inspect

    import torch
    import torch.distributed as dist

    try:
        sig = inspect.signature(hook)
    except (TypeError, ValueError):  # a builtin without a signature
        return
    # String annotations (``from __future__ import annotations``) are not
    # checked (torch's check would reject them all).
    bucket = sig.parameters.get("bucket")
    if bucket is not None and not isinstance(bucket.annotation, str) and \
            bucket.annotation not in (inspect.Parameter.empty, dist.GradBucket):
        raise ValueError("Communication hook: bucket annotation should be dist.GradBucket.")
    if not isinstance(sig.return_annotation, str) and sig.return_annotation not in (
            inspect.Signature.empty, torch.futures.Future[torch.Tensor]):
        raise ValueError(
            "Communication hook: return annotation should be "
            "torch.futures.Future[torch.Tensor]."
        )


class CommHooks:
    """One attach's communication hook: which one the job uses
    (``registered``: the daemon hook's name, ``"trainer:<hook>"`` for one
    that runs in the trainer, None before registration) and its
    installation.

    What the DDP gives it: its `client` (None once detached) and `reducer`,
    `trainer_comm(state, hook)` building the TrainerComm of the trainer path
    (gradd/_trainer_hooks.py) and `on_trainer_path()`, called once such a
    hook is installed (the DDP turns its bucket rebuild off: the daemon
    re-plans from the ready order it sees, and in this mode it sees none).
    Runs on the trainer's main thread."""

    def __init__(self, client, reducer, *,
                 trainer_comm: Optional[Callable[[Any, Callable], Any]] = None,
                 on_trainer_path: Optional[Callable[[], None]] = None):
        self._client = client
        self._reducer = reducer
        self._trainer_comm = trainer_comm
        self._on_trainer_path = on_trainer_path
        self.registered: Optional[str] = None

    def detach(self) -> None:
        """The DDP shut down: registering now says so."""
        self._client = None

    def register(self, state: Any, hook: Callable) -> None:
        """``DistributedDataParallel.register_comm_hook`` (see module doc)."""
        _check_callable(hook)
        if self.registered is not None:
            raise RuntimeError(_ONCE)
        name = _torch_hooks().get(hook)
        if name is None:
            self._register_in_trainer(state, hook)
            return
        settings: Dict[str, Any] = {}
        if name in ("powerSGD", "batched_powerSGD"):
            settings = _powersgd_settings(state, name)
            settings["random_seed"] = _seed_of(state)
        self._set(name, settings)

    def register_builtin(self, comm_hook_type: Any) -> None:
        """``DistributedDataParallel._register_builtin_comm_hook``."""
        import torch.distributed as dist

        builtin = getattr(dist, "BuiltinCommHookType", None)
        names = {}
        if builtin is not None:
            for member, name in (("ALLREDUCE", "allreduce"), ("FP16_COMPRESS", "fp16_compress"),
                                 ("BF16_COMPRESS", "bf16_compress")):
                if hasattr(builtin, member):
                    names[getattr(builtin, member)] = name
        name = names.get(comm_hook_type)
        if name is None:
            raise NotImplementedError(
                f"gradd does not know the built-in communication hook {comm_hook_type!r}; "
                f"supported: {supported_hooks()}"
            )
        if self.registered is not None:
            raise RuntimeError(
                "register_builtin_comm_hook or register_comm_hook can only be called once.")
        self._set(name, {})

    def _register_in_trainer(self, state: Any, hook: Callable) -> None:
        """The trainer path (module doc): the Reducer hands ready gradients
        to a TrainerComm that runs `hook` per bucket instead of to the
        daemon."""
        _check_annotations(hook)
        if self._client is None:
            raise RuntimeError("gradd: the model is detached from the daemon")
        reducer = self._reducer
        if reducer.iterations_done > 0 or reducer.backward_in_progress:
            raise RuntimeError(
                f"gradd ({reducer.who}): register_comm_hook must be "
                "called before the first backward"
            )
        if len(reducer.sparse or ()):
            raise NotImplementedError(
                f"gradd: the communication hook {_hook_name(hook)} would run in the trainer, "
                "which gradd does not support for models with sparse gradients"
            )
        reducer.comm = self._trainer_comm(state, hook)
        self._on_trainer_path()
        self.registered = "trainer:" + _hook_name(hook)

    def _set(self, name: str, settings: Dict[str, Any]) -> None:
        client = self._client
        if client is None:
            raise RuntimeError("gradd: the model is detached from the daemon")
        client.set_comm_hook(name, **settings)
        self.registered = name


def _seed_of(state: Any) -> int:
    """torch draws its Q matrices from state.rng = RandomState(random_seed);
    the daemon reproduces those draws from the seed (server/hooks/
    torch_random.h). The state keeps no seed, so read it back from the
    generator: RandomState(seed) puts seed in key[0], and the generator must
    be untouched for the draws to line up."""
    import numpy as np

    got = state.rng.get_state()
    seed = int(got[1][0])
    want = np.random.RandomState(seed).get_state()
    if got[0] != want[0] or got[2] != want[2] or not np.array_equal(got[1], want[1]):
        raise ValueError(
            "gradd: PowerSGDState.rng has been drawn from or re-seeded; the daemon "
            "reproduces torch's draws only from a fresh PowerSGDState(random_seed=...)"
        )
    return seed


def fused_optim_hook(optim, *args, optim_params=None, **kwargs) -> Callable:
    """What torch's ``_OverlappedStandardOptimizer.register_ddp`` registers
    for ``DistributedDataParallel._register_fused_optim``: torch's
    ``_hook_then_optimizer`` over ``allreduce_hook``, with the functional
    counterpart of `optim` (a hook that runs in the trainer)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks.optimizer_overlap_hooks import (
        _hook_then_optimizer,
        _OptimizerHookState,
    )
    from torch.distributed.optim import as_functional_optim

    functional = as_functional_optim(optim, *args, **kwargs)
    state = _OptimizerHookState(functional, optim_params)
    return _hook_then_optimizer(default_hooks.allreduce_hook, state)
