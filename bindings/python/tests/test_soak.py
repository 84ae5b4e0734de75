"""A short soak in make test (`make soak` runs the long one): flat memory, descriptors, threads,
objects and pinned bytes over epochs and over Loaders opened in turn."""
import os

import pytest

from conftest import TESTDATA
from soak import soak

WDS = os.path.join(TESTDATA, "webdataset", "WebDataset.jl-test-sample.tar")
needs_testdata = pytest.mark.skipif(not os.path.exists(WDS), reason="third-party test data absent")


@needs_testdata
def test_short_soak_numpy():
    pytest.importorskip("numpy")
    soak(WDS, 6, "numpy", log=lambda line: None)


@needs_testdata
def test_short_soak_torch():
    pytest.importorskip("torch")
    soak(WDS, 6, "torch", log=lambda line: None)
