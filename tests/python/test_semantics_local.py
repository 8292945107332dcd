"""gradd.torch semantics that need no second rank: derived job ids for
several models, .grad untouched at construction, _set_static_graph rules
(attach captured, as in test_env.py)."""
import warnings

import pytest
import torch

import gradd.torch as gt
from test_env import capture  # noqa: F401  (fixture)


def test_several_models_get_derived_job_ids(capture, monkeypatch):  # noqa: F811
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("GRADD_JOB", "gan-job-ids")
    capture.update(rank=0, world=1)
    ids = []
    for _ in range(3):
        ddp = gt.DistributedDataParallel(torch.nn.Linear(3, 2))
        ids.append((ddp.job_id, capture["client"].kwargs["job_id"]))
    assert ids == [("gan-job-ids",) * 2, ("gan-job-ids/1",) * 2, ("gan-job-ids/2",) * 2]
    # Another base id (or rank) counts on its own.
    other = gt.DistributedDataParallel(torch.nn.Linear(3, 2), job_id="gan-other")
    assert other.job_id == "gan-other"


def test_construction_leaves_grads_alone(capture, monkeypatch):  # noqa: F811
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    capture.update(rank=0, world=1)
    model = torch.nn.Linear(3, 2)
    model.bias.grad = torch.ones(2)
    gt.DistributedDataParallel(model, job_id="grads-alone")
    assert model.weight.grad is None
    assert torch.equal(model.bias.grad, torch.ones(2))
    assert capture["client"].kwargs["find_unused_parameters"] is True


def test_set_static_graph(capture, monkeypatch):  # noqa: F811
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    capture.update(rank=0, world=1)
    ddp = gt.DistributedDataParallel(torch.nn.Linear(3, 2), job_id="static-set")
    ddp._set_static_graph()
    assert ddp.static_graph and ddp._reducer.static_graph
    with pytest.warns(UserWarning, match="no need to set it again"):
        ddp._set_static_graph()
    late = gt.DistributedDataParallel(torch.nn.Linear(3, 2), job_id="static-late")
    late._reducer.iterations_done = 1  # as after a synced backward
    with pytest.raises(RuntimeError, match="before training loop starts"):
        late._set_static_graph()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        gt.DistributedDataParallel(torch.nn.Linear(3, 2), job_id="static-both",
                                   static_graph=True, find_unused_parameters=True)
    assert any("find_unused_parameters=true" in str(x.message) for x in w)
