"""gradd.torch.DistributedDataParallel behaviour, two ranks as threads of
this process (parity with torch's DDP is in test_parity.py)."""
import time

import pytest
import torch
from torch import nn

import gradd
from gradd.torch import DistributedDataParallel as DDP
from test_client import run_ranks
import models

torch.set_num_threads(1)


def make(rank, daemon, job_id, model=None, **kw):
    torch.manual_seed(rank)  # different weights per rank
    model = model if model is not None else models.mlp()
    kw.setdefault("bucket_cap_mb", 0.02)
    kw.setdefault("first_bucket_cap_mb", 0.02)
    return DDP(model, socket=daemon.socket, job_id=job_id, rank=rank, world_size=2,
               local_rank=rank, local_world_size=2, **kw)


def test_construction_syncs_and_exposes_module(daemon, job_id):
    def rank_fn(rank):
        ddp = make(rank, daemon, job_id, models.SmallCNN(), bucket_cap_mb=0.002,
                   first_bucket_cap_mb=0.002)
        try:
            keys = list(ddp.state_dict().keys())
            assert keys == ["module." + k for k in ddp.module.state_dict().keys()]
            assert any("running_mean" in k for k in keys)
            assert ddp.num_buckets > 1
            ddp.eval()
            assert not ddp.training and not ddp.module.training
            assert all(not m.training for m in ddp.module.modules())
            ddp.train()
            assert ddp.training and all(m.training for m in ddp.module.modules())
            state = [t.clone() for t in ddp.module.state_dict().values()]
            # As in torch, construction leaves .grad alone (None) ...
            assert all(p.grad is None for p in ddp.module.parameters())
            # ... and a backward makes every gradient a view into the shared
            # buckets.
            ddp(torch.randn(2, 3, 12, 12)).sum().backward()
            infos = ddp.bucket_info()
            for b, info in enumerate(infos):
                addrs = [ddp.client.gradient_address(i) for i in info["params"]]
                lo = min(addrs)
                for i in info["params"]:
                    p = ddp._params[i]
                    assert p.grad.data_ptr() == ddp.client.gradient_address(i)
                    assert lo <= p.grad.data_ptr()
                    assert p.grad.data_ptr() + p.grad.numel() * p.grad.element_size() <= lo + info["size_bytes"]
            return state
        finally:
            ddp.shutdown()

    r0, r1 = run_ranks(2, rank_fn)
    for a, b in zip(r0, r1):
        assert torch.equal(a, b)  # rank 0's state everywhere


def _train_step(ddp, rank, set_to_none=False):
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(rank))
    ddp.zero_grad(set_to_none=set_to_none)
    ddp(x).square().mean().backward()
    return [p.grad.clone() for p in ddp.module.parameters()]


def test_backward_averages_and_set_to_none(daemon, job_id):
    def rank_fn(rank):
        ddp = make(rank, daemon, job_id)
        try:
            g1 = _train_step(ddp, rank)
            # set_to_none: autograd makes a fresh grad; it's copied into the
            # bucket and .grad points back at shared memory.
            g2 = _train_step(ddp, rank, set_to_none=True)
            same_mem = all(p.grad.data_ptr() == ddp.client.gradient_address(i)
                           for i, p in enumerate(ddp.module.parameters()))
            local = models.mlp()
            local.load_state_dict(ddp.module.state_dict())
            x = torch.randn(8, 32, generator=torch.Generator().manual_seed(rank))
            local(x).square().mean().backward()
            return g1, g2, same_mem, [p.grad for p in local.parameters()]
        finally:
            ddp.shutdown()

    (a1, a2, m0, l0), (b1, b2, m1, l1) = run_ranks(2, rank_fn)
    assert m0 and m1
    for x, y, p, q in zip(a2, b2, l0, l1):
        assert torch.equal(x, y)
        torch.testing.assert_close(x, (p + q) / 2, rtol=1e-5, atol=1e-7)
    for x, y in zip(a1, b1):
        assert torch.equal(x, y)


def test_no_sync_accumulates_locally(daemon, job_id):
    def rank_fn(rank):
        ddp = make(rank, daemon, job_id)
        try:
            x = torch.randn(8, 32, generator=torch.Generator().manual_seed(rank))
            ddp.zero_grad()
            with ddp.no_sync():
                ddp(x).square().mean().backward()
            local = [p.grad.clone() for p in ddp.module.parameters()]
            ddp(x).square().mean().backward()  # synced: averages 2x local
            return local, [p.grad.clone() for p in ddp.module.parameters()]
        finally:
            ddp.shutdown()

    (l0, s0), (l1, s1) = run_ranks(2, rank_fn)
    assert not all(torch.equal(a, b) for a, b in zip(l0, l1))  # no communication
    for a, b, x, y in zip(l0, l1, s0, s1):
        torch.testing.assert_close(x, a + b, rtol=1e-5, atol=1e-7)
        assert torch.equal(x, y)


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(16, 16)
        self.used = nn.Linear(16, 4)
        self.unused = nn.Linear(16, 4)

    def forward(self, x, which="used"):
        return getattr(self, which)(self.body(x))


def test_unused_parameters(daemon, job_id):
    def rank_fn(rank):
        ddp = make(rank, daemon, job_id + "-find", TwoHeads(), find_unused_parameters=True)
        try:
            ddp.zero_grad(set_to_none=True)
            x = torch.randn(4, 16)
            # rank 1 uses the other head: locally unused on each rank but used globally
            ddp(x, "used" if rank == 0 else "unused").sum().backward()
            grads = {n: (p.grad.clone() if p.grad is not None else None)
                     for n, p in ddp.module.named_parameters()}
        finally:
            ddp.shutdown()
        strict = make(rank, daemon, job_id + "-strict", TwoHeads(), attach_timeout=20)
        try:
            strict(x).sum().backward()
        except RuntimeError as e:
            return grads, str(e)
        finally:
            strict.shutdown()
        return grads, None

    (g0, e0), (g1, e1) = run_ranks(2, rank_fn)
    for n in g0:
        assert g0[n] is not None and torch.equal(g0[n], g1[n]), n
    for err in (e0, e1):
        assert err is not None and "unused.weight" in err and "find_unused_parameters" in err


def test_mismatched_models_raise_daemon_error(daemon, job_id):
    def rank_fn(rank):
        model = nn.Sequential(nn.Linear(8, 8 + rank), nn.Linear(8 + rank, 2))
        try:
            make(rank, daemon, job_id, model, attach_timeout=20)
        except gradd.GraddError as e:
            return e
        return None

    for err in run_ranks(2, rank_fn):
        assert isinstance(err, gradd.GraddError), err
        assert "weight" in str(err) or "bias" in str(err), str(err)


def test_environment_and_arguments(daemon, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29999")
    monkeypatch.delenv("GRADD_JOB", raising=False)
    monkeypatch.setenv("GRADD_SOCKET", daemon.socket)
    ddp = DDP(models.mlp())
    try:
        assert ddp.job_id == "torch-127.0.0.1:29999"
        assert (ddp.rank, ddp.world_size, ddp.local_rank, ddp.local_world_size) == (0, 1, 0, 1)
        out = ddp(torch.randn(2, 32))
        out.sum().backward()
        assert out.shape == (2, 10)
    finally:
        ddp.shutdown()
    with pytest.raises(ValueError):
        DDP(models.mlp(), device_ids=[0])
    with pytest.raises(RuntimeError, match="doesn't have any parameter"):
        DDP(nn.Linear(2, 2).requires_grad_(False))


def test_daemon_error_surfaces_from_backward(daemon, job_id):
    def rank_fn(rank):
        ddp = make(rank, daemon, job_id)
        if rank == 1:
            time.sleep(0.3)
            ddp.shutdown()  # leaves the job mid-iteration
            return None
        with pytest.raises(gradd.GraddError) as e:
            ddp(torch.randn(4, 32)).sum().backward()
        # The job is broken now: later calls say so instead of hanging.
        with pytest.raises(RuntimeError, match="failed earlier"):
            ddp(torch.randn(4, 32))
        ddp.shutdown()
        return e.value

    err = run_ranks(2, rank_fn)[0]
    assert job_id in str(err) and "rank 1" in str(err)


class MixedDtypes(nn.Module):
    def __init__(self):
        super().__init__()
        self.w16 = nn.Parameter(torch.randn(64).half())
        self.wbf = nn.Parameter(torch.randn(64).bfloat16())
        self.w64 = nn.Parameter(torch.randn(64).double())
        self.w32 = nn.Parameter(torch.randn(64))

    def forward(self, x):
        return ((x.half() * self.w16).float().sum() + (x.bfloat16() * self.wbf).float().sum()
                + (x.double() * self.w64).float().sum() + (x * self.w32).sum())


def test_half_bfloat16_double_parameters(daemon, job_id):
    def rank_fn(rank):
        ddp = make(rank, daemon, job_id, MixedDtypes())
        try:
            assert sorted(b["dtype"] for b in ddp.bucket_info()) == [
                "bfloat16", "float16", "float32", "float64"]
            x = torch.full((64,), float(rank + 1))  # d loss / d w = x
            ddp(x).backward()
            return {n: p.grad.clone() for n, p in ddp.module.named_parameters()}
        finally:
            ddp.shutdown()

    for grads in run_ranks(2, rank_fn):
        for name, g in grads.items():
            assert g.dtype == getattr(MixedDtypes(), name).dtype
            assert torch.equal(g.float(), torch.full((64,), 1.5)), name
