"""Installing as a new user does, offline: from a clean copy of the repository, `pip install .`
into a plain `python3 -m venv` (no system site packages: no setuptools, wheel, numpy or torch
from Debian), and `make wheel`, which needs no pip at all, then the wheel installed elsewhere.
Either way ringfeed is then imported from another folder with no hint where the library is, and
reads a dataset."""
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

import ringfeed

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def _tools_present():
    probe = subprocess.run([PY, "-c", "import venv, ensurepip"], capture_output=True)
    if probe.returncode or not shutil.which("git") or not shutil.which("cmake") or not shutil.which("pkg-config"):
        return False
    # The -dev packages a build from source needs (scripts/install-deps.sh installs them).
    return subprocess.run(["pkg-config", "--exists", "libjpeg", "libpng16", "libzstd", "libwebp", "libcurl"]).returncode == 0


pytestmark = pytest.mark.skipif(not _tools_present() or not os.path.isdir(os.path.join(ROOT, ".git")),
                                reason="needs git, cmake, pkg-config, python3-venv and the -dev packages")


@pytest.fixture(scope="module")
def clean_copy(tmp_path_factory):
    dest = tmp_path_factory.mktemp("src")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for f in filter(None, files):
        src = os.path.join(ROOT, f)
        if os.path.isfile(src):
            os.makedirs(os.path.join(dest, os.path.dirname(f)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, f))
    return dest


def env_without_hints():
    env = {k: v for k, v in os.environ.items() if k not in ("RINGFEED_LIBRARY", "PYTHONPATH")}
    env["RINGFEED_CMAKE_ARGS"] = "-DDL_WITH_CUDA=OFF"  # CUDA is optional; the test builds faster without
    return env


def plain_venv(path):
    subprocess.run([PY, "-m", "venv", str(path)], check=True)
    python = str(path / "bin" / "python")
    bare = subprocess.run([python, "-c", "import numpy"], capture_output=True)
    assert bare.returncode != 0, "the venv sees the system's packages"
    return python


def use(synthetic):
    """What the installed package must do, with nothing but the standard library beside it."""
    return f"""
import os, sys, ringfeed
assert ringfeed.__file__.startswith(sys.prefix), ringfeed.__file__
assert ringfeed.__version__ == ringfeed.version(), (ringfeed.__version__, ringfeed.version())
with ringfeed.Loader({synthetic!r}, batch_size=8, image_size=32, workers=2) as loader:
    b = next(loader)
    assert type(b["image"]).__name__ == "DLPackTensor" and b["image"].shape == (8, 32, 32, 3)
print("ok", ringfeed.version())
"""


def test_make_wheel_needs_no_pip_and_carries_its_libraries(clean_copy, tmp_path, synthetic):
    env = env_without_hints()
    out = subprocess.run(["make", "-s", "wheel", "PYTHON=" + PY], cwd=clean_copy, env=env, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    (wheel,) = os.listdir(clean_copy / "dist")
    assert re.fullmatch(r"ringfeed-[0-9.]+-py3-none-linux_x86_64\.whl", wheel), wheel
    z = zipfile.ZipFile(clean_copy / "dist" / wheel)
    names = z.namelist()
    for needed in ("ringfeed/libringfeed.so", "ringfeed/deps/libjpeg.so.62", "ringfeed/deps/libpng16.so.16",
                   "ringfeed/deps/libzstd.so.1", "ringfeed/deps/libwebp.so.7", "ringfeed/_loader.py"):
        assert needed in names, (needed, names)
    assert any(n.endswith(".dist-info/LICENSE") for n in names) and any(n.endswith("/RECORD") for n in names)
    metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "Requires-External: libcurl" in metadata and "Requires-External: zlib" in metadata
    python = plain_venv(tmp_path / "venv")
    out = subprocess.run([python, "-m", "pip", "install", "--no-index", "-q", str(clean_copy / "dist" / wheel)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    site_lib = subprocess.run([python, "-c", "import ringfeed, os; print(os.path.dirname(ringfeed.__file__))"],
                              cwd=tmp_path, env=env, capture_output=True, text=True).stdout.strip()
    dynamic = subprocess.run(["readelf", "-d", os.path.join(site_lib, "libringfeed.so")], capture_output=True,
                             text=True).stdout
    assert "$ORIGIN/deps" in dynamic, dynamic
    run = subprocess.run([python, "-c", use(synthetic)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.stdout.strip() == f"ok {ringfeed.version()}", run.stdout + run.stderr


def test_pip_install_offline_in_a_plain_venv_then_import_elsewhere(clean_copy, tmp_path, synthetic):
    python = plain_venv(tmp_path / "venv")
    env = env_without_hints()
    out = subprocess.run([python, "-m", "pip", "install", "--no-index", "-q", str(clean_copy)], env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = subprocess.run([python, "-c", use(synthetic)], cwd=elsewhere, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.stdout.strip() == f"ok {ringfeed.version()}", run.stdout + run.stderr
