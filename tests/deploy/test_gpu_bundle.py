"""scripts/gpu-check --pack: the bundle that carries the GPU verification to
a machine without -dev packages. Packs from this build (a CUDA one; skipped
otherwise) and checks that every binary the check runs and every Python
module the bundled GPU tests import is inside, and that the bundle's own
gpu-check starts here (on a machine without a GPU it says so and exits 0).
"""
import ast
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("GRADD_BUILD_DIR", REPO / "build"))


def cache_entries():
    try:
        text = (BUILD / "CMakeCache.txt").read_text()
    except OSError:
        return {}
    entries = {}
    for line in text.splitlines():
        if "=" in line and ":" in line.split("=", 1)[0] and not line.startswith(("//", "#")):
            key, value = line.split("=", 1)
            entries[key.split(":", 1)[0]] = value
    return entries


def skip_reason():
    cache = cache_entries()
    if not cache or not (BUILD / "tests" / "device_reduce_gpu_test").exists():
        return f"{BUILD} is not a CUDA build (GRADD_WITH_CUDA found no toolkit)"
    # The bundle carries the Release build to the GPU machine: a sanitizer
    # build (scripts/test --sanitize) has no benchmarks and is not shipped.
    if cache.get("GRADD_SANITIZE"):
        return f"{BUILD} is a sanitizer build ({cache['GRADD_SANITIZE']}); bundles pack Release builds"
    if cache.get("GRADD_BUILD_BENCH", "ON").upper() in ("OFF", "0", "FALSE", "NO"):
        return f"{BUILD} has no benchmarks (GRADD_BUILD_BENCH=OFF); the bundle needs gradd-bench"
    return None


pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("pack") / "gpu-bundle"
    env = dict(os.environ, GRADD_BUILD_DIR=str(BUILD), GRADD_JOBS="2")
    r = subprocess.run([str(REPO / "scripts" / "gpu-check"), "--pack", str(out)],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    return out


def test_bundle_holds_every_binary(bundle):
    for name in ("gradd", "gradd-bench", "gradd_test_trainer", "device_reduce_gpu_test",
                 "gpu_device_test", "driver_test", "gradd-with-libs"):
        assert os.access(bundle / "bin" / name, os.X_OK), name
    assert (bundle / "lib" / "libgradd_client.so").exists()
    assert (bundle.parent / "gpu-bundle.tar.gz").exists()


def local_imports(path, available):
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return {n for n in names if n in available}


def test_bundled_python_tests_import_only_what_is_bundled(bundle):
    src = REPO / "tests" / "python"
    ours = {p.stem for p in src.glob("*.py")}  # the suite's own modules
    packed = bundle / "tests" / "python"
    have = {p.stem for p in packed.glob("*.py")}
    assert {"test_cuda_ddp", "test_cuda_staged"} <= have
    # The workers the tests spawn by file name, and what they import.
    for f in packed.glob("*.py"):
        text = f.read_text()
        for worker in ours:
            if f'"{worker}.py"' in text:
                assert worker in have, f"{f.name} runs {worker}.py, not in the bundle"
        missing = local_imports(f, ours) - have
        assert not missing, f"{f.name} imports {sorted(missing)}, not in the bundle"
    assert (bundle / "python" / "gradd" / "torch.py").exists()


def test_bundle_check_starts_here(bundle):
    r = subprocess.run([str(bundle / "gpu-check")], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, GPU_CHECK_SKIP_PYTHON="1"))
    assert "gradd --print-config" in r.stdout and "ok" in r.stdout, r.stdout + r.stderr
    if "GPU                                none: skipped" in r.stdout:
        assert r.returncode == 0
