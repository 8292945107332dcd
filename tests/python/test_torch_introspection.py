"""torch DDP's underscore APIs that torch's own tests call
(torch/testing/_internal/distributed/distributed_test.py), on gradd.torch's
DDP, and pickling without a daemon round trip (the attach is captured; the
trainings after a load run in test_torch_checkpoint.py)."""
import copy
import pickle
import time

import pytest
import torch
from torch import nn

import gradd.torch as gt
from test_env import CapturingClient


class _Client(CapturingClient):
    has_rebuilt_buckets = False
    iteration = 0

    def bucket(self, b):
        return {"params": list(range(len(self.specs)))}


class TwoLin(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(10, 10, bias=False)
        self.b = nn.Linear(10, 1, bias=False)

    def forward(self, x):
        return self.b(self.a(x))


@pytest.fixture
def one_rank(monkeypatch):
    """A world of one (no process group); the last attach's client in
    ["client"]."""
    seen = {}

    def attach(specs, **kwargs):
        seen["client"] = _Client(specs, kwargs, 0, 1)
        return seen["client"]

    monkeypatch.setattr(gt._C, "attach", attach)
    for var in ("GRADD_JOB", "GRADD_COORDINATOR", "NODE_RANK", "GROUP_RANK",
                "GROUP_WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    return seen


def test_sample_rate_and_logged_errors(one_rank):
    ddp = gt.DistributedDataParallel(TwoLin())
    assert "has_error" not in ddp._get_ddp_logging_data()
    ddp._set_ddp_runtime_logging_sample_rate(2)
    assert ddp._get_ddp_logging_data()["gradd_runtime_logging_sample_rate"] == 2
    with pytest.raises(ValueError, match="sample rate should be equal or greater than 1"):
        ddp._set_ddp_runtime_logging_sample_rate(0)
    data = ddp._get_ddp_logging_data()
    assert data["has_error"] == 1
    assert "sample rate should be equal or greater than 1" in data["error"]
    assert "iteration" in data


class _StepClient(_Client):
    """Lets a world of one run training steps (nothing to reduce)."""

    def mark_ready(self, i, stream):
        pass

    def mark_unused(self, i, keep):
        pass

    def skip_used_map(self):
        pass

    def wait_all(self, stream):
        pass

    def globally_used_all(self):
        return [True] * len(self.specs)

    def rebuild_buckets(self):
        return False


class MiddleUnused(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4, bias=False)
        self.b = nn.Linear(4, 4, bias=False)  # never used
        self.c = nn.Linear(4, 1, bias=False)

    def forward(self, x):
        return self.c(self.a(x))


def test_grad_ready_order_and_host_stamps(monkeypatch, one_rank):
    """torch's prev_iteration_grad_ready_order_indices (an unused parameter
    is ready when the backward ends) and host-clock stamps, both of the last
    sampled iteration."""
    monkeypatch.setattr(gt._C, "attach", lambda specs, **kw: _StepClient(specs, kw, 0, 1))
    ddp = gt.DistributedDataParallel(MiddleUnused(), find_unused_parameters=True)
    x = torch.randn(3, 4)
    before = time.time_ns()
    ddp(x).sum().backward()
    data = ddp._get_ddp_logging_data()
    # Before any sample, the one finished iteration's.
    assert data["prev_iteration_grad_ready_order_indices"] == "2, 0, 1"
    seen = []
    for _ in range(11):  # forwards 2..12; the 11th samples iteration 10
        ddp(x).sum().backward()
        seen.append(ddp._get_ddp_logging_data())
    after = time.time_ns()
    data = seen[-2]
    assert data["iteration"] == 10
    assert data["prev_iteration_grad_ready_order_indices"] == "2, 0, 1"
    stamps = [data[k] for k in (
        "forward_compute_time_start", "backward_compute_time_start",
        "backward_comm_time_start", "backward_compute_time_end", "backward_comm_time_end")]
    assert stamps == sorted(stamps)
    assert before - 10**9 <= stamps[0] and stamps[-1] <= after + 10**9  # host clock
    # Iteration 11 is not sampled: the 12th forward keeps iteration 10's.
    for k in ("iteration", "forward_compute_time_start", "backward_comm_time_end"):
        assert seen[-1][k] == data[k]
    assert seen[-3]["iteration"] == 9
    assert seen[-3]["forward_compute_time_start"] < data["forward_compute_time_start"]


def test_late_static_graph_is_logged(one_rank):
    ddp = gt.DistributedDataParallel(TwoLin())
    ddp._reducer.iterations_done = 1  # as after a training step
    with pytest.raises(RuntimeError, match="should be called before training loop"):
        ddp._set_static_graph()
    assert "should be called before training loop" in ddp._get_ddp_logging_data()["error"]


def test_param_to_name_mapping_as_torch(one_rank):
    ddp = gt.DistributedDataParallel(TwoLin())
    params, sparse = ddp._build_params_for_reducer()
    assert sparse == [False, False]
    assert ddp._build_debug_param_to_name_mapping(params) == {0: "a.weight", 1: "b.weight"}
    assert ddp._distributed_rank() == 0
    # Ignored parameters, set as torch's tests do.
    model = TwoLin()
    gt.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ["a.weight"])
    ignoring = gt.DistributedDataParallel(model)
    params, _ = ignoring._build_params_for_reducer()
    assert ignoring._build_debug_param_to_name_mapping(params) == {0: "b.weight"}
    # Mismatches, with torch's messages.
    extra = params + [nn.Parameter(torch.ones(1))]
    with pytest.raises(ValueError, match="Expected param to name mapping"):
        ignoring._build_debug_param_to_name_mapping(extra)
    with pytest.raises(ValueError, match="Param with name b.weight"):
        ignoring._build_debug_param_to_name_mapping([])


def test_pickle_drops_the_client_and_reattaches_at_first_forward(one_rank):
    ddp = gt.DistributedDataParallel(TwoLin(), job_id="pickled")
    first = one_rank["client"]
    for clone in (pickle.loads(pickle.dumps(ddp)), copy.deepcopy(ddp)):
        assert one_rank["client"] is first, "loading attached"
        assert clone.client is None and clone._reducer is None
        assert list(clone.state_dict()) == ["module.a.weight", "module.b.weight"]
        for p, q in zip(ddp.parameters(), clone.parameters()):
            assert torch.equal(p, q) and p is not q
        assert clone._get_ddp_logging_data()["num_parameter_tensors"] == 2
        with torch.no_grad():  # (the captured client cannot reduce)
            clone(torch.randn(3, 10))  # the first forward attaches, as a new job
        assert one_rank["client"] is not first and clone.client is one_rank["client"]
        assert clone.job_id.startswith("pickled/") and clone.job_id != ddp.job_id
        first = one_rank["client"]
    # The original is untouched.
    assert ddp.client is not None and ddp.job_id == "pickled"
