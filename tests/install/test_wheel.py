"""The Python package builds as a wheel (client/python/pyproject.toml,
without network: --no-isolation) whose extension and bundled client library
look nowhere but beside themselves ($ORIGIN), and which works installed
outside the build tree."""

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from daemon_util import Daemon

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("GRADD_BUILD_DIR", REPO / "build"))


def have_module(name):
    return subprocess.run([sys.executable, "-c", f"import {name}"],
                          capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    if not list((BUILD / "client/python/gradd").glob("_C*.so")):
        pytest.skip(f"gradd._C not built in {BUILD} (GRADD_BUILD_DIR)")
    if not have_module("build"):
        pytest.skip("python3-build not installed")
    tmp = tmp_path_factory.mktemp("wheel")
    # From a copy: setuptools writes build/ and *.egg-info next to setup.py.
    src = tmp / "src"
    shutil.copytree(REPO / "client/python", src,
                    ignore=shutil.ignore_patterns("__pycache__", "build",
                                                  "*.egg-info"))
    env = dict(os.environ, GRADD_BUILD_DIR=str(BUILD),
               GRADD_SOURCE_DIR=str(REPO))
    r = subprocess.run([sys.executable, "-m", "build", "--wheel",
                        "--no-isolation", "--outdir", str(tmp / "dist"),
                        str(src)], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    wheels = list((tmp / "dist").glob("gradd-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def dynamic_section(path):
    return subprocess.run(["readelf", "-d", str(path)], check=True,
                          capture_output=True, text=True).stdout


def test_wheel_has_extension_and_library_with_origin_runpath(wheel, tmp_path):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        z.extractall(tmp_path)
    ext = [n for n in names if re.fullmatch(r"gradd/_C\..*\.so", n)]
    libs = [n for n in names if re.fullmatch(r"gradd/libgradd_client\.so\.\d+", n)]
    assert len(ext) == 1 and len(libs) == 1, names
    assert "gradd/torch.py" in names
    ext_dyn = dynamic_section(tmp_path / ext[0])
    assert f"[{Path(libs[0]).name}]" in ext_dyn  # NEEDED the bundled soname
    for path in (ext[0], libs[0]):
        dyn = dynamic_section(tmp_path / path)
        paths = re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library r\w*path: \[(.*)\]", dyn)
        assert all(p == "$ORIGIN" for p in paths), f"{path}: {paths}"
        assert str(BUILD) not in dyn and "/work/" not in dyn


def test_installed_wheel_talks_to_a_daemon(wheel, tmp_path):
    if not have_module("pip"):
        pytest.skip("python3-pip not installed")
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps",
                        "--no-index", "--target", str(site), str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    daemon = Daemon(str(BUILD / "server/gradd"), str(tmp_path)).wait_ready()
    try:
        # One rank: the average of one gradient is itself.
        code = (
            "import gradd, sys\n"
            "assert gradd.__file__.startswith(sys.argv[1]), gradd.__file__\n"
            "c = gradd.attach([('w', (8,), 'float32')], socket=sys.argv[2],\n"
            "                 job_id='wheel')\n"
            "g = c.gradient(0)\n"
            "g[:] = 3.0\n"
            "c.mark_ready(0)\n"
            "c.wait_all()\n"
            "assert (c.gradient(0) == 3.0).all()\n"
            "print('trained with', gradd._C.__file__)\n")
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "LD_LIBRARY_PATH")}
        env["PYTHONPATH"] = str(site)
        r = subprocess.run([sys.executable, "-c", code, str(site),
                            daemon.socket_path],
                           capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"trained with {site}" in r.stdout
    finally:
        assert daemon.stop() == 0, daemon.log()
