"""Rank 0's module state to every rank, through the gradd daemon.

What torch's DDP broadcasts (torch 1.13 ``_sync_module_states`` and
``_sync_buffers``):

* at construction: every parameter (trainable or not) and every buffer of
  ``module.named_buffers()`` -- persistent and non-persistent alike -- except
  the names in ``module._ddp_params_and_buffers_to_ignore`` (torch 2.x:
  the buffers only with ``broadcast_buffers=True``,
  ``_torch_compat.init_syncs_buffers``);
* before each forward, with ``broadcast_buffers=True`` and
  ``require_forward_param_sync`` (the previous forward ran with gradient
  sync): the same buffers, looked up again (a module may reassign them).
"""
from __future__ import annotations

from typing import Iterable, List, Sequence, Tuple

import torch


def ignored_names(module: torch.nn.Module) -> set:
    return set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()) or ())


def module_buffers(module: torch.nn.Module) -> List[torch.Tensor]:
    """named_buffers() minus the ignored ones, deduplicated."""
    ignore = ignored_names(module)
    seen, out = set(), []
    for name, b in module.named_buffers():
        if name in ignore or id(b) in seen:
            continue
        seen.add(id(b))
        out.append(b.detach())
    return out


def module_states(module: torch.nn.Module, buffers: bool = True) -> List[torch.Tensor]:
    """Parameters then (with ``buffers``) buffers, as torch's
    _sync_module_states sends them (torch 2.x leaves the buffers out with
    ``broadcast_buffers=False``)."""
    ignore = ignored_names(module)
    seen, out = set(), []
    for name, p in module.named_parameters():
        if name in ignore or id(p) in seen:
            continue
        seen.add(id(p))
        out.append(p.detach())
    if not buffers:
        return out
    for b in module_buffers(module):
        if id(b) not in seen:
            seen.add(id(b))
            out.append(b)
    return out


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 tensor over t's memory (t must be contiguous)."""
    flat = t.reshape(-1)
    return flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)


def broadcast_tensors(
    client, tensors: Iterable[torch.Tensor], chunk: int, on_error, root: int = 0
) -> None:
    """Overwrites `tensors` with global rank `root`'s, packed into rounds of at most
    `chunk` bytes (the attach's broadcast area). `on_error(exc)` is called
    (and must raise) when the daemon reports a failure."""
    staging = torch.empty(chunk, dtype=torch.uint8)
    staging_np = staging.numpy()
    pending: List[Tuple[torch.Tensor, int, int, int]] = []  # (bytes, src_off, len, dst_off)
    writeback: List[Tuple[torch.Tensor, torch.Tensor]] = []
    used = 0

    def flush():
        nonlocal used
        if used == 0:
            return
        try:
            client.broadcast(staging_np[:used], root)
        except RuntimeError as e:
            on_error(e)
        for dst, off, n, at in pending:
            dst[off : off + n].copy_(staging[at : at + n])
        pending.clear()
        used = 0

    with torch.no_grad():
        for t in tensors:
            if t.numel() == 0:
                continue
            t = t.detach()
            if t.is_contiguous():
                src = t
            else:
                src = t.contiguous()
                writeback.append((t, src))
            data = _bytes_of(src)
            total = data.numel()
            off = 0
            while off < total:
                n = min(total - off, chunk - used)
                staging[used : used + n].copy_(data[off : off + n])
                pending.append((data, off, n, used))
                used += n
                off += n
                if used == chunk:
                    flush()
        flush()
        for t, src in writeback:
            t.copy_(src)


def state_bytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
