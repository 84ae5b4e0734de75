import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..")))
TESTDATA = os.environ.get("DL_TESTDATA") or os.path.abspath(
    os.path.join(HERE, "..", "..", "..", "..", "shared", "testdata"))
# Why a test that reads the third-party corpora is skipped (make test's summary counts them).
NO_TESTDATA = "third-party corpora not found (run make testdata)"
BUILD = os.path.dirname(os.environ.get("DL_DLSHARD") or os.environ.get("RINGFEED_LIBRARY", ""))
DLBENCH, DLSHARD = os.path.join(BUILD, "dlbench"), os.path.join(BUILD, "dlshard")


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory):
    """dlbench's built-in synthetic set, small: ImageNet-like JPEGs in WebDataset shards, made by
    the tools, so tests of the binding need no third-party data. Its source pattern."""
    if not os.path.exists(DLBENCH):
        pytest.skip("dlbench is not built")
    cache = tmp_path_factory.mktemp("synthetic")
    out = subprocess.run([DLBENCH, "--synthetic", "120", "--make-synthetic"], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, XDG_CACHE_HOME=str(cache)))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]
