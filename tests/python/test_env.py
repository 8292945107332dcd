"""How gradd.torch.DistributedDataParallel turns torchrun's environment into
attach options (multi-node included), with the attach call captured."""
import numpy as np
import pytest
import torch

import gradd.torch as gt


class CapturingClient:
    def __init__(self, specs, kwargs, rank, world):
        self.specs, self.kwargs = specs, kwargs
        self.global_rank, self.world_size, self.num_buckets = rank, world, 1
        self.arrays = [np.zeros(shape, dtype=np.float32) for _, shape, _ in specs]
        self.broadcasts = 0

    def gradient(self, i):
        return self.arrays[i]

    def broadcast(self, data, root):
        self.broadcasts += 1

    def detach(self):
        pass


@pytest.fixture
def capture(monkeypatch):
    seen = {}

    def attach(specs, **kwargs):
        seen["client"] = CapturingClient(specs, kwargs, int(seen["rank"]), int(seen["world"]))
        return seen["client"]

    monkeypatch.setattr(gt._C, "attach", attach)
    for var in ("GRADD_JOB", "GRADD_COORDINATOR", "NODE_RANK", "GROUP_RANK",
                "GROUP_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    return seen


def test_multi_node_environment(capture, monkeypatch):
    env = dict(RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2",
               GROUP_RANK="1", MASTER_ADDR="10.0.0.1", MASTER_PORT="29400")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    capture.update(rank=3, world=4)
    model = torch.nn.Linear(3, 2)
    ddp = gt.DistributedDataParallel(model, bucket_cap_mb=5)
    kw = capture["client"].kwargs
    assert kw["job_id"] == "torch-10.0.0.1:29400"
    assert (kw["local_rank"], kw["local_world_size"]) == (1, 2)
    # The coordinator's host only: MASTER_PORT is torch's store (here even
    # torchrun's rendezvous port); the daemons use their own port.
    assert (kw["node_rank"], kw["num_nodes"], kw["coordinator"]) == (1, 2, "10.0.0.1")
    # The launcher's world, which the client checks against the daemons'.
    assert (kw["world_size"], kw["rank"]) == (4, 3)
    assert kw["bucket_cap_mb"] == 5.0 and kw["broadcast_bytes"] > 0
    assert capture["client"].specs == [("weight", (2, 3), "float32"), ("bias", (2,), "float32")]
    assert capture["client"].broadcasts == 1  # parameters from rank 0
    assert ddp.node_rank == 1 and ddp.num_nodes == 2


def test_single_node_sends_no_node_info(capture, monkeypatch):
    for k, v in dict(RANK="1", WORLD_SIZE="2", MASTER_ADDR="h", MASTER_PORT="1").items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setenv("GRADD_JOB", "myjob")
    capture.update(rank=1, world=2)
    gt.DistributedDataParallel(torch.nn.Linear(3, 2))
    kw = capture["client"].kwargs
    assert kw["job_id"] == "myjob"
    assert (kw["local_rank"], kw["local_world_size"]) == (1, 2)
    # One node, said explicitly so the client library does not re-read it.
    assert (kw["node_rank"], kw["num_nodes"], kw["coordinator"]) == (None, 1, "")
    assert (kw["world_size"], kw["rank"]) == (2, 1)


def test_group_world_size_must_agree(capture, monkeypatch):
    env = dict(RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2",
               GROUP_RANK="1", GROUP_WORLD_SIZE="3", MASTER_ADDR="h", MASTER_PORT="1")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    capture.update(rank=3, world=4)
    with pytest.raises(ValueError, match="GROUP_WORLD_SIZE 3.*WORLD_SIZE 4"):
        gt.DistributedDataParallel(torch.nn.Linear(3, 2))


def test_daemon_disagreeing_on_rank_is_an_error(capture, monkeypatch):
    # (A world of 2 must name its job: no job is called "default".)
    for k, v in dict(RANK="1", WORLD_SIZE="2", GRADD_JOB="disagree").items():
        monkeypatch.setenv(k, v)
    capture.update(rank=0, world=2)
    with pytest.raises(gt.GraddError, match="rank 0 of 2.*rank 1 of 2"):
        gt.DistributedDataParallel(torch.nn.Linear(3, 2))


def test_bad_environment(capture, monkeypatch):
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK"):
        gt.DistributedDataParallel(torch.nn.Linear(3, 2))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="multiple"):
        gt.DistributedDataParallel(torch.nn.Linear(3, 2))
