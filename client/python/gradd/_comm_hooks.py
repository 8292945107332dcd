"""Communication hooks for gradd.torch.DistributedDataParallel.

gradd runs the hook in the daemon, between the local reduce and the network
(server/hooks/), so ``register_comm_hook`` does not install a Python
callable: it recognises torch's own hooks and tells the daemon which one the
job uses (``Node.SetCommHook``). Every rank must register the same hook
before its first backward. Recognised:

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
"""
from __future__ import annotations

from typing import Any, Callable, Dict

__all__ = ["register_comm_hook", "register_builtin_comm_hook", "supported_hooks"]

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


def register_comm_hook(ddp: Any, state: Any, hook: Callable) -> None:
    """``DistributedDataParallel.register_comm_hook`` for gradd (see module doc)."""
    _check_callable(hook)
    if getattr(ddp, "_gradd_comm_hook", None) is not None:
        raise RuntimeError(_ONCE)
    name = _torch_hooks().get(hook)
    if name is None:
        raise NotImplementedError(
            f"gradd runs communication hooks in the daemon and does not know "
            f"{_hook_name(hook)}; supported: {supported_hooks()}"
        )
    settings: Dict[str, Any] = {}
    if name in ("powerSGD", "batched_powerSGD"):
        settings = _powersgd_settings(state, name)
        settings["random_seed"] = _seed_of(state)
    _set(ddp, name, settings)


def register_builtin_comm_hook(ddp: Any, comm_hook_type: Any) -> None:
    """``DistributedDataParallel._register_builtin_comm_hook`` for gradd."""
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
    if getattr(ddp, "_gradd_comm_hook", None) is not None:
        raise RuntimeError("register_builtin_comm_hook or register_comm_hook can only be called once.")
    _set(ddp, name, {})


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


def _set(ddp: Any, name: str, settings: Dict[str, Any]) -> None:
    client = ddp._client
    if client is None:
        raise RuntimeError("gradd: the model is detached from the daemon")
    client.set_comm_hook(name, **settings)
    ddp._gradd_comm_hook = name
