"""gradd.torch's forward overlap (``_register_fused_optim(...,
overlap_forward=True)``, gradd/_overlap.py): parameters bitwise equal to
the same training that waits at the end of backward and steps
(torch.optim.SGD after backward), equal to torch's DDP within rounding,
one daemon and two daemons on loopback; the combinations it refuses."""
import pytest
import torch
from torch import nn

from conftest import run_workers
from rebuild_checks import results

STEPS = 6


def _check(rs, world):
    assert len(rs) == world
    for r in rs:
        assert r["bitwise"] and r["grads_bitwise"] and r["mid_equal"], r
        assert r["err"] <= 1e-5, r
        assert r["moved"], r
        assert r["buckets"] > 2, r
        # The forwards' pre-hooks finished buckets (the overlap happened),
        # every synced backward's iteration was finished.
        assert r["prehook_buckets"] > 0, r
        assert r["iterations"] == STEPS, r


def test_overlap_one_daemon(daemon, job_id, tmp_path):
    outs = run_workers("overlap_worker.py", 2, [str(tmp_path / "gloo"), str(STEPS)],
                       {"GRADD_SOCKET": daemon.socket, "GRADD_JOB": job_id}, timeout=240)
    _check(results(outs), 2)


def test_overlap_two_daemons(two_daemons, job_id, tmp_path):
    outs = run_workers("overlap_worker.py", 2, [str(tmp_path / "gloo"), str(STEPS)],
                       {"GRADD_JOB": job_id}, timeout=240,
                       rank_env=lambda r: two_daemons.rank_env(r, 1), logs=two_daemons.logs)
    _check(results(outs), 2)


def _single(daemon, job_id, module, **kwargs):
    import gradd.torch

    return gradd.torch.DistributedDataParallel(
        module, socket=daemon.socket, job_id=job_id, rank=0, world_size=1, local_rank=0,
        local_world_size=1, **kwargs)


def _model():
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


@pytest.mark.parametrize("kwargs,what", [
    (dict(find_unused_parameters=True), "find_unused_parameters"),
    (dict(static_graph=True), "static_graph"),
])
def test_refused_at_registration(daemon, job_id, kwargs, what):
    ddp = _single(daemon, job_id, _model(), **kwargs)
    with pytest.raises(ValueError, match=what):
        ddp._register_fused_optim(torch.optim.SGD, lr=0.1, overlap_forward=True)
    ddp.shutdown()


def test_refused_afterwards(daemon, job_id):
    ddp = _single(daemon, job_id, _model())
    ddp._register_fused_optim(torch.optim.SGD, lr=0.1, overlap_forward=True)
    with pytest.raises(ValueError, match="static_graph"):
        ddp._set_static_graph()
    with pytest.raises(RuntimeError, match="only be called once"):
        ddp._register_fused_optim(torch.optim.SGD, lr=0.1, overlap_forward=True)
    ddp.shutdown()


def test_too_late(daemon, job_id):
    ddp = _single(daemon, job_id, _model())
    ddp(torch.randn(3, 4)).sum().backward()
    with pytest.raises(RuntimeError, match="before the first backward"):
        ddp._register_fused_optim(torch.optim.SGD, lr=0.1, overlap_forward=True)
    ddp.shutdown()


def test_single_rank_steps_and_finishes(daemon, job_id):
    """One rank: the values are plain SGD's; wait_gradients, no_sync and
    a local backward finish the pending iteration first."""
    torch.manual_seed(0)
    model = _model()
    ref = _model()
    ref.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.5)
    ddp = _single(daemon, job_id, model)
    ddp._register_fused_optim(torch.optim.SGD, lr=0.1, momentum=0.5, overlap_forward=True)
    x = torch.randn(5, 4)
    for _ in range(3):
        opt.zero_grad()
        ref(x).square().sum().backward()
        opt.step()
        ddp.zero_grad()
        ddp(x).square().sum().backward()
    assert ddp._overlap.pending
    ddp.wait_gradients()
    assert not ddp._overlap.pending
    for p, q in zip(ref.parameters(), ddp.module.parameters()):
        assert torch.equal(p, q) and torch.equal(p.grad, q.grad)
    # no_sync and a local backward through .module finish first too.
    ddp(x).sum().backward()
    assert ddp._overlap.pending
    with ddp.no_sync():
        assert not ddp._overlap.pending
    ddp(x).sum().backward()
    assert ddp._overlap.pending
    ddp.module(x).sum().backward()
    assert not ddp._overlap.pending
    ddp.shutdown()
