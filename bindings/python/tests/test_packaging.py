"""`pip install .` as a new user runs it: from a clean copy of the repository into a fresh virtual
environment (offline, Debian's setuptools and wheel), then imported from another folder with no
hint where the library is. `pip wheel .` gives a platform wheel that carries libringfeed.so and the
libraries it needs, and installs elsewhere."""
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

import ringfeed
from conftest import TESTDATA

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
WDS = os.path.join(TESTDATA, "webdataset", "WebDataset.jl-test-sample.tar")
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def _tools_present():
    probe = subprocess.run([PY, "-c", "import venv, ensurepip, setuptools, wheel"], capture_output=True)
    if probe.returncode or not shutil.which("git") or not shutil.which("cmake") or not shutil.which("pkg-config"):
        return False
    # The -dev packages a build from source needs (scripts/install-deps.sh installs them).
    return subprocess.run(["pkg-config", "--exists", "libjpeg", "libpng16", "libzstd", "libwebp", "libcurl"]).returncode == 0


pytestmark = pytest.mark.skipif(not _tools_present() or not os.path.isdir(os.path.join(ROOT, ".git")),
                                reason="needs git, cmake, pkg-config, venv, setuptools, wheel and the -dev packages")


def clean_copy(dest):
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


def venv(path):
    subprocess.run([PY, "-m", "venv", "--system-site-packages", str(path)], check=True)
    return str(path / "bin" / "python")


USE = f"""
import os, sys, ringfeed
assert ringfeed.__file__.startswith(sys.prefix), ringfeed.__file__
assert ringfeed.__version__ == ringfeed.version(), (ringfeed.__version__, ringfeed.version())
if os.path.exists({WDS!r}):
    with ringfeed.Loader({WDS!r}, batch_size=8, image_size=32, framework="numpy") as loader:
        assert next(loader)["image"].shape == (8, 32, 32, 3)
print("ok", ringfeed.version())
"""


def test_pip_install_from_a_clean_copy_then_import_elsewhere(tmp_path):
    src = clean_copy(tmp_path / "src")
    python = venv(tmp_path / "venv")
    env = env_without_hints()
    out = subprocess.run([python, "-m", "pip", "install", "--no-build-isolation", "--no-index", "-q", str(src)],
                         env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = subprocess.run([python, "-c", USE], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == f"ok {ringfeed.version()}", run.stdout + run.stderr


def test_pip_wheel_is_a_platform_wheel_carrying_its_libraries(tmp_path):
    src = clean_copy(tmp_path / "src")
    env = env_without_hints()
    out = subprocess.run([PY, "-m", "pip", "wheel", "--no-build-isolation", "--no-index", "--no-deps", "-q",
                          "-w", str(tmp_path / "dist"), str(src)], env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    (wheel,) = os.listdir(tmp_path / "dist")
    assert re.fullmatch(r"ringfeed-[0-9.]+-py3-none-linux_x86_64\.whl", wheel), wheel
    names = zipfile.ZipFile(tmp_path / "dist" / wheel).namelist()
    for needed in ("ringfeed/libringfeed.so", "ringfeed/deps/libjpeg.so.62", "ringfeed/deps/libpng16.so.16",
                   "ringfeed/deps/libzstd.so.1", "ringfeed/deps/libwebp.so.7"):
        assert needed in names, (needed, names)
    assert any(n.endswith(".dist-info/LICENSE") for n in names), names
    python = venv(tmp_path / "venv")
    out = subprocess.run([python, "-m", "pip", "install", "--no-index", "-q", str(tmp_path / "dist" / wheel)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    site_lib = subprocess.run([python, "-c", "import ringfeed, os; print(os.path.dirname(ringfeed.__file__))"],
                              cwd=tmp_path, env=env, capture_output=True, text=True).stdout.strip()
    dynamic = subprocess.run(["readelf", "-d", os.path.join(site_lib, "libringfeed.so")], capture_output=True,
                             text=True).stdout
    assert "$ORIGIN/deps" in dynamic, dynamic
    run = subprocess.run([python, "-c", USE], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == f"ok {ringfeed.version()}", run.stdout + run.stderr
