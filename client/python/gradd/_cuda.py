"""CUDA modules in gradd.torch: which GPU a module lives on, zero-copy
gradient views into the device memory the daemon allocated, and the streams
the event handshake uses.

* A module is either all on the CPU or all on one GPU (parameters and
  buffers), as torch's DDP requires with ``device_ids``; ``device_ids`` is
  ``None`` or ``[that GPU]`` and ``output_device`` ``None`` or that GPU.
* Gradient views: the client library maps the rank's device memory once
  (cuMem import of the fd the daemon sent); each parameter's view is a
  torch tensor over its place there, built through
  ``__cuda_array_interface__`` (no copy; works with torch 1.13 and 2.x).
  bfloat16, which the interface cannot name, is viewed as int16 and
  reinterpreted.
* Streams: ``mark_ready`` gets ``torch.cuda.current_stream()`` of the
  autograd thread that produced the gradient (the stream that wrote it);
  the stream records the bucket's ready event. ``wait_all`` makes the
  current stream wait for the daemon's done event: the optimizer's kernels,
  queued after it, read the averaged gradients. The CPU never waits for the
  GPU.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

_TYPESTR = {
    torch.float32: "<f4",
    torch.float64: "<f8",
    torch.float16: "<f2",
    torch.bfloat16: "<i2",  # reinterpreted below
}


def module_device(module: torch.nn.Module) -> torch.device:
    """The one device of every parameter and buffer (cpu when there are
    none). NotImplementedError names two tensors on different devices."""
    first = None
    for n, t in list(module.named_parameters()) + list(module.named_buffers()):
        if first is None:
            first = (n, t.device)
            continue
        if t.device != first[1]:
            raise NotImplementedError(
                f"gradd.torch needs every parameter and buffer on one device; "
                f"'{first[0]}' is on {first[1]} but '{n}' is on {t.device}"
            )
    device = first[1] if first is not None else torch.device("cpu")
    if device.type not in ("cpu", "cuda"):
        raise NotImplementedError(f"gradd.torch supports cpu and cuda tensors, not {device}")
    return device


def _index(d) -> Optional[int]:
    if d is None:
        return None
    if isinstance(d, torch.device):
        return d.index if d.type == "cuda" else -1
    if isinstance(d, str):
        return _index(torch.device(d))
    return int(d)


def check_device_ids(
    device: torch.device, device_ids: Optional[Sequence], output_device
) -> Tuple[Optional[list], Optional[int]]:
    """torch's rules for device_ids / output_device with a single-device
    module; returns what DDP stores in .device_ids / .output_device."""
    if device.type == "cpu":
        if device_ids is not None or output_device is not None:
            raise ValueError(
                "device_ids and output_device must be None for a CPU module "
                f"(got device_ids={device_ids!r}, output_device={output_device!r})"
            )
        return None, None
    index = device.index if device.index is not None else torch.cuda.current_device()
    if device_ids is not None:
        ids = [_index(d) for d in device_ids]
        if ids != [index]:
            raise ValueError(
                f"device_ids={list(device_ids)!r}: the module is on cuda:{index}; "
                "gradd.torch takes exactly that one device (torch: one device per "
                "process)"
            )
    out = _index(output_device)
    if out is not None and out != index:
        raise ValueError(f"output_device={output_device!r} but the module is on cuda:{index}")
    return [index], index


def gradient_view(client, i: int, p: torch.Tensor) -> torch.Tensor:
    """Parameter i's gradient in the daemon-allocated device memory, as a
    tensor shaped like p on p's device (no copy)."""

    class _Device:
        __cuda_array_interface__ = {
            "shape": (int(client.gradient_nbytes(i)) // p.element_size(),),
            "typestr": _TYPESTR[p.dtype],
            "data": (int(client.gradient_address(i)), False),
            "version": 2,
            "strides": None,
        }

    with torch.cuda.device(p.device):
        flat = torch.as_tensor(_Device(), device=p.device)
    if p.dtype == torch.bfloat16:
        flat = flat.view(torch.bfloat16)
    return flat.view(p.shape)


def stream_handle(device: torch.device) -> int:
    """The current stream's handle for CUDA work on `device` (0 for cpu)."""
    if device.type != "cuda":
        return 0
    return int(torch.cuda.current_stream(device).cuda_stream)


def to_device(obj, device: torch.device):
    """Moves the tensors in obj (nested lists/tuples/dicts) to device, as
    torch's DDP does with its inputs."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(to_device(o, device) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return type(obj)((k, to_device(v, device)) for k, v in obj.items())
    return obj
