"""Pieces shared by the parity workers (one process per rank, torch's DDP
over Gloo side by side with gradd.torch's)."""
import os

import torch
import torch.distributed as dist


def rel_err(a, b):
    """Largest difference between tensors `a` and `b` relative to the
    largest magnitude in `b` (the absolute difference when `b` is zero; 0
    for empty tensors). Sparse tensors are compared densified."""
    a, b = a.detach().double(), b.detach().double()
    if a.is_sparse:
        a = a.to_dense()
    if b.is_sparse:
        b = b.to_dense()
    if b.numel() == 0:
        return 0.0
    scale = b.abs().max().item()
    diff = (a - b).abs().max().item()
    return diff / scale if scale > 0 else diff


def test_device():
    """The device the parity workers train on: GRADD_TEST_DEVICE (cpu, or
    cuda for the GPU tests: every rank on GPU 0, where torch's reference
    uses Gloo with CUDA tensors since NCCL refuses two ranks on one GPU)."""
    return torch.device(os.environ.get("GRADD_TEST_DEVICE", "cpu"))


def device_ids(device):
    """DDP's device_ids for a module on `device` (both torch's and gradd's)."""
    return [device.index or 0] if device.type == "cuda" else None


def init_gloo(init_file):
    """One intra-op thread (the machine runs several ranks), then torch's
    Gloo process group of RANK / WORLD_SIZE over the file `init_file`;
    returns (rank, world)."""
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    return rank, world
