"""Builds the extension gradd._C for the `gradd` package (metadata:
pyproject.toml).

    /usr/bin/python3 -m build --wheel --no-isolation client/python
    /usr/bin/python3 -m pip install --no-build-isolation ./client/python

The extension is built by the project's CMake (target gradd_python) against
the interpreter running this script, in $GRADD_BUILD_DIR (default:
<repo>/build-python-pkg). A $GRADD_BUILD_DIR that is already configured is
used as it is (only the target is built), so a wheel can be made from an
existing build tree. The package gets _C*.so and libgradd_client.so.N (the
file named by the extension's DT_NEEDED) beside it; the extension's RUNPATH
is $ORIGIN only (client/python/CMakeLists.txt), nothing from the build tree. $GRADD_SOURCE_DIR: the repository
(default: two levels above this file), for building from a copy of this
directory. Needs what scripts/setup installs (cmake, ninja, pybind11-dev,
gRPC, ...).
"""
import glob
import os
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.environ.get("GRADD_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


def needed_client_library(extension):
    """The libgradd_client soname the extension links (readelf -d)."""
    out = subprocess.run(["readelf", "-d", extension], check=True,
                         capture_output=True, text=True).stdout
    m = re.search(r"\(NEEDED\).*\[(libgradd_client\.so[.0-9]*)\]", out)
    if not m:
        raise RuntimeError(f"{extension} does not link libgradd_client")
    return m.group(1)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.environ.get("GRADD_BUILD_DIR",
                                   os.path.join(REPO, "build-python-pkg"))
        if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            generator = ["-G", "Ninja"] if shutil.which("ninja") else []
            subprocess.check_call(
                ["cmake", "-S", REPO, "-B", build_dir, *generator,
                 "-DCMAKE_BUILD_TYPE=Release", "-DGRADD_BUILD_PYTHON=ON",
                 "-DGRADD_BUILD_TESTS=OFF", "-DGRADD_BUILD_BENCH=OFF",
                 f"-DPython3_EXECUTABLE={sys.executable}"])
        jobs = os.environ.get("GRADD_BUILD_JOBS", str(os.cpu_count() or 2))
        subprocess.check_call(["cmake", "--build", build_dir, "--target",
                               "gradd_python", "-j", jobs])
        built = glob.glob(os.path.join(build_dir, "client", "python", "gradd",
                                       "_C*.so"))
        if not built:
            raise RuntimeError(f"gradd._C was not built in {build_dir}")
        dest = os.path.dirname(self.get_ext_fullpath(ext.name))
        os.makedirs(dest, exist_ok=True)
        target = self.get_ext_fullpath(ext.name)
        shutil.copy2(built[0], target)
        soname = needed_client_library(built[0])
        lib = os.path.join(dest, soname)
        shutil.copy2(os.path.join(build_dir, "client", soname), lib,
                     follow_symlinks=True)


setup(
    ext_modules=[CMakeExtension("gradd._C")],
    cmdclass={"build_ext": CMakeBuild},
)
