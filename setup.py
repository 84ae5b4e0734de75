"""Builds libringfeed.so with CMake and puts it, with the shared libraries it needs that a bare
Linux may lack (libjpeg, libpng, libzstd, liburing), inside the ringfeed package: the wheel runs
where the -dev packages are absent. Metadata lives in pyproject.toml.

RINGFEED_CMAKE_ARGS adds CMake arguments (e.g. -DDL_WITH_CUDA=OFF for a build without CUDA)."""
import glob
import os
import re
import shlex
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

try:
    from wheel.bdist_wheel import bdist_wheel
except ImportError:  # building without wheel: only `pip install` from a source tree
    bdist_wheel = None

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(HERE, "build-pip")


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        cmake_dir = os.path.join(BUILD, "cmake")
        args = ["cmake", "-S", HERE, "-B", cmake_dir, "-DCMAKE_BUILD_TYPE=Release", "-DDL_BUNDLE_DEPS=ON",
                "-DDL_BUILD_TESTS=OFF"] + shlex.split(os.environ.get("RINGFEED_CMAKE_ARGS", ""))
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", cmake_dir, "--target", "ringfeed", "-j", str(os.cpu_count() or 2)],
                       check=True)
        package = os.path.join(self.build_lib, "ringfeed")
        real = os.path.realpath(os.path.join(cmake_dir, "libringfeed.so"))
        shutil.copyfile(real, os.path.join(package, "libringfeed.so"))
        deps = os.path.join(package, "deps")
        os.makedirs(deps, exist_ok=True)
        for lib in glob.glob(os.path.join(cmake_dir, "deps", "*.so.*")):
            if re.search(r"\.so\.[0-9]+$", lib):  # the names the library asks for (its DT_NEEDED)
                shutil.copyfile(lib, os.path.join(deps, os.path.basename(lib)))


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True  # a platform wheel: it carries a compiled library


cmdclass = {"build_py": BuildWithLibrary}
if bdist_wheel:
    class PlatformWheel(bdist_wheel):
        """Any Python 3 (the binding is ctypes), this platform only."""

        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = PlatformWheel

setup(cmdclass=cmdclass, distclass=BinaryDistribution, options={"build": {"build_base": BUILD}})
