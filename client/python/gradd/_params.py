"""Which parameters gradd.torch.DistributedDataParallel reduces, and torch's
questions about them.

Pure functions over a module and the DDP's parameter lists: no client, no
DDP object. The DDP calls :func:`select` once in its constructor; the
others answer torch's ``_build_params_for_reducer`` and
``_build_debug_param_to_name_mapping`` (which torch's tests call).
"""
from __future__ import annotations

from typing import Callable, Dict, List, NoReturn, Sequence, Tuple

import torch

from gradd import _state_sync
from gradd._sparse import sparse_parameter_ids

# The dtypes the daemon reduces, by the name the client library takes.
DTYPES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}

Named = List[Tuple[str, torch.nn.Parameter]]


def select(module: torch.nn.Module) -> Tuple[set, Named, Named]:
    """(the names DDP ignores, the dense parameters it reduces, the sparse
    ones), both in registration order, refusing a module with no parameter
    that requires a gradient or only sparse ones (:func:`check_dense` checks
    the dense ones)."""
    ignore = _state_sync.ignored_names(module)
    named = [
        (n, p) for n, p in module.named_parameters() if p.requires_grad and n not in ignore
    ]
    # Sparse gradients (Embedding(sparse=True)) bypass the dense buckets:
    # see gradd/_sparse.py.
    sparse_ids = sparse_parameter_ids(module)
    sparse_named = [(n, p) for n, p in named if id(p) in sparse_ids]
    named = [(n, p) for n, p in named if id(p) not in sparse_ids]
    if not named and sparse_named:
        raise NotImplementedError(
            "gradd needs at least one dense parameter besides the sparse "
            f"ones ({', '.join(n for n, _ in sparse_named)})"
        )
    if not named:
        raise RuntimeError(
            "DistributedDataParallel is not needed when a module doesn't have any "
            "parameter that requires a gradient."
        )
    return ignore, named, sparse_named


def check_dense(named: Named) -> None:
    """Refuses a dtype the daemon does not reduce and a non-strided layout."""
    for n, p in named:
        if p.dtype not in DTYPES:
            raise TypeError(
                f"parameter '{n}' has dtype {p.dtype}; gradd reduces float32, "
                "float64, float16 and bfloat16"
            )
        if p.layout != torch.strided:
            raise NotImplementedError(f"parameter '{n}' is not a dense tensor")


def params_for_reducer(
    module: torch.nn.Module, dense: Sequence[torch.Tensor], sparse: Sequence[torch.Tensor]
) -> Tuple[list, List[bool]]:
    """torch's ``_build_params_for_reducer``: (the parameters DDP reduces, in
    the module's registration order, and whether each expects a sparse
    gradient)."""
    params = list(dense) + list(sparse)
    is_sparse = [False] * len(dense) + [True] * len(sparse)
    by_id = {id(p): i for i, (_, p) in enumerate(module.named_parameters())}
    order = sorted(range(len(params)), key=lambda i: by_id.get(id(params[i]), i))
    return [params[i] for i in order], [is_sparse[i] for i in order]


def debug_param_to_name_mapping(
    parameters: Sequence[torch.Tensor],
    named: Sequence[Tuple[str, torch.Tensor]],
    log_and_throw: Callable[[type, str], NoReturn],
) -> Dict[int, str]:
    """torch's ``_build_debug_param_to_name_mapping``: {index in
    `parameters`: fully qualified name}, checking (with torch's messages,
    raised through the DDP's `log_and_throw`) that `parameters` are exactly
    the DDP's `named` ones."""
    index = {id(p): i for i, p in enumerate(parameters)}
    out = {}
    for name, p in named:
        if id(p) not in index:
            log_and_throw(
                ValueError,
                f"Param with name {name} found in module parameters, but not DDP "
                "parameters.",
            )
        out[index[id(p)]] = name
    if len(out) != len(parameters):
        log_and_throw(
            ValueError,
            "Expected param to name mapping to cover all parameters, but got "
            f"conflicting lengths: {len(out)} vs {len(parameters)}.",
        )
    return out


def bucket_cap_auto(bucket_cap_mb) -> bool:
    """Whether DDP's ``bucket_cap_mb`` leaves the cap to the daemon's
    autotune ("auto"); None and numbers do not. Anything else is a
    ValueError naming what is accepted."""
    if isinstance(bucket_cap_mb, str):
        if bucket_cap_mb == "auto":
            return True
        raise ValueError(
            f"bucket_cap_mb must be a number of MiB, None or 'auto', got {bucket_cap_mb!r}")
    if bucket_cap_mb is not None and (isinstance(bucket_cap_mb, bool)
                                      or not isinstance(bucket_cap_mb, (int, float))):
        raise ValueError(
            f"bucket_cap_mb must be a number of MiB, None or 'auto', got {bucket_cap_mb!r}")
    return False
