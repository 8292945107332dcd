"""`cmake --install` into a fresh prefix, then a project outside the tree
builds against it (find_package(gradd) and pkg-config) and its programs
train one job together through a daemon started from the same prefix."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from daemon_util import Daemon

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("GRADD_BUILD_DIR", REPO / "build"))
CONSUMER = Path(__file__).resolve().parent / "consumer"


def project_version():
    text = (REPO / "CMakeLists.txt").read_text()
    return re.search(r"project\(gradd VERSION (\d+\.\d+\.\d+)", text).group(1)


def run(cmd, timeout=300, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       **kw)
    assert r.returncode == 0, f"{cmd}:\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    if not (BUILD / "CMakeCache.txt").exists():
        pytest.skip(f"no configured build tree at {BUILD} (GRADD_BUILD_DIR)")
    p = tmp_path_factory.mktemp("install") / "prefix"
    run(["cmake", "--install", str(BUILD), "--prefix", str(p)])
    return p


def libdir(prefix):
    dirs = [d for d in ("lib", "lib64", "lib/x86_64-linux-gnu")
            if (prefix / d / "libgradd_client.so").exists()]
    assert dirs, f"no libgradd_client.so under {prefix}"
    return prefix / dirs[0]


def test_installs_daemon_library_headers_and_packages(prefix):
    lib = libdir(prefix)
    major = project_version().split(".")[0]
    version = project_version()
    # libgradd_client.so -> .so.N -> .so.N.M.P, SONAME .so.N.
    assert os.readlink(lib / "libgradd_client.so") == f"libgradd_client.so.{major}"
    assert os.readlink(lib / f"libgradd_client.so.{major}") == \
        f"libgradd_client.so.{version}"
    dyn = run(["readelf", "-d", str(lib / f"libgradd_client.so.{version}")]).stdout
    assert f"[libgradd_client.so.{major}]" in dyn
    assert str(BUILD) not in dyn  # no RUNPATH into the build tree
    # graddctl too once the build has it (tools/graddctl, the admin CLI).
    built_ctl = [p for p in BUILD.rglob("graddctl")
                 if p.is_file() and os.access(p, os.X_OK)]
    for exe in ["gradd"] + (["graddctl"] if built_ctl else []):
        assert os.access(prefix / "bin" / exe, os.X_OK), exe
        dyn = run(["readelf", "-d", str(prefix / "bin" / exe)]).stdout
        assert str(BUILD) not in dyn, f"{exe} has a RUNPATH into the build tree"
    assert (lib / "cmake/gradd/gradd-config.cmake").exists()
    assert (lib / "pkgconfig/gradd.pc").exists()
    unit = (prefix / "lib/systemd/system/gradd.service").read_text()
    assert f"ExecStart={prefix}/bin/gradd " in unit
    assert (prefix / "share/gradd/gradd.yaml").exists()


def test_public_headers_include_only_public_names(prefix):
    """The installed headers need std, Abseil's status and each other --
    nothing from gradd's tree (common/, server/, generated protobuf)."""
    headers = sorted((prefix / "include/gradd").glob("*.h"))
    assert {h.name for h in headers} == {"client.h", "collectives.h", "gradd.h", "version.h"}
    for h in headers:
        for inc in re.findall(r'#include\s+[<"]([^>"]+)[>"]', h.read_text()):
            assert inc.startswith(("gradd/", "absl/status/")) or "/" not in inc, \
                f"{h.name} includes {inc}"
    # The README's example names only public things.
    readme = (REPO / "README.md").read_text()
    example = readme.split('#include "gradd/client.h"')[1].split("```")[0]
    for internal in ("RETURN_IF_ERROR", "ASSIGN_OR_RETURN", "DType::"):
        assert internal not in example
    assert "gradd::dtype::kFloat32" in example


def test_gradd_help_and_version(prefix):
    gradd = str(prefix / "bin/gradd")
    r = run([gradd, "--version"])
    assert r.stdout.strip() == f"gradd {project_version()}"
    r = run([gradd, "--help"])
    flags = re.findall(r"ABSL_FLAG\(\s*[\w:]+,\s*(\w+)",
                       (REPO / "server/main.cc").read_text())
    assert len(flags) >= 8
    for flag in flags:
        assert f"--{flag.replace('_', '-')}" in r.stdout, flag
    assert "Usage: gradd" in r.stdout


@pytest.fixture(scope="module")
def consumers(prefix, tmp_path_factory):
    """Each consumer built twice: with CMake (find_package) and with
    pkg-config; {("cmake"|"pkgconfig", "cpp"|"c"): path}."""
    out = tmp_path_factory.mktemp("consumer")
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    run(["cmake", "-S", str(CONSUMER), "-B", str(out / "cmake"), *gen,
         f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_BUILD_TYPE=Release"])
    run(["cmake", "--build", str(out / "cmake")])
    env = dict(os.environ, PKG_CONFIG_PATH=str(libdir(prefix) / "pkgconfig"))
    flags = run(["pkg-config", "--cflags", "--libs", "gradd"], env=env).stdout.split()
    rpath = f"-Wl,-rpath,{libdir(prefix)}"
    (out / "pc").mkdir()
    run(["c++", "-std=c++17", "-O1", str(CONSUMER / "consumer.cc"), "-o",
         str(out / "pc/consumer_cpp"), *flags, rpath])
    run(["cc", "-std=c99", "-O1", str(CONSUMER / "consumer.c"), "-o",
         str(out / "pc/consumer_c"), *flags, rpath])
    return {("cmake", "cpp"): out / "cmake/consumer_cpp",
            ("cmake", "c"): out / "cmake/consumer_c",
            ("pkgconfig", "cpp"): out / "pc/consumer_cpp",
            ("pkgconfig", "c"): out / "pc/consumer_c"}


def run_job(daemon, job, programs):
    procs = [subprocess.Popen([str(p), daemon.socket_path, job, str(r),
                               str(len(programs))],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
             for r, p in enumerate(programs)]
    outs = []
    for p in procs:
        try:
            outs.append((p.wait(60), p.stdout.read()))
        except subprocess.TimeoutExpired:
            p.kill()
            outs.append((None, p.stdout.read()))
    return outs


def test_consumers_train_against_the_installed_daemon(prefix, consumers, tmp_path):
    daemon = Daemon(str(prefix / "bin/gradd"), str(tmp_path)).wait_ready()
    try:
        # A C++ rank (CMake-built) and a C rank (pkg-config-built) in one job,
        # then the other pairing.
        for job, pair in (("a", [("cmake", "cpp"), ("pkgconfig", "c")]),
                          ("b", [("pkgconfig", "cpp"), ("cmake", "c")])):
            for code, out in run_job(daemon, job, [consumers[k] for k in pair]):
                assert code == 0, f"job {job}: {out}\n{daemon.log()}"
                assert "OK (gradd " + project_version() + ")" in out
    finally:
        assert daemon.stop() == 0, daemon.log()


def test_consumer_without_daemon_says_so(consumers, tmp_path):
    sock = str(tmp_path / "nothing-here.sock")
    for kind in ("cpp", "c"):
        r = subprocess.run([str(consumers[("cmake", kind)]), sock, "j", "0", "1"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1
        assert "UNAVAILABLE" in r.stderr, r.stderr
        assert f"no gradd daemon at {sock}" in r.stderr, r.stderr
