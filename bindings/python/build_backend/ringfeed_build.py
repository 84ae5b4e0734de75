"""ringfeed's build backend (PEP 517), with the standard library alone: `pip install .` needs no
setuptools and no wheel package, so it works offline in a plain `python3 -m venv`.

build_wheel builds libringfeed.so with CMake (the -dev packages installed: `make deps`), copies
the shared libraries a machine without them may lack (libjpeg, libpng, libzstd, libwebp, liburing)
into the package's deps/ (the library finds them through $ORIGIN/deps), and writes a
py3-none-<platform> wheel: the binding is ctypes, so one wheel serves every Python from 3.9.
libcurl, libbz2 and zlib come from the system (every Linux has them; the METADATA says so).
RINGFEED_CMAKE_ARGS adds CMake arguments (-DDL_WITH_CUDA=OFF builds without the GPU stage)."""
import base64
import hashlib
import io
import os
import re
import shlex
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PACKAGE = os.path.join(ROOT, "bindings", "python", "ringfeed")
BUILD = os.path.join(ROOT, "build-pip")
NAME = "ringfeed"
# What the system must give the library: read by pip as the wheel's external requirements.
SYSTEM_LIBRARIES = ["libcurl (libcurl.so.4: Debian and Ubuntu libcurl4)", "libbz2 (libbz2.so.1.0)",
                    "zlib (libz.so.1)"]


def _version():
    text = open(os.path.join(PACKAGE, "__init__.py"), encoding="utf-8").read()
    return re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)


def _metadata():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {NAME}",
        f"Version: {_version()}",
        "Summary: A data loader that keeps GPUs fed: io_uring reads, JPEG/PNG decode into pinned memory, CUDA copies",
        "License: MIT",
        "Requires-Python: >=3.9",
        "Classifier: License :: OSI Approved :: MIT License",
        "Classifier: Operating System :: POSIX :: Linux",
        "Classifier: Programming Language :: C",
        "Classifier: Programming Language :: Python :: 3",
        "Classifier: Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Provides-Extra: numpy",
        "Requires-Dist: numpy; extra == \"numpy\"",
        "Provides-Extra: torch",
        "Requires-Dist: torch; extra == \"torch\"",
    ]
    lines += [f"Requires-External: {lib}" for lib in SYSTEM_LIBRARIES]
    lines += ["Description-Content-Type: text/markdown", "", readme]
    return "\n".join(lines)


def _say(text):
    print(f"ringfeed: {text}", file=sys.stderr, flush=True)


def _build_library():
    """libringfeed.so and the libraries to carry beside it, built in build-pip/."""
    cmake_dir = os.path.join(BUILD, "cmake")
    args = ["cmake", "-S", ROOT, "-B", cmake_dir, "-DCMAKE_BUILD_TYPE=Release", "-DDL_BUNDLE_DEPS=ON",
            "-DDL_BUILD_TESTS=OFF"] + shlex.split(os.environ.get("RINGFEED_CMAKE_ARGS", ""))
    _say("building libringfeed.so with CMake (a minute or three; pip install -v . shows the compiler)")
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", cmake_dir, "--target", "ringfeed", "-j", str(os.cpu_count() or 2)],
                   check=True)
    library = os.path.realpath(os.path.join(cmake_dir, "libringfeed.so"))
    deps = sorted(os.path.join(cmake_dir, "deps", f) for f in os.listdir(os.path.join(cmake_dir, "deps"))
                  if re.search(r"\.so\.[0-9]+$", f))  # the names the library asks for (its DT_NEEDED)
    return library, deps


def _tag():
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"py3-none-{platform}"


class _Wheel:
    """A wheel being written: each file hashed into RECORD as it goes in."""

    def __init__(self, path, dist_info):
        self.zip = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED)
        self.dist_info = dist_info
        self.record = []

    def add(self, name, data, mode=0o644):
        info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
        info.external_attr = (0o100000 | mode) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zip.writestr(info, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        self.record.append(f"{name},sha256={digest},{len(data)}")

    def close(self):
        record = f"{self.dist_info}/RECORD"
        self.zip.writestr(record, "\n".join(self.record + [f"{record},,"]) + "\n")
        self.zip.close()


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    dist_info = f"{NAME}-{_version()}.dist-info"
    os.makedirs(os.path.join(metadata_directory, dist_info), exist_ok=True)
    with open(os.path.join(metadata_directory, dist_info, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata())
    return dist_info


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    library, deps = _build_library()
    version = _version()
    dist_info = f"{NAME}-{version}.dist-info"
    filename = f"{NAME}-{version}-{_tag()}.whl"
    wheel = _Wheel(os.path.join(wheel_directory, filename), dist_info)
    for name in sorted(os.listdir(PACKAGE)):
        if name.endswith(".py"):
            wheel.add(f"{NAME}/{name}", open(os.path.join(PACKAGE, name), "rb").read())
    wheel.add(f"{NAME}/libringfeed.so", open(library, "rb").read(), 0o755)
    for dep in deps:
        wheel.add(f"{NAME}/deps/{os.path.basename(dep)}", open(dep, "rb").read(), 0o755)
    wheel.add(f"{dist_info}/METADATA", _metadata().encode())
    wheel.add(f"{dist_info}/WHEEL", (f"Wheel-Version: 1.0\nGenerator: ringfeed_build\nRoot-Is-Purelib: false\n"
                                     f"Tag: {_tag()}\n").encode())
    wheel.add(f"{dist_info}/LICENSE", open(os.path.join(ROOT, "LICENSE"), "rb").read())
    wheel.add(f"{dist_info}/top_level.txt", f"{NAME}\n".encode())
    wheel.close()
    _say(f"wrote {filename}")
    return filename


def build_sdist(sdist_directory, config_settings=None):
    """The source as git tracks it (or, outside a checkout, the tree without its build folders)."""
    try:
        files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
        names = [f for f in files.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        names = []
        for top, dirs, found in os.walk(ROOT):
            dirs[:] = [d for d in dirs if not d.startswith((".", "build", "dist"))]
            names += [os.path.relpath(os.path.join(top, f), ROOT) for f in found]
    base = f"{NAME}-{_version()}"
    filename = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, filename), "w:gz") as tar:
        for name in sorted(names):
            tar.add(os.path.join(ROOT, name), f"{base}/{name}", recursive=False)
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = _metadata().encode()
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return filename


if __name__ == "__main__":  # `make wheel`: the wheel into dist/ with no pip at all
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "dist")
    os.makedirs(out, exist_ok=True)
    print(os.path.join(out, build_wheel(out)))
