"""workers=auto and prefetch=auto, the defaults: what the loader chose, and why, in its stats."""
import os

import pytest

import ringfeed

JPEGS = os.path.join(os.environ.get("DL_TEST_SHARDS", ""), "sweep-gnu.tar")
pytestmark = pytest.mark.skipif(not os.path.exists(JPEGS), reason="the test shards are not built")
KW = dict(batch_size=32, image_size=64, framework="dlpack")
SLOT = 32 * 64 * 64 * 3 + 32 * 8  # one host slot's images and labels


def chosen(**options):
    with ringfeed.Loader(JPEGS, **KW, **options) as loader:
        s = loader.stats()
    return s["workers"], s["prefetch"], s["workers_reason"], s["prefetch_reason"]


def test_workers_are_the_usable_cpus_shared_by_the_ranks_of_the_host(monkeypatch):
    cpus = len(os.sched_getaffinity(0))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    workers, _, why, _ = chosen()
    assert workers == cpus and why == f"workers=auto: {cpus}, the CPUs this process may use"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(2 * cpus))  # more ranks than CPUs: still one each
    workers, _, why, _ = chosen()
    assert workers == 1 and f"LOCAL_WORLD_SIZE={2 * cpus} ranks" in why
    workers, _, why, _ = chosen(workers=3)
    assert workers == 3 and why == "workers=3 as given"


def test_slots_fit_the_memory_budget():
    assert chosen()[1] == 4  # an eighth of any test machine's memory holds four small slots
    _, prefetch, _, why = chosen(memory_budget=3 * SLOT)
    assert prefetch == 3 and "prefetch=auto: 3 slots of 0.4 MB; memory_budget is 1 MB, which holds no more" == why
    _, prefetch, _, why = chosen(memory_budget=SLOT // 2)
    assert prefetch == 2 and "less than the two slots a pipeline needs" in why
    _, prefetch, _, why = chosen(prefetch=7, memory_budget=SLOT)
    assert prefetch == 7 and why.startswith("prefetch=7 as given")


def test_auto_can_be_said_out_loud():
    assert chosen(workers="auto", prefetch="auto", memory_budget="auto")[:2] == chosen()[:2]
