"""gradd.torch under torch 2.x (and still 1.13): torch 2.x's constructor
arguments (init_sync, device_mesh, bucket_cap_mb=None, the ones gradd
refuses), torch.compile(gradd_ddp) against torch.compile(torch_ddp), the
optimizer-overlap hooks, and the import-time torch version check
(gradd/_torch_compat.py). Two ranks are mp.spawn processes with a real Gloo
group for torch's DDP beside gradd's; values are compared after every step.
A test skips only when the running torch lacks the feature it exercises."""
import inspect
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from spawn_util import clean_env, free_port, spawn
from torch_examples import TOL, ToyModel, checksum, data, init_gloo, max_err, seeded

STEPS = 4


def _has(path):
    """Whether torch has the attribute path (e.g. "distributed.device_mesh")."""
    obj = torch
    for part in path.split("."):
        try:
            obj = getattr(obj, part)
        except (AttributeError, ImportError):
            try:
                import importlib

                obj = importlib.import_module(f"{obj.__name__}.{part}")
            except Exception:
                return False
    return True


def _single(daemon, job_id, module, **kwargs):
    import gradd.torch

    return gradd.torch.DistributedDataParallel(
        module, socket=daemon.socket, job_id=job_id, rank=0, world_size=1, local_rank=0,
        local_world_size=1, **kwargs)


# ------------------------------------------------------- import-time check
@pytest.mark.parametrize("module", ["gradd.torch", "gradd.distributed"])
@pytest.mark.parametrize("version", ["1.12.1", "3.0.0", "0.4.1"])
def test_import_refuses_an_unsupported_torch(tmp_path, version, module):
    """A fake torch with that version first on sys.path: `import gradd.torch`
    (or `import gradd.distributed` alone) fails with one ImportError naming
    the version and the supported range, before any C++ extension built
    against torch is loaded."""
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text(f"__version__ = {version!r}\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    code = textwrap.dedent(f"""
        import sys
        try:
            import {module}
        except ImportError as e:
            print("IMPORT-ERROR:", e)
            print("C10D-LOADED:", "gradd._c10d" in sys.modules)
        else:
            print("IMPORTED")
    """)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"IMPORT-ERROR: gradd.torch does not support torch {version}" in out.stdout, out
    assert "torch 1.13 or 2.0 through 2.6" in out.stdout, out.stdout
    assert "C10D-LOADED: False" in out.stdout, out.stdout


def test_newer_untested_2x_warns_and_older_supported_ones_pass(tmp_path):
    from gradd import _torch_compat as compat

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compat.check_version("1.13.0a0") == (1, 13)
        assert compat.check_version("2.6.0+debian") == (2, 6)
        assert compat.check_version("2.0.1") == (2, 0)
    with pytest.warns(compat.GraddTorchVersionWarning, match=r"torch 2\.9\.0 is newer"):
        assert compat.check_version("2.9.0") == (2, 9)
    for bad in ("1.12.1", "3.1.0", "banana"):
        with pytest.raises(ImportError, match="gradd supports torch 1.13 or 2.0 through 2.6"):
            compat.check_version(bad)
    # The same at import, in a fresh process with a fake torch 2.99: the
    # warning names the version (the fake then lacks what gradd imports).
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("__version__ = '2.99.0'\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-W", "always", "-c", "import gradd.torch"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert "GraddTorchVersionWarning" in out.stderr and "torch 2.99.0 is newer" in out.stderr, (
        out.stderr)
    assert "does not support torch" not in out.stderr


# ------------------------------------------------- constructor arguments
@pytest.mark.parametrize("arg", ["delay_all_reduce_named_params", "param_to_hook_all_reduce",
                                 "mixed_precision"])
def test_unsupported_torch2_arguments_are_refused_by_name(arg):
    import gradd.torch

    value = [("weight", nn.Parameter(torch.zeros(1)))] if arg != "mixed_precision" else object()
    with pytest.raises(NotImplementedError, match=f"does not support torch's {arg}="):
        gradd.torch.DistributedDataParallel(nn.Linear(2, 2), **{arg: value})


def test_unknown_argument_is_named_by_python():
    import gradd.torch

    with pytest.raises(TypeError, match="no_such_argument"):
        gradd.torch.DistributedDataParallel(nn.Linear(2, 2), no_such_argument=1)


def test_torch2_attributes(daemon, job_id):
    ddp = _single(daemon, job_id, nn.Linear(4, 3))
    assert ddp.bucket_bytes_cap == 25 * (1 << 20) and ddp.bucket_bytes_cap_default
    assert ddp.device == torch.device("cpu") and ddp.device_type == "cpu"
    assert ddp.mixed_precision is None and ddp._delay_all_reduce_params == []
    assert [p for p in ddp._module_parameters] == list(ddp.module.parameters())
    assert list(ddp._get_data_parallel_params(ddp.module)) == list(ddp.module.parameters())
    assert ddp.will_sync_module_buffers() is False  # Linear has no buffers
    ddp.shutdown()
    small = _single(daemon, job_id + "-b", nn.Linear(4, 3), bucket_cap_mb=2)
    assert small.bucket_bytes_cap == 2 * (1 << 20) and not small.bucket_bytes_cap_default
    with pytest.raises(NotImplementedError, match="_update_process_group"):
        small._update_process_group(None)
    small.shutdown()


def test_compiled_autograd_is_refused_clearly(daemon, job_id):
    """docs/torch2.md: compiled autograd is not supported. gradd says so
    (NotImplementedError naming the setting) at construction, and at a
    forward once it is turned on (before anything collective: the DDP
    trains again once it is off)."""
    try:
        import torch._dynamo.config as cfg
    except ImportError:
        cfg = None
    if cfg is None or not hasattr(cfg, "compiled_autograd") or not hasattr(cfg, "patch"):
        pytest.skip("this torch has no compiled autograd")
    x = torch.randn(2, 4)
    with cfg.patch(optimize_ddp="python_reducer"):
        with pytest.raises(NotImplementedError,
                           match=r"compiled autograd \(torch._dynamo.config.optimize_ddp is "
                                 r"'python_reducer'\)"):
            _single(daemon, job_id, nn.Linear(4, 3))
    ddp = _single(daemon, job_id + "-b", nn.Linear(4, 3))
    for setting, named in (({"compiled_autograd": True}, "compiled_autograd is True"),
                           ({"optimize_ddp": "python_reducer_without_compiled_forward"},
                            "python_reducer_without_compiled_forward")):
        with cfg.patch(**setting):
            with pytest.raises(NotImplementedError, match=f"forward: .*{named}"):
                ddp(x)
    import torch._dynamo.compiled_autograd as ca

    if hasattr(ca, "_enable"):  # around the backward alone: the first hook says so
        loss = ddp(x).sum()
        with ca._enable(lambda gm: gm):
            with pytest.raises(NotImplementedError, match="backward: .*compiled autograd"):
                loss.backward()
    ddp(x).sum().backward()  # off again: trains
    assert ddp.module.weight.grad is not None
    assert ddp.num_iterations >= 1
    ddp.shutdown()


def test_check_reduction_is_deprecated_as_in_torch(daemon, job_id):
    with pytest.warns(FutureWarning, match="check_reduction"):
        ddp = _single(daemon, job_id, nn.Linear(4, 3), check_reduction=True)
    ddp.shutdown()


def _init_sync_worker(rank, port, sock, init_sync):
    clean_env({"GRADD_SOCKET": sock})
    init_gloo(rank, 2, port)
    import gradd.torch

    torch.manual_seed(100 + rank)  # different weights per rank
    model = ToyModel()
    before = checksum(model)
    ddp = gradd.torch.DistributedDataParallel(model, init_sync=init_sync)
    after = checksum(ddp.module)
    # A step still averages the gradients (the weights stay as they were).
    ddp(data(0, rank)[0]).sum().backward()
    grads = [p.grad.clone() for p in ddp.module.parameters()]
    gathered = [None, None]
    dist.all_gather_object(gathered, [g.tolist() for g in grads])
    ddp.shutdown()
    dist.destroy_process_group()
    return {"before": before, "after": after, "grads_equal": gathered[0] == gathered[1]}


@pytest.mark.parametrize("init_sync", [True, False])
def test_init_sync(daemon, init_sync):
    """init_sync=False (torch 2.7's name) skips the initial broadcast: each
    rank keeps its own weights; True (the default) gives rank 0's."""
    out = spawn(_init_sync_worker, 2, (free_port(), daemon.socket, init_sync))
    assert out[0]["before"] != out[1]["before"]
    if init_sync:
        assert out[0]["after"] == out[1]["after"] == out[0]["before"]
    else:
        assert [r["after"] for r in out] == [r["before"] for r in out]
    assert all(r["grads_equal"] for r in out)


def _train_pair(ref, ours, rank, steps=STEPS, opt_ref=None, opt_ours=None, no_sync_every=0):
    """Trains torch's `ref` and gradd's `ours` (each maybe compiled) on the
    same data; returns the largest relative error after each step."""
    opt_ref = opt_ref or torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    opt_ours = opt_ours or torch.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.MSELoss()
    errs = []
    for step in range(steps):
        for model, ddp, opt in ((ref, ref_ddp(ref), opt_ref), (ours, ref_ddp(ours), opt_ours)):
            opt.zero_grad()
            if no_sync_every and step % no_sync_every == 0:
                with ddp.no_sync():
                    x, y = data(step, rank, salt=7)
                    loss_fn(model(x), y).backward()
            x, y = data(step, rank)
            loss_fn(model(x), y).backward()
            opt.step()
        errs.append(max_err(ref_ddp(ref).module, ref_ddp(ours).module))
    return errs


def ref_ddp(model):
    """The DDP under a torch.compile wrapper (or the model itself)."""
    return getattr(model, "_orig_mod", model)


def _mesh_worker(rank, port, sock):
    clean_env({"GRADD_SOCKET": sock})
    init_gloo(rank, 2, port)
    import gradd.torch
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2,))
    model, twin = seeded(ToyModel, rank)
    ref = TorchDDP(model, device_mesh=mesh)
    ours = gradd.torch.DistributedDataParallel(twin, device_mesh=mesh)
    same_group = ours.process_group is mesh.get_group(0) and ours.device_mesh is mesh
    errs = _train_pair(ref, ours, rank)
    # A 2-D mesh, and a mesh with a process group, as torch refuses them.
    mesh2 = init_device_mesh("cpu", (1, 2), mesh_dim_names=("a", "b"))
    msgs = []
    for kwargs in ({"device_mesh": mesh2},
                   {"device_mesh": mesh, "process_group": dist.group.WORLD}):
        try:
            gradd.torch.DistributedDataParallel(ToyModel(), **kwargs)
        except RuntimeError as e:
            msgs.append(str(e))
    ours.shutdown()
    dist.destroy_process_group()
    return {"same_group": same_group, "errs": errs, "rank": ours.rank, "msgs": msgs}


@pytest.mark.skipif(not _has("distributed.device_mesh.init_device_mesh"),
                    reason="this torch has no DeviceMesh")
def test_device_mesh_1d_is_its_process_group(daemon):
    out = spawn(_mesh_worker, 2, (free_port(), daemon.socket))
    for rank, r in enumerate(out):
        assert r["same_group"] and r["rank"] == rank, r
        assert max(r["errs"]) <= TOL, r["errs"]
        assert len(r["msgs"]) == 2, r["msgs"]
        assert "Only 1D device mesh is supported" in r["msgs"][0]
        assert "Cannot specify both process_group and device_mesh" in r["msgs"][1]


def _options_worker(rank, port, sock, kwargs):
    clean_env({"GRADD_SOCKET": sock})
    init_gloo(rank, 2, port)
    import gradd.torch

    model, twin = seeded(_BnModel, rank)
    ref = TorchDDP(model, **kwargs)
    ours = gradd.torch.DistributedDataParallel(twin, **kwargs)
    # torch's own reducer asserts (expect_autograd_hooks_) on no_sync with
    # static_graph: no micro-steps there.
    errs = _train_pair(ref, ours, rank, no_sync_every=0 if kwargs.get("static_graph") else 2)
    ours.shutdown()
    dist.destroy_process_group()
    return errs


class _BnModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.bn = nn.BatchNorm1d(10)
        self.net2 = nn.Linear(10, 5)
        self.unused = nn.Linear(3, 3)

    def forward(self, x):
        return self.net2(torch.relu(self.bn(self.net1(x))))


@pytest.mark.parametrize("kwargs", [
    dict(static_graph=True),
    dict(gradient_as_bucket_view=True, find_unused_parameters=True),
    dict(broadcast_buffers=False, find_unused_parameters=True),
    dict(find_unused_parameters=True, bucket_cap_mb=None),
], ids=["static_graph", "bucket_view", "no_buffer_broadcast", "bucket_cap_none"])
def test_constructor_options_match_torch(daemon, kwargs):
    """The options as the running torch's DDP takes them, side by side, with
    no_sync micro-steps between synced ones (not with static_graph)."""
    if "bucket_cap_mb" in kwargs and (
            inspect.signature(TorchDDP.__init__).parameters["bucket_cap_mb"].default is not None):
        pytest.skip("this torch's DDP takes no bucket_cap_mb=None")
    out = spawn(_options_worker, 2, (free_port(), daemon.socket, kwargs))
    for errs in out:
        assert len(errs) == STEPS and max(errs) <= TOL, errs


# --------------------------------------------------------- torch.compile
def _compile_worker(rank, port, sock, backend, no_sync_every, cap=0.001):
    clean_env({"GRADD_SOCKET": sock})
    init_gloo(rank, 2, port)
    import gradd.torch

    torch._dynamo.reset()
    model, twin = seeded(ToyModel, rank)
    ref = torch.compile(TorchDDP(model), backend=backend)
    # cap below 1 MiB: one graph; None (25 MiB): DDPOptimizer takes gradd's DDP.
    ours = torch.compile(gradd.torch.DistributedDataParallel(twin, bucket_cap_mb=cap),
                         backend=backend)
    errs = _train_pair(ref, ours, rank, steps=5, no_sync_every=no_sync_every)
    ddp = ref_ddp(ours)
    out = {"errs": errs, "iterations": ddp.num_iterations, "sum": checksum(ddp.module)}
    ddp.shutdown()
    dist.destroy_process_group()
    return out


def _can_compile(backend):
    if not hasattr(torch, "compile"):
        return False
    if backend == "inductor":
        import shutil

        return shutil.which("gcc") is not None or shutil.which("cc") is not None
    return True


@pytest.mark.parametrize("no_sync_every", [0, 2])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_ddp_matches_compiled_torch_ddp(daemon, backend, no_sync_every):
    """torch.compile(gradd DDP) trains to the values of torch.compile(torch
    DDP): dynamo compiles the wrapped module (gradd's package runs eagerly,
    as torch's DDP module does) and the gradients reach gradd's hooks."""
    if not _can_compile(backend):
        pytest.skip(f"torch.compile with {backend} is not available here")
    out = spawn(_compile_worker, 2, (free_port(), daemon.socket, backend, no_sync_every),
                timeout=300)
    for r in out:
        assert len(r["errs"]) == 5 and max(r["errs"]) <= TOL, r["errs"]
        assert r["iterations"] == 5, r  # synced forwards only, as torch counts
    assert out[0]["sum"] == out[1]["sum"]


def test_compiled_ddp_with_ddp_optimizer_matches_torch(daemon):
    """The default bucket cap: dynamo's DDPOptimizer is offered gradd's DDP
    (bucket_bytes_cap) and the values still match."""
    if not _can_compile("aot_eager"):
        pytest.skip("torch.compile is not available here")
    if "bucket_cap_mb" in inspect.signature(TorchDDP.__init__).parameters and (
            inspect.signature(TorchDDP.__init__).parameters["bucket_cap_mb"].default is not None):
        pytest.skip("this torch's DDP takes no bucket_cap_mb=None")
    out = spawn(_compile_worker, 2, (free_port(), daemon.socket, "aot_eager", 2, None),
                timeout=300)
    for r in out:
        assert len(r["errs"]) == 5 and max(r["errs"]) <= TOL, r["errs"]
    assert out[0]["sum"] == out[1]["sum"]


# ------------------------------------------------- optimizer overlap hooks
def _fused_optim_worker(rank, port, sock):
    clean_env({"GRADD_SOCKET": sock})
    init_gloo(rank, 2, port)
    import gradd.torch

    model, twin = seeded(ToyModel, rank)
    ref = TorchDDP(model)
    ours = gradd.torch.DistributedDataParallel(twin)
    try:
        ref._register_fused_optim(torch.optim.SGD, lr=0.05)
    except Exception as e:  # torch 1.13's imports FSDP, broken on Python 3.11
        ours.shutdown()
        dist.destroy_process_group()
        return {"skip": f"torch's own _register_fused_optim fails here: {e!r}"}
    ours._register_fused_optim(torch.optim.SGD, lr=0.05)
    errs = []
    for step in range(STEPS):
        x, y = data(step, rank)
        for ddp in (ref, ours):
            nn.functional.mse_loss(ddp(x), y).backward()  # the step runs in backward
        errs.append(max_err(ref.module, ours.module, grads=False))
    ours.shutdown()
    dist.destroy_process_group()
    return {"errs": errs, "moved": checksum(ours.module) != checksum(seeded(ToyModel, 0)[0])}


def test_register_fused_optim_matches_torch(daemon):
    out = spawn(_fused_optim_worker, 2, (free_port(), daemon.socket))
    if "skip" in out[0]:
        pytest.skip(out[0]["skip"])
    for r in out:
        assert max(r["errs"]) <= TOL and r["moved"], r


def _in_backward_worker(rank, port, sock):
    clean_env({"GRADD_SOCKET": sock})
    init_gloo(rank, 2, port)
    import gradd.torch
    from torch.distributed.optim import _apply_optimizer_in_backward

    # The reference: torch's DDP and plain SGD after backward (the same
    # values; torch's DDP with optimizers in backward needs an accelerator
    # stream, which a CPU-only torch 2.6 refuses).
    model, twin = seeded(ToyModel, rank)
    _apply_optimizer_in_backward(torch.optim.SGD, twin.parameters(), {"lr": 0.05})
    ref = TorchDDP(model)
    opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    ours = gradd.torch.DistributedDataParallel(twin)
    errs, grads_none = [], True
    for step in range(STEPS):
        x, y = data(step, rank)
        opt.zero_grad()
        nn.functional.mse_loss(ref(x), y).backward()
        opt.step()
        nn.functional.mse_loss(ours(x), y).backward()  # steps in backward
        errs.append(max_err(ref.module, ours.module, grads=False))
        grads_none = grads_none and all(p.grad is None for p in ours.module.parameters())
    ours.shutdown()
    dist.destroy_process_group()
    return {"errs": errs, "grads_none": grads_none}


@pytest.mark.skipif(not _has("distributed.optim._apply_optimizer_in_backward"),
                    reason="this torch has no _apply_optimizer_in_backward")
def test_apply_optimizer_in_backward_matches_torch(daemon):
    """The optimizer steps on the averaged gradient (not the local one) and
    the gradients are None afterwards, as under torch's DDP."""
    out = spawn(_in_backward_worker, 2, (free_port(), daemon.socket))
    for r in out:
        assert max(r["errs"]) <= TOL and r["grads_none"], r


def test_signature_covers_torch_ddp():
    """Every argument of the running torch's DDP constructor is one of
    gradd's (gradd refuses by name those it does not support)."""
    import gradd.torch

    ours = inspect.signature(gradd.torch.DistributedDataParallel.__init__).parameters
    theirs = inspect.signature(TorchDDP.__init__).parameters
    missing = [n for n in theirs if n not in ours]
    assert not missing, missing
    # Positional order agrees where torch's arguments are positional.
    ours_pos = [n for n, p in ours.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
    theirs_pos = [n for n, p in theirs.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert ours_pos[:len(theirs_pos)] == theirs_pos


def test_tcp_store_works_without_use_libuv_set(monkeypatch):
    """gradd's own TCPStore client (torchrun's agent store, gradd/_world.py)
    works whether or not this torch has libuv and whatever USE_LIBUV says
    (Debian's torch 2.6 has none; a plain TCPStore there fails unless given
    use_libuv=False)."""
    import datetime

    from gradd import _torch_compat as compat

    for value in (None, "1", "0"):
        if value is None:
            monkeypatch.delenv("USE_LIBUV", raising=False)
        else:
            monkeypatch.setenv("USE_LIBUV", value)
        timeout = datetime.timedelta(seconds=10)
        server = compat.tcp_store("127.0.0.1", 0, world_size=1, is_master=True,
                                  timeout=timeout)
        client = compat.tcp_store("127.0.0.1", server.port, is_master=False, timeout=timeout)
        assert client.compare_set("k", "", "v") in (b"v", "v")
        assert server.get("k") == b"v"
