"""Several ranks as separate processes, as torchrun starts them (RANK/WORLD_SIZE from the
environment), sharing this machine: equal batch counts, disjoint shares that cover the epoch, and
a resume at another number of ranks that neither loses nor repeats a sample."""

import json
import os
import subprocess
import sys

import pytest

from conftest import TESTDATA

WDS = os.path.join(TESTDATA, "webdataset", "WebDataset.jl-test-sample.tar")
pytestmark = pytest.mark.skipif(not os.path.exists(WDS), reason="third-party test data absent")

RANK_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import ringfeed
stop, state = int(sys.argv[2]), (json.loads(sys.argv[3]) if sys.argv[3] != "-" else None)
loader = ringfeed.Loader(sys.argv[4], batch_size=5, image_size=8, workers=1, seed=11,
                         framework="dlpack", state=state)
keys, batches = [], 0
for b in loader:
    keys += b["key"]
    batches += 1
    if batches == stop:
        break
print(json.dumps({"keys": keys, "batches": batches, "per_epoch": len(loader),
                  "state": loader.state_dict()}))
"""


def run_ranks(world, stop=-1, state=None):
    binding = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0")
        procs.append(subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT, binding, str(stop), json.dumps(state) if state else "-", WDS],
            env=env, stdout=subprocess.PIPE, text=True))
    out = []
    for p in procs:
        text, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        out.append(json.loads(text))
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_split_each_epoch_evenly_and_disjointly(world):
    ranks = run_ranks(world)
    assert len({r["batches"] for r in ranks}) == 1
    assert len({r["per_epoch"] for r in ranks}) == 1
    keys = [k for r in ranks for k in r["keys"]]
    assert len(keys) == len(set(keys)) == 90 - 90 % world


def test_resume_at_another_number_of_ranks():
    first = run_ranks(4, stop=2)
    done = [k for r in first for k in r["keys"]]
    assert len(done) == 4 * 2 * 5
    rest = run_ranks(2, state=first[0]["state"])
    more = [k for r in rest for k in r["keys"]]
    assert len({r["batches"] for r in rest}) == 1
    everything = done + more
    assert len(everything) == len(set(everything))
    assert len(everything) == 90 - (90 - len(done)) % 2
