"""Who am I, from torch (gradd/_world.py): with a torch process group,
gradd.torch takes rank and world from it (not from the environment), derives
the node layout from (host, gradd socket) when the environment does not
give it (and always for a subgroup), and the ranks agree on a fresh job id
per construction. Real processes (mp.spawn) and a real Gloo group; the
daemon's attach is captured (the options it would get are what is checked;
test_torch_subgroups.py and test_torch_tutorials.py train for real)."""
import os
import re

import pytest
import torch
import torch.distributed as dist

from spawn_util import clean_env, spawn

_KEYS = ("job_id", "rank", "world_size", "local_rank", "local_world_size", "node_rank",
         "num_nodes", "coordinator")


class _CapturingClient:
    def __init__(self, specs, kwargs):
        import numpy as np

        self.kwargs = kwargs
        self.global_rank, self.world_size, self.num_buckets = kwargs["rank"], kwargs["world_size"], 1
        self.arrays = [np.zeros(shape, dtype=np.float32) for _, shape, _ in specs]

    def gradient(self, i):
        return self.arrays[i]

    def broadcast(self, data, root):
        pass

    def detach(self):
        pass


def _capture_attach():
    import gradd.torch as gt

    seen = []

    def attach(specs, **kwargs):
        seen.append({k: kwargs.get(k) for k in _KEYS})
        return _CapturingClient(specs, kwargs)

    gt._C.attach = attach
    return gt, seen


def _init(rank, world, init_file, env):
    clean_env(env)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)


def _default_group_worker(rank, init_file):
    # As PyTorch's DDP tutorial: no RANK / WORLD_SIZE / LOCAL_* anywhere.
    _init(rank, 2, init_file, {"GRADD_SOCKET": "/tmp/gradd-test-no-daemon.sock"})
    gt, seen = _capture_attach()
    a = gt.DistributedDataParallel(torch.nn.Linear(3, 2))
    b = gt.DistributedDataParallel(torch.nn.Linear(3, 2))  # the n-th model
    a.shutdown()
    c = gt.DistributedDataParallel(torch.nn.Linear(3, 2))  # a second training
    dist.barrier()
    dist.destroy_process_group()
    return {"attach": seen, "ddp": (a.rank, a.world_size, a.local_rank, a.local_world_size),
            "ids": [a.job_id, b.job_id, c.job_id]}


def test_rank_and_world_come_from_the_default_group(tmp_path):
    out = spawn(_default_group_worker, 2, (str(tmp_path / "init"),))
    for rank, r in enumerate(out):
        assert r["ddp"] == (rank, 2, rank, 2), r
        for kw in r["attach"]:
            assert (kw["rank"], kw["world_size"]) == (rank, 2)
            assert (kw["local_rank"], kw["local_world_size"], kw["num_nodes"]) == (rank, 2, 1)
            assert kw["coordinator"] == ""
    ids0, ids1 = out[0]["ids"], out[1]["ids"]
    assert ids0 == ids1, "the ranks did not agree on the job ids"
    assert len(set(ids0)) == 3, f"job ids collide: {ids0}"
    assert all(re.fullmatch(r"torch-[0-9a-f]{12}", i) for i in ids0), ids0


def _contradiction_worker(rank, init_file):
    # This rank's environment names the other rank.
    _init(rank, 2, init_file, {"RANK": str(1 - rank), "GRADD_SOCKET": "/tmp/x.sock"})
    gt, _ = _capture_attach()
    try:
        gt.DistributedDataParallel(torch.nn.Linear(3, 2))
    except ValueError as e:
        return str(e)
    return None


def test_environment_contradicting_the_group_is_an_error(tmp_path):
    out = spawn(_contradiction_worker, 2, (str(tmp_path / "init"),))
    for rank, msg in enumerate(out):
        assert msg is not None, f"rank {rank}: no error"
        assert f"RANK {1 - rank}" in msg and f"RANK {rank}" in msg, msg


def _explicit_rank_worker(rank, init_file):
    _init(rank, 2, init_file, {"GRADD_SOCKET": "/tmp/x.sock"})
    gt, _ = _capture_attach()
    with pytest.raises(ValueError, match="world_size= says world size 3.*process group"):
        gt.DistributedDataParallel(torch.nn.Linear(3, 2), world_size=3)
    return True


def test_explicit_world_contradicting_the_group_is_an_error(tmp_path):
    assert spawn(_explicit_rank_worker, 2, (str(tmp_path / "init"),)) == [True, True]


def _subgroup_worker(rank, init_file, sock_dir):
    # Two "nodes": ranks 0, 1 on daemon a, ranks 2, 3 on daemon b.
    sock = os.path.join(sock_dir, "a.sock" if rank < 2 else "b.sock")
    _init(rank, 4, init_file, {"GRADD_SOCKET": sock, "LOCAL_RANK": str(rank % 2),
                               "LOCAL_WORLD_SIZE": "2", "GRADD_COORDINATOR": "coord-host"})
    gt, seen = _capture_attach()
    across = [dist.new_group([0, 2]), dist.new_group([1, 3])]  # each spans both nodes
    within = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # each on one node
    uneven = dist.new_group([0, 1, 2])
    out = {}
    a = gt.DistributedDataParallel(torch.nn.Linear(3, 2), process_group=across[rank % 2])
    out["across"] = seen[-1]
    out["across_subgroup"] = a._distributed_rank()
    gt.DistributedDataParallel(torch.nn.Linear(3, 2), process_group=within[rank // 2])
    out["within"] = seen[-1]
    gt.DistributedDataParallel(torch.nn.Linear(3, 2), job_id="named",
                               process_group=within[rank // 2])
    out["named"] = seen[-1]["job_id"]
    if rank < 3:
        try:
            gt.DistributedDataParallel(torch.nn.Linear(3, 2), process_group=uneven)
            out["uneven"] = None
        except ValueError as e:
            out["uneven"] = str(e)
    import pickle

    try:
        pickle.dumps(a)
        out["pickle"] = None
    except RuntimeError as e:
        out["pickle"] = str(e)
    dist.barrier()
    return out


def test_subgroups_are_jobs_of_their_ranks(tmp_path):
    out = spawn(_subgroup_worker, 4, (str(tmp_path / "init"), str(tmp_path)))
    # Across nodes: {0, 2} and {1, 3}, one trainer per node, two nodes.
    for rank, r in enumerate(out):
        kw = r["across"]
        assert (kw["rank"], kw["world_size"]) == (rank // 2, 2), kw
        assert (kw["local_rank"], kw["local_world_size"]) == (0, 1), kw
        assert (kw["node_rank"], kw["num_nodes"]) == (rank // 2, 2), kw
        assert kw["coordinator"] == "coord-host"
        assert r["across_subgroup"] == rank // 2
        kw = r["within"]
        assert (kw["rank"], kw["world_size"]) == (rank % 2, 2), kw
        assert (kw["local_rank"], kw["local_world_size"], kw["num_nodes"]) == (rank % 2, 2, 1)
        assert kw["coordinator"] == ""
        assert "default process group" in (r["pickle"] or ""), r["pickle"]
    ids = {(name, rank): out[rank][name]["job_id"] for rank in range(4)
           for name in ("across", "within")}
    assert ids[("across", 0)] == ids[("across", 2)] != ids[("across", 1)] == ids[("across", 3)]
    assert ids[("within", 0)] == ids[("within", 1)] != ids[("within", 2)] == ids[("within", 3)]
    assert len(set(ids.values())) == 4
    # An explicit job id names each subgroup's job apart.
    assert out[0]["named"] == out[1]["named"] == "named/ranks-0-1"
    assert out[2]["named"] == out[3]["named"] == "named/ranks-2-3"
    for rank in range(3):
        msg = out[rank]["uneven"]
        assert msg is not None and "same number" in msg and "group ranks [0, 1]" in msg, msg


def test_job_id_from_torchrun_agent_store(monkeypatch):
    """No process group, but torchrun's agent store: the ranks of the n-th
    model of this run agree on one fresh id there (ranks as successive
    constructions in this process, the attach captured)."""
    import datetime

    from gradd import _torch_compat

    gt, seen = _capture_attach_patched(monkeypatch)
    # As torch's rendezvous makes it (no libuv where this torch has none:
    # Debian's torch 2.6).
    server = _torch_compat.tcp_store("127.0.0.1", 0, world_size=1, is_master=True,
                                     timeout=datetime.timedelta(seconds=10))
    clean_env_patched(monkeypatch, {
        "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "run-x",
        "TORCHELASTIC_RESTART_COUNT": "0", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(server.port), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"})
    ids = {}
    for model in range(2):
        for rank in (0, 1):
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("LOCAL_RANK", str(rank))
            ids[(model, rank)] = gt.DistributedDataParallel(torch.nn.Linear(3, 2)).job_id
    assert ids[(0, 0)] == ids[(0, 1)] != ids[(1, 0)] == ids[(1, 1)], ids
    # Drawn fresh (not torch-MASTER_ADDR:MASTER_PORT, which a restart reuses).
    assert all(re.fullmatch(r"torch-[0-9a-f]{12}", i) for i in ids.values()), ids
    assert [kw["job_id"] for kw in seen] == [ids[k] for k in sorted(ids)]


def _capture_attach_patched(monkeypatch):
    import gradd.torch as gt

    seen = []

    def attach(specs, **kwargs):
        seen.append({k: kwargs.get(k) for k in _KEYS})
        return _CapturingClient(specs, kwargs)

    monkeypatch.setattr(gt._C, "attach", attach)
    return gt, seen


def clean_env_patched(monkeypatch, extra):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "NODE_RANK", "GROUP_WORLD_SIZE", "GRADD_JOB", "GRADD_COORDINATOR"):
        monkeypatch.delenv(var, raising=False)
    for k, v in extra.items():
        monkeypatch.setenv(k, v)


def test_a_world_without_a_job_id_is_an_error(monkeypatch):
    gt, _ = _capture_attach_patched(monkeypatch)
    clean_env_patched(monkeypatch, {"RANK": "0", "WORLD_SIZE": "2"})
    for var in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="cannot agree on a job id"):
        gt.DistributedDataParallel(torch.nn.Linear(3, 2))
    monkeypatch.setenv("WORLD_SIZE", "1")  # alone: a fresh id of its own
    a = gt.DistributedDataParallel(torch.nn.Linear(3, 2)).job_id
    b = gt.DistributedDataParallel(torch.nn.Linear(3, 2)).job_id
    assert a != b and a.startswith("torch-") and b.startswith("torch-")
