"""torch.distributed's backend "gradd" (gradd/distributed.py + gradd._c10d):
init_process_group("gradd"), every collective, subgroups, errors, and torch's
own unmodified DistributedDataParallel over it against DDP over Gloo. Real
daemons, ranks as real processes (backend_worker.py).

The same tests run under torch 1.13 (Debian 12) and torch 2.x (Debian 13's
2.6: the ProcessGroup / Backend split, the _into_tensor and coalesced
collectives); what a torch lacks is skipped by feature inside the worker
(it prints SKIP), never by version here."""
import os
import re
import subprocess
import sys

import pytest

from conftest import run_workers

# python3-torch (scripts/setup installs it): without it the module fails.
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def _backend_available():
    try:
        import gradd.distributed as gd
    except ImportError:
        return False
    return gd.available()


pytestmark = pytest.mark.skipif(
    not _backend_available(),
    reason="gradd._c10d not built (libtorch-dev missing): the torch.distributed backend is off",
)


@pytest.fixture(scope="module")
def collectives_work(daemon, tmp_path_factory):
    """Fails the calling test, saying so, when this build's daemon or client
    does not run collectives (UNIMPLEMENTED), as on any other failure."""
    init = tmp_path_factory.mktemp("probe") / "init"
    code = (
        "import gradd.distributed, torch, torch.distributed as dist\n"
        f"dist.init_process_group('gradd', init_method='file://{init}', rank=0, world_size=1)\n"
        "t = torch.ones(3)\n"
        "try:\n"
        "    dist.all_reduce(t)\n"
        "except RuntimeError as e:\n"
        "    print('ERR', e)\n"
        "else:\n"
        "    print('OK', t.tolist())\n"
    )
    env = dict(os.environ, GRADD_SOCKET=daemon.socket, RANK="0", WORLD_SIZE="1",
               LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=env)
    if "UNIMPLEMENTED" in p.stdout or "is not supported by this client" in p.stdout:
        pytest.fail(f"daemon collectives missing: {p.stdout.strip()}", pytrace=False)
    assert p.returncode == 0 and "OK [1.0, 1.0, 1.0]" in p.stdout, p.stdout + p.stderr


def _run(mode, world, daemon, tmp_path, rank_env=None, logs=None, timeout=240, extra=None):
    env = {"GRADD_SOCKET": daemon.socket} if daemon is not None else {}
    env.update(extra or {})
    outs = run_workers("backend_worker.py", world, [mode, str(tmp_path / "init")], env,
                       timeout=timeout, rank_env=rank_env, logs=logs)
    for rank, out in enumerate(outs):
        if mode != "mismatch":
            assert f"OK {mode}" in out, f"rank {rank}: {out}"
    return outs


def test_registered():
    """Importing gradd.distributed registers "gradd" with torch.distributed."""
    code = ("import gradd.distributed, torch.distributed as dist;"
            "print(dist.Backend('gradd'), 'GRADD' in dist.Backend._plugins)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.split() == ["gradd", "True"]


def test_init_without_daemon_fails_clearly(tmp_path):
    """No daemon on the socket: init_process_group raises naming the socket."""
    sock = tmp_path / "none.sock"
    code = (
        "import datetime, gradd.distributed, torch.distributed as dist\n"
        "try:\n"
        f"    dist.init_process_group('gradd', init_method='file://{tmp_path}/init', rank=0,"
        " world_size=1, timeout=datetime.timedelta(seconds=5))\n"
        "except RuntimeError as e:\n"
        "    print('ERR', e)\n"
    )
    env = dict(os.environ, GRADD_SOCKET=str(sock))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env).stdout
    assert out.startswith("ERR"), out
    assert "gradd backend" in out and str(sock) in out, out


@pytest.mark.parametrize("world", [2, 3])
def test_collectives(collectives_work, daemon, tmp_path, world):
    _run("collectives", world, daemon, tmp_path)


def test_all_reduce_for_logging(collectives_work, daemon, tmp_path):
    _run("logging", 2, daemon, tmp_path)


def test_subgroup(collectives_work, daemon, tmp_path):
    _run("subgroup", 3, daemon, tmp_path)


def test_mismatched_call_is_an_error_not_a_hang(collectives_work, daemon, tmp_path):
    outs = _run("mismatch", 2, daemon, tmp_path, timeout=180)
    for rank, out in enumerate(outs):
        m = re.search(r"^ERROR ([0-9.]+)s (.*)$", out, re.M)
        assert m, f"rank {rank} got no error: {out}"
        assert "allreduce" in m.group(2).lower(), m.group(2)


@pytest.mark.parametrize("world", [2, 3])
def test_torch_ddp_over_gradd_matches_gloo(collectives_work, daemon, tmp_path, world):
    outs = _run("ddp", world, daemon, tmp_path)
    for out in outs:
        assert "WORST" in out


def test_two_nodes_collectives_and_ddp(collectives_work, two_daemons, tmp_path):
    """Two daemons on loopback (one rank each): the daemons reduce between
    nodes; the collectives and torch's DDP still match."""
    for mode in ("logging", "ddp"):
        d = tmp_path / mode
        d.mkdir()
        _run(mode, 2, None, d, rank_env=lambda r: two_daemons.rank_env(r, 1),
             logs=two_daemons.logs)


@pytest.mark.parametrize("world", [2, 3])
def test_into_tensor_collectives(collectives_work, daemon, tmp_path, world):
    """all_gather_into_tensor / reduce_scatter_tensor: flat and stacked
    forms, MAX, async, a non-contiguous output, a wrong size refused."""
    _run("into_tensor", world, daemon, tmp_path)


def test_coalesced_collectives(collectives_work, daemon, tmp_path):
    """all_reduce_coalesced, all_gather_coalesced and (torch 2.x) the
    _coalescing_manager's allreduce / allgather_into_tensor /
    reduce_scatter_tensor coalesced paths, sync and async."""
    outs = _run("coalesced", 3, daemon, tmp_path)
    if getattr(dist, "_coalescing_manager", None) is not None and \
            "async_ops" in __import__("inspect").signature(dist._coalescing_manager).parameters:
        for out in outs:
            assert "COALESCING_MANAGER ok" in out, out


def test_group_objects(collectives_work, daemon, tmp_path):
    """get_backend, group size / rank, new_group(backend="gradd"); on torch
    2.x gradd's Backend sits under torch's ProcessGroup for "cpu"."""
    outs = _run("split", 3, daemon, tmp_path)
    kind = "backend" if hasattr(dist.ProcessGroup, "_get_backend") else "process_group"
    for out in outs:
        assert f"SPLIT {kind}" in out, out


def test_unsupported_operations_raise(collectives_work, daemon, tmp_path):
    """send/recv, batch_isend_irecv, all_to_all(_single), non-CPU and sparse
    tensors: a RuntimeError naming the operation, no crash, the group still
    works."""
    outs = _run("unsupported", 2, daemon, tmp_path)
    for out in outs:
        assert out.count("REFUSED") >= 9, out


def test_other_torch_refused_at_import(tmp_path):
    """An extension built for another torch refuses to import instead of
    crashing; init_process_group then raises naming both versions.

    The pretended version is one gradd supports (gradd._torch_compat lets it
    through) but not the one the extension was built against, so the refusal
    seen is the extension's own. A torch outside gradd's range never gets
    that far: `import gradd.distributed` raises ImportError naming it
    (test_torch2.py::test_import_refuses_an_unsupported_torch)."""
    import torch
    other = "2.5.0" if not torch.__version__.startswith("2.5") else "2.4.0"
    code = (
        "import torch\n"
        f"torch.__version__ = '{other}'\n"
        "import gradd.distributed as gd, torch.distributed as dist\n"
        "print('AVAILABLE', gd.available())\n"
        "print('REASON', gd.unavailable_reason())\n"
        "try:\n"
        f"    dist.init_process_group('gradd', init_method='file://{tmp_path}/init', rank=0,"
        " world_size=1)\n"
        "except RuntimeError as e:\n"
        "    print('ERR', e)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "AVAILABLE False" in p.stdout, p.stdout
    assert f"but torch {other} is running" in p.stdout, p.stdout
    assert "ERR gradd backend unavailable" in p.stdout, p.stdout
