"""gradd.torch's DDP saved, copied and restarted as torch's is: torch.save /
torch.load of the wrapper itself and copy.deepcopy (the copy re-attaches at
its first forward, as a job of its own), state_dict with torch's
``module.`` prefix and load_state_dict into the wrapper, two trainings one
after another in one process and two models trained together -- all with
torch DDP's values over Gloo at every step. Two worlds started together on
one daemon get jobs of their own; a rank that only loads a checkpoint does
not block."""
import copy
import io
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from spawn_util import clean_env, free_port, spawn
from torch_examples import TOL, ToyModel, init_gloo, max_err, seeded, train_side_by_side


def _save_and_copy(rank, world, port, sock):
    clean_env({"GRADD_SOCKET": sock})
    init_gloo(rank, world, port)
    import gradd.torch

    model, twin = seeded(ToyModel, rank)
    ref = TorchDDP(model)
    ours = gradd.torch.DistributedDataParallel(twin)
    out = {"errs": train_side_by_side(ref, ours, 2, rank)}

    # torch.save / torch.load of the wrapper (torch's DDP pickles too).
    blobs = []
    for ddp in (ref, ours):
        buf = io.BytesIO()
        torch.save(ddp, buf)
        blobs.append(buf.getvalue())
    t0 = time.monotonic()
    # The wrapper is a pickled module, not tensors: weights_only=False
    # (torch 2.6's default is True; 1.13's is False).
    ref2, ours2 = (torch.load(io.BytesIO(b), weights_only=False) for b in blobs)
    out["load_s"] = time.monotonic() - t0
    out["loaded_type"] = type(ours2).__name__
    out["loaded_state_equal"] = max_err(ours.module, ours2.module, grads=False) == 0
    out["errs_loaded"] = train_side_by_side(ref2, ours2, 3, rank, salt=1)
    out["jobs"] = [ours.job_id, ours2.job_id]

    # copy.deepcopy: a second, independent model.
    ref3, ours3 = copy.deepcopy(ref), copy.deepcopy(ours)
    out["errs_copy"] = train_side_by_side(ref3, ours3, 3, rank, salt=2)
    out["jobs"].append(ours3.job_id)
    # The original still trains, untouched by its copies.
    out["errs_orig"] = train_side_by_side(ref, ours, 2, rank, salt=3)
    for m in (ours, ours2, ours3):
        m.shutdown()
    dist.barrier()
    dist.destroy_process_group()
    return out


def test_save_load_and_deepcopy_of_the_wrapper(daemon):
    out = spawn(_save_and_copy, 2, (2, free_port(), daemon.socket), timeout=150)
    for r in out:
        assert r["loaded_type"] == "DistributedDataParallel"
        assert r["loaded_state_equal"]
        for key in ("errs", "errs_loaded", "errs_copy", "errs_orig"):
            assert max(r[key]) <= TOL, (key, r[key])
        assert len(set(r["jobs"])) == 3, f"copies share a job: {r['jobs']}"
    assert out[0]["jobs"] == out[1]["jobs"]


def _load_only(rank, world, port, sock, path):
    clean_env({"GRADD_SOCKET": sock})
    init_gloo(rank, world, port)
    import gradd.torch

    ours = gradd.torch.DistributedDataParallel(ToyModel())
    if rank == 0:
        torch.save(ours, path)
    dist.barrier()
    out = {}
    if rank == 1:
        # Only this rank loads, to look at the weights: nothing is collective.
        t0 = time.monotonic()
        loaded = torch.load(path, weights_only=False)
        out["keys"] = list(loaded.state_dict())
        out["logging_rank"] = loaded._get_ddp_logging_data()["rank"]
        del loaded
        out["load_s"] = time.monotonic() - t0
    ours.shutdown()
    dist.barrier()
    dist.destroy_process_group()
    return out


def test_loading_alone_does_not_block(daemon, tmp_path):
    out = spawn(_load_only, 2, (2, free_port(), daemon.socket, str(tmp_path / "ddp.pt")),
                timeout=90)
    assert out[1]["keys"] == ["module.net1.weight", "module.net1.bias",
                              "module.net2.weight", "module.net2.bias"]
    assert out[1]["load_s"] < 30  # a collective would wait for rank 0's forward


def _trainings(rank, world, port, sock):
    clean_env({"GRADD_SOCKET": sock})
    init_gloo(rank, world, port)
    import gradd.torch

    out = {"jobs": [], "errs": []}
    # Two trainings one after another.
    for salt in range(2):
        model, twin = seeded(ToyModel, rank + 10 * salt)
        ref = TorchDDP(model)
        ours = gradd.torch.DistributedDataParallel(twin)
        out["errs"] += train_side_by_side(ref, ours, 2, rank, salt=salt)
        out["jobs"].append(ours.job_id)
        ours.shutdown()
    # Two models at once (a GAN's pair), trained interleaved; the second
    # starts from the first's weights loaded into the wrapper.
    (m1, t1), (m2, t2) = seeded(ToyModel, rank), seeded(ToyModel, rank + 7)
    refs = [TorchDDP(m1), TorchDDP(m2)]
    ours = [gradd.torch.DistributedDataParallel(t1), gradd.torch.DistributedDataParallel(t2)]
    refs[1].load_state_dict(refs[0].state_dict())
    ours[1].load_state_dict(ours[0].state_dict())
    for step in range(2):
        for i in range(2):
            out["errs"] += train_side_by_side(refs[i], ours[i], 1, rank, salt=10 * step + i)
    out["jobs"] += [o.job_id for o in ours]
    for o in ours:
        o.shutdown()
    dist.destroy_process_group()
    return out


def test_sequential_trainings_and_two_models(daemon):
    out = spawn(_trainings, 2, (2, free_port(), daemon.socket), timeout=150)
    for r in out:
        assert max(r["errs"]) <= TOL, r["errs"]
        assert len(set(r["jobs"])) == 4, r["jobs"]
    assert out[0]["jobs"] == out[1]["jobs"]


def _two_worlds(proc, init_dir, sock):
    # Processes 0, 1 form one world, 2, 3 another, started together on one
    # daemon; both see the same (stale) MASTER_ADDR / MASTER_PORT, as
    # scripts copied from the tutorial do, but rendezvous through their own
    # files.
    clean_env({"GRADD_SOCKET": sock, "MASTER_ADDR": "localhost", "MASTER_PORT": "12355"})
    world_id, rank = divmod(proc, 2)
    dist.init_process_group("gloo", init_method=f"file://{init_dir}/world{world_id}",
                            rank=rank, world_size=2)
    import gradd.torch

    model, twin = seeded(ToyModel, proc)
    ref = TorchDDP(model)
    ours = gradd.torch.DistributedDataParallel(twin)
    errs = train_side_by_side(ref, ours, 3, rank, salt=world_id)
    job = ours.job_id
    ours.shutdown()
    dist.destroy_process_group()
    return {"errs": errs, "job": job}


def test_two_jobs_started_together(daemon, tmp_path):
    out = spawn(_two_worlds, 4, (str(tmp_path), daemon.socket), timeout=120)
    for r in out:
        assert max(r["errs"]) <= TOL, r["errs"]
    assert out[0]["job"] == out[1]["job"] != out[2]["job"] == out[3]["job"]
