"""Builds and installs the `gradd` Python package from the source tree.

    /usr/bin/python3 -m pip install --no-build-isolation ./client/python
    # or, without pip:  cd client/python && /usr/bin/python3 setup.py install --user

The extension (gradd._C) is built by the project's CMake (target
gradd_python) in $GRADD_BUILD_DIR (default: <repo>/build-python-pkg) against
the interpreter running this script; the package gets _C*.so plus
libgradd_client.so beside it (the extension's RPATH is $ORIGIN).
Needs what scripts/setup installs (cmake, ninja, pybind11-dev, gRPC, ...).
"""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.environ.get("GRADD_BUILD_DIR", os.path.join(REPO, "build-python-pkg"))
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        subprocess.check_call(
            ["cmake", "-S", REPO, "-B", build_dir, *generator,
             "-DCMAKE_BUILD_TYPE=Release", "-DGRADD_BUILD_PYTHON=ON",
             "-DGRADD_BUILD_TESTS=OFF", "-DGRADD_BUILD_BENCH=OFF",
             f"-DPython3_EXECUTABLE={sys.executable}"])
        jobs = os.environ.get("GRADD_BUILD_JOBS", str(os.cpu_count() or 2))
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "gradd_python",
                               "-j", jobs])
        built = glob.glob(os.path.join(build_dir, "client", "python", "gradd", "_C*.so"))
        if not built:
            raise RuntimeError(f"gradd._C was not built in {build_dir}")
        dest = os.path.dirname(self.get_ext_fullpath(ext.name))
        os.makedirs(dest, exist_ok=True)
        shutil.copy2(built[0], self.get_ext_fullpath(ext.name))
        for lib in glob.glob(os.path.join(build_dir, "client", "libgradd_client.so*")):
            shutil.copy2(lib, dest, follow_symlinks=True)


setup(
    name="gradd",
    version="0.1.0",
    description="Python client of the gradd gradient aggregation daemon, with a "
                "drop-in DistributedDataParallel for PyTorch",
    packages=["gradd"],
    ext_modules=[CMakeExtension("gradd._C")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
    install_requires=["numpy"],
    extras_require={"torch": ["torch>=1.13"]},
    zip_safe=False,
)
