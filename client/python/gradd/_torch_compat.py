"""What differs between the torch versions gradd.torch runs under: the one
place that knows (gradd/torch.py and its _*.py modules ask here, never
``torch.__version__`` themselves).

Supported torch: 1.13 and 2.0 through 2.6. Tested: Debian 12's torch 1.13
(Python 3.11) and Debian 13's torch 2.6 (Python 3.13); 2.0 to 2.5 are
accepted because every 2.x difference gradd depends on is checked by
feature, not by version.

Decision for other versions, made at import (``import gradd.torch`` runs
:func:`check_version` before anything else touches torch or loads a C++
extension built against it):

* older than 1.13, or 3.0 and newer: ``ImportError`` naming the version
  found and the supported range. torch 1.12's DDP internals and a future
  major's API are not what gradd mirrors, and a C++ extension built against
  another torch must not be loaded into it.
* a 2.x newer than 2.6: a ``GraddTorchVersionWarning`` (a UserWarning),
  not an error. torch keeps DDP's public API across 2.x minors and gradd
  checks the features it uses; a new constructor argument it does not know
  is refused by Python itself with the argument's name.

torch-version differences handled here: the device mesh (2.2+), the
optimizer-in-backward registry (2.x), and torch.compile (2.0+): gradd's
package is skipped by dynamo as torch's DDP module is, and torch's DDP
class is told which DDP is running its module so that dynamo's DDPOptimizer
splits graphs at gradd's bucket size (see :func:`prepare_compile`);
compiled autograd (2.x) is refused with one clear error
(:func:`refuse_compiled_autograd`).
"""
from __future__ import annotations

import contextlib
import re
import warnings
from typing import Optional, Tuple

import torch

__all__ = [
    "GraddTorchVersionWarning",
    "SUPPORTED",
    "TESTED_NEWEST",
    "TORCH_VERSION",
    "check_version",
    "compiled_autograd_reason",
    "device_mesh_group",
    "has_compile",
    "in_compiled_autograd",
    "inside_ddp_forward",
    "prepare_compile",
    "refuse_compiled_autograd",
]

#: The supported range, as error messages and the docs say it.
SUPPORTED = "torch 1.13 or 2.0 through 2.6"
#: The newest torch gradd was tested with; newer 2.x warns.
TESTED_NEWEST = (2, 6)


class GraddTorchVersionWarning(UserWarning):
    """gradd.torch runs under a torch 2.x newer than it was tested with."""


def parse_version(version: str) -> Tuple[int, int]:
    """(major, minor) of a torch version string ("2.6.0+debian",
    "1.13.0a0", "2.7.0.dev20250101")."""
    m = re.match(r"\s*(\d+)\.(\d+)", str(version))
    if not m:
        raise ImportError(
            f"gradd.torch: cannot read the version of the torch found ({version!r}); "
            f"gradd supports {SUPPORTED}"
        )
    return int(m.group(1)), int(m.group(2))


def check_version(version: str) -> Tuple[int, int]:
    """Raises ImportError for a torch gradd does not support, warns for a 2.x
    newer than tested (see the module doc); returns (major, minor)."""
    major, minor = parse_version(version)
    if (major, minor) < (1, 13) or major >= 3:
        raise ImportError(
            f"gradd.torch does not support torch {version} (found at "
            f"{getattr(torch, '__file__', '?')}); gradd supports {SUPPORTED}"
        )
    if major == 2 and (major, minor) > TESTED_NEWEST:
        warnings.warn(
            f"gradd.torch was tested with torch up to "
            f"{TESTED_NEWEST[0]}.{TESTED_NEWEST[1]}; torch {version} is newer and untested "
            f"(gradd supports {SUPPORTED})",
            GraddTorchVersionWarning,
            stacklevel=3,
        )
    return major, minor


TORCH_VERSION = check_version(getattr(torch, "__version__", "unknown"))


# ------------------------------------------------------------- device mesh
def device_mesh_group(device_mesh, process_group):
    """torch 2.x DDP's ``device_mesh=``: the process group of a 1-D mesh
    (same rules and messages as torch's constructor)."""
    if device_mesh is None:
        return process_group
    if process_group is not None:
        raise RuntimeError("Cannot specify both process_group and device_mesh arguments.")
    if getattr(device_mesh, "ndim", None) != 1:
        raise RuntimeError(f"Only 1D device mesh is supported, but got {device_mesh}.")
    return device_mesh.get_group(mesh_dim=0)


# ------------------------------------------------------------ torch.compile
def has_compile() -> bool:
    return hasattr(torch, "compile") and hasattr(torch, "_dynamo")


_compile_prepared = False


def prepare_compile() -> None:
    """Makes ``torch.compile(gradd_ddp)`` treat gradd's DDP as torch's DDP:
    dynamo does not trace gradd's package (as torch's DDP module is not
    traced: DDP's bookkeeping, the C++ client and the autograd hooks run
    eagerly, a graph break around them) and compiles the wrapped module's
    forward. The gradients then come from the compiled backward into the
    parameters' gradient accumulators, whose hooks gradd installed, so the
    values are those of the eager module. Once per process (the first DDP
    constructed); torch 2.x's own DDP constructor imports dynamo too."""
    global _compile_prepared
    if _compile_prepared or not has_compile():
        return
    _compile_prepared = True
    try:
        from torch._dynamo import trace_rules
    except Exception:  # a torch without dynamo's trace rules: nothing to skip
        return
    add = getattr(trace_rules, "add", None)
    if add is not None:
        add("gradd")


def _optimize_ddp_mode() -> Optional[str]:
    try:
        import torch._dynamo.config as dynamo_config
    except Exception:
        return None
    get = getattr(dynamo_config, "_get_optimize_ddp_mode", None)
    if get is not None:
        return get()
    return "ddp_optimizer" if getattr(dynamo_config, "optimize_ddp", False) else None


@contextlib.contextmanager
def inside_ddp_forward(ddp):
    """While gradd's DDP runs its module: torch's DDP class names it as the
    active DDP module, as torch's DDP does for itself, so that dynamo's
    DDPOptimizer (torch._dynamo.backends.distributed) splits the compiled
    graph at ``ddp.bucket_bytes_cap`` and the buckets' gradients become
    ready during backward. Only while dynamo is imported (a user who never
    compiles pays nothing)."""
    import sys

    if "torch._dynamo" not in sys.modules or _optimize_ddp_mode() != "ddp_optimizer":
        yield
        return
    cls = torch.nn.parallel.DistributedDataParallel
    # DDPOptimizer asserts that the first bucket (1 MiB) is not larger than
    # the others: a smaller bucket_cap_mb would crash the compile (torch's
    # DDP too); gradd then compiles one graph (same values, less overlap).
    first = getattr(torch.distributed, "_DEFAULT_FIRST_BUCKET_BYTES", 1 << 20)
    if not hasattr(cls, "_active_ddp_module") or ddp.bucket_bytes_cap < first:
        yield
        return
    old = cls._active_ddp_module
    cls._active_ddp_module = ddp
    try:
        yield
    finally:
        cls._active_ddp_module = old


# ------------------------------------------------------- compiled autograd
_PYTHON_REDUCER_MODES = ("python_reducer", "python_reducer_without_compiled_forward")


def compiled_autograd_reason() -> Optional[str]:
    """Why compiled autograd is (or is meant to be) in use, or None. torch
    2.x's DDP runs under compiled autograd with its Python reducer
    (``optimize_ddp="python_reducer"``) and functional collectives traced
    into the backward graph; gradd's reduction is its autograd hooks, the
    daemon client and an engine callback, which compiled autograd does not
    run as eager autograd does. Only looked at while dynamo is imported."""
    import sys

    if "torch._dynamo" not in sys.modules:
        return None
    mode = _optimize_ddp_mode()
    if mode in _PYTHON_REDUCER_MODES:
        return f"torch._dynamo.config.optimize_ddp is {mode!r}"
    config = sys.modules.get("torch._dynamo.config")
    if getattr(config, "compiled_autograd", False) is True:
        return "torch._dynamo.config.compiled_autograd is True"
    ca = sys.modules.get("torch._dynamo.compiled_autograd")
    if ca is not None and (getattr(ca, "compiled_autograd_enabled", False)
                           or getattr(ca, "in_compiled_autograd_region", False)):
        return "compiled autograd is enabled (torch._dynamo.compiled_autograd._enable)"
    return None


def in_compiled_autograd() -> bool:
    """Whether the running backward is compiled autograd's (its graph runs
    gradd's autograd hooks with this flag set). Cheap: called per hook."""
    import sys

    ca = sys.modules.get("torch._dynamo.compiled_autograd")
    return ca is not None and bool(getattr(ca, "in_compiled_autograd_region", False))


def refuse_compiled_autograd(what: str) -> None:
    """NotImplementedError naming the setting when compiled autograd is in
    use (see :func:`compiled_autograd_reason`); ``what`` is the caller, for
    the message."""
    reason = compiled_autograd_reason()
    if reason is None:
        return
    raise NotImplementedError(
        f"{what}: gradd.torch.DistributedDataParallel does not support compiled "
        f"autograd ({reason}). torch's DDP runs it with its Python reducer and "
        "functional collectives, which gradd does not implement. Leave compiled "
        "autograd off and torch._dynamo.config.optimize_ddp at True "
        "(\"ddp_optimizer\", the default) or False; torch.compile of the DDP "
        "model is supported (docs/torch2.md)."
    )


# ------------------------------------------------- optimizer in backward
def take_in_backward_optimizers(params) -> list:
    """torch 2.x's ``torch.distributed.optim._apply_optimizer_in_backward``
    gives parameters ``_in_backward_optimizers`` and a hook that steps them
    on the local gradient. Under DDP the step must follow the average: as
    torch's DDP does (``_setup_in_backward_optimizers``), the hooks are
    removed and the DDP steps them (:func:`step_in_backward_optimizers`).
    Returns the parameters that have such optimizers."""
    params = [p for p in params if hasattr(p, "_in_backward_optimizers")]
    if not params:
        return []
    try:
        from torch.distributed.optim import apply_optimizer_in_backward as aoib
    except ImportError:  # torch without the registry (1.13): nothing registered
        return params
    handles = getattr(aoib, "param_to_optim_hook_handle_map", None)
    if handles is not None:
        for p in params:
            for handle in handles.get(p, []):
                handle.remove()
    torch._C._log_api_usage_once("ddp.optimizer_in_backward")
    return params


def step_in_backward_optimizers(params) -> None:
    """After a synced backward: each parameter's optimizers step on its
    averaged gradient, then the gradient is set to None, as torch's
    ``_apply_optim_in_backward_hook`` does for DDP-managed parameters."""
    for p in params:
        if p.grad is not None:
            for optim in p._in_backward_optimizers:
                optim.step()
    for p in params:
        p.grad = None


# ---------------------------------------------------------------- TCPStore
def tcp_store(host: str, port: int, **kwargs):
    """A ``torch.distributed.TCPStore`` client as torch's own rendezvous
    makes it: torch 2.4+ uses libuv unless ``USE_LIBUV=0`` (which torch's
    env:// and tcp:// rendezvous honour but a direct TCPStore does not), and
    Debian's torch 2.6 is built without libuv, where use_libuv=True is an
    error. So: USE_LIBUV as torch reads it, and without libuv when this
    torch has none. torch 1.13's TCPStore has no use_libuv."""
    import inspect
    import os

    import torch.distributed as dist

    want = os.environ.get("USE_LIBUV", "1") == "1"
    try:
        takes = "use_libuv" in (dist.TCPStore.__init__.__doc__ or "") or (
            "use_libuv" in inspect.signature(dist.TCPStore.__init__).parameters)
    except (TypeError, ValueError):
        takes = False
    if not takes:
        return dist.TCPStore(host, port, **kwargs)
    try:
        return dist.TCPStore(host, port, use_libuv=want, **kwargs)
    except RuntimeError as e:
        if want and "libuv" in str(e):
            return dist.TCPStore(host, port, use_libuv=False, **kwargs)
        raise


# ------------------------------------------------ construction-time sync
def init_syncs_buffers(broadcast_buffers: bool) -> bool:
    """Whether DDP's construction broadcasts rank 0's buffers: torch 2.x's
    ``_sync_module_states`` does so only with ``broadcast_buffers=True``;
    torch 1.13's always does."""
    if broadcast_buffers:
        return True
    import inspect

    try:
        from torch.distributed.utils import _sync_module_states
    except ImportError:
        return True
    return "broadcast_buffers" not in inspect.signature(_sync_module_states).parameters


def refuse_unsupported(**args) -> None:
    """torch 2.x constructor arguments gradd does not support: only their
    defaults are accepted; anything else is refused naming the argument."""
    for name, value in args.items():
        if value is not None:
            raise NotImplementedError(
                f"gradd.torch.DistributedDataParallel does not support torch's "
                f"{name}= argument (got {type(value).__name__}); leave it None or use "
                "torch.nn.parallel.DistributedDataParallel"
            )


def torch2_ddp_attributes(module, ignore, device) -> dict:
    """The attributes torch 2.x's DDP has that user code and torch itself
    (dynamo's DDPOptimizer, FSDP's checks, the Join context) read, with the
    values gradd's DDP stands for: one device, no mixed precision, no
    delayed all-reduce, no Python reducer. Plain values, for the DDP's
    ``__dict__``."""
    return dict(
        device=device,
        device_type=device.type,
        is_multi_device_module=False,
        mixed_precision=None,
        _delay_all_reduce_params=[],
        _delay_all_reduce_all_params=False,
        _module_parameters=[p for n, p in module.named_parameters() if n not in ignore],
        _comm_hooks=[],
        _use_python_reducer=False,
        _accum_grad_hooks=[],
        _lazy_init_ran=False,
        _ddp_sink_clone=True,
        _in_backward_params=[],
    )


class DDPClassAPI:
    """The stateless part of torch's DDP interface that torch itself calls
    on a DDP class or object (dynamo's DDPOptimizer, torch's tests, FSDP's
    checks), as gradd's DDP answers it; a base of
    gradd.torch.DistributedDataParallel."""

    @classmethod
    def _get_active_ddp_module(cls):
        """torch's: the DDP (torch's or gradd's) whose module is running,
        for dynamo's DDPOptimizer."""
        return getattr(torch.nn.parallel.DistributedDataParallel, "_active_ddp_module", None)

    @staticmethod
    def _get_data_parallel_params(module, named_params=False):
        """torch's: the parameters a DDP manages (not ``_ddp_ignored``)."""
        for param in module.parameters() if not named_params else module.named_parameters():
            if not hasattr(param, "_ddp_ignored"):
                yield param

    @staticmethod
    def _set_params_and_buffers_to_ignore_for_model(module, params_and_buffers_to_ignore):
        """torch's: names ('<module>.<param>') DDP leaves alone, set on the
        module before wrapping it."""
        module._ddp_params_and_buffers_to_ignore = params_and_buffers_to_ignore

    def _update_process_group(self, new_process_group):
        """torch 2.x's; gradd re-forms a job's network itself (min_nodes)."""
        raise NotImplementedError(
            "gradd.torch.DistributedDataParallel does not support _update_process_group(); "
            "a gradd job re-forms after a node loss by itself (min_nodes=, see "
            "docs/operations.md)"
        )
