"""PyTorch's "Getting Started with Distributed Data Parallel" tutorial,
written as a user writes it -- mp.spawn workers calling
``dist.init_process_group("gloo", rank=rank, world_size=world_size)``, no
RANK / WORLD_SIZE / GRADD_JOB in the environment, only GRADD_SOCKET naming
the node's daemon -- with gradd.torch's DDP next to torch's own, values
compared after every step: the basic example, checkpointing
(torch.save / torch.load of state_dict with map_location) and the
model-parallel example on CPU (device_ids=None)."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from spawn_util import clean_env, free_port, spawn
from torch_examples import (TOL, ToyModel, ToyMpModel, checksum, init_gloo, max_err, seeded,
                            train_side_by_side)

STEPS = 5


def _basic(rank, world, port, sock):
    clean_env({"GRADD_SOCKET": sock})
    init_gloo(rank, world, port)
    import gradd.torch

    model, twin = seeded(ToyModel, rank)
    ref = TorchDDP(model)
    ours = gradd.torch.DistributedDataParallel(twin)
    errs = train_side_by_side(ref, ours, STEPS, rank)
    out = {"errs": errs, "rank": ours.rank, "world": ours.world_size, "job": ours.job_id,
           "sum": checksum(ours.module)}
    ours.shutdown()
    dist.destroy_process_group()
    return out


def test_basic_example(daemon, tmp_path):
    out = spawn(_basic, 2, (2, free_port(), daemon.socket))
    for rank, r in enumerate(out):
        assert (r["rank"], r["world"]) == (rank, 2), r
        assert len(r["errs"]) == STEPS and max(r["errs"]) <= TOL, r["errs"]
    assert out[0]["job"] == out[1]["job"] != "default"
    assert out[0]["sum"] == out[1]["sum"]


def _checkpoint(rank, world, port, sock, path):
    clean_env({"GRADD_SOCKET": sock})
    init_gloo(rank, world, port)
    import gradd.torch

    model, twin = seeded(ToyModel, rank)
    ref = TorchDDP(model)
    ours = gradd.torch.DistributedDataParallel(twin)
    errs = train_side_by_side(ref, ours, 2, rank)
    ref_sd, ours_sd = ref.state_dict(), ours.state_dict()
    keys_match = list(ours_sd) == list(ref_sd) and all(k.startswith("module.") for k in ours_sd)
    if rank == 0:
        torch.save(ours_sd, path)
    dist.barrier()
    # The tutorial maps rank 0's cuda:0 to this rank's device; on CPU the
    # map is a no-op that must still be accepted.
    map_location = {"cuda:0": f"cuda:{rank}"}
    loaded = torch.load(path, map_location=map_location)
    # Perturb this rank's weights first: loading must restore rank 0's.
    with torch.no_grad():
        for p in list(ref.parameters()) + list(ours.parameters()):
            p.add_(float(rank + 1))
    ref.load_state_dict(loaded)
    ours.load_state_dict(loaded)
    after_load = max_err(ref.module, ours.module, grads=False)
    errs += train_side_by_side(ref, ours, 3, rank, salt=1)
    # The tutorial's other half: a plain (unwrapped) model from the file.
    plain = ToyModel()
    sd = dict(torch.load(path))
    torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(sd, "module.")
    plain.load_state_dict(sd)
    plain_ok = all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), loaded.values()))
    dist.barrier()
    if rank == 0:
        os.remove(path)
    ours.shutdown()
    dist.destroy_process_group()
    return {"errs": errs, "after_load": after_load, "keys_match": keys_match,
            "plain_ok": plain_ok}


def test_checkpoint_example(daemon, tmp_path):
    out = spawn(_checkpoint, 2, (2, free_port(), daemon.socket, str(tmp_path / "model.ckpt")))
    for r in out:
        assert r["keys_match"], "state_dict keys differ from torch DDP's ('module.' prefix)"
        assert r["plain_ok"]
        assert r["after_load"] <= TOL, r
        assert max(r["errs"]) <= TOL, r["errs"]


def _model_parallel(rank, world, port, sock):
    clean_env({"GRADD_SOCKET": sock})
    init_gloo(rank, world, port)
    import gradd.torch

    cpu = torch.device("cpu")
    model, twin = seeded(lambda: ToyMpModel(cpu, cpu), rank)
    ref = TorchDDP(model)  # device_ids=None: a multi-device module
    ours = gradd.torch.DistributedDataParallel(twin)
    errs = train_side_by_side(ref, ours, STEPS, rank)
    out = {"errs": errs, "sum": checksum(ours.module)}
    ours.shutdown()
    dist.destroy_process_group()
    return out


def test_model_parallel_example(daemon, tmp_path):
    out = spawn(_model_parallel, 2, (2, free_port(), daemon.socket))
    for r in out:
        assert max(r["errs"]) <= TOL, r["errs"]
    assert out[0]["sum"] == out[1]["sum"]
