"""shuffle_block=K: each epoch visits the shards a block of K at a time, still covers every sample
once, differs from epoch to epoch, and resumes from a token as the global shuffle does."""
import glob
import os

import pytest

import ringfeed

SHARDS = sorted(glob.glob(os.path.join(os.environ.get("DL_TEST_SHARDS", ""), "rfs", "packed-*.rfs")))
pytestmark = pytest.mark.skipif(len(SHARDS) < 4, reason="the test shards are missing (make test builds them)")
KW = dict(batch_size=16, image_size=16, crop="resize", workers=2, framework="dlpack", seed=3, on_error="skip", log="quiet")


def shard_of_key():
    owner = {}
    for i, path in enumerate(SHARDS):
        for b in ringfeed.Loader(path, shuffle=False, **{**KW, "batch_size": 1000}):
            owner.update((k, i) for k in b["key"])
    return owner


def keys(loader, stop=None):
    out = []
    for n, b in enumerate(loader, 1):
        out += b["key"]
        if n == stop:
            break
    return out


def blocks_visited(order, owner, k):
    """How many runs of at most K distinct shards the order falls into, taken greedily."""
    runs, current = 0, set()
    for key in order:
        shard = owner[key]
        if shard not in current:
            if len(current) == k or runs == 0:
                runs, current = runs + 1, set()
            current.add(shard)
    return runs


def test_each_epoch_takes_the_shards_a_block_at_a_time():
    owner = shard_of_key()
    source = "::".join(SHARDS)
    with ringfeed.Loader(source, shuffle_block=2, epochs=2, **KW) as loader:
        first, second = keys(loader), keys(loader)
    with ringfeed.Loader(source, epochs=1, **KW) as loader:
        global_order = keys(loader)
    for epoch in (first, second):
        assert sorted(epoch) == sorted(owner)
        assert blocks_visited(epoch, owner, 2) == (len(SHARDS) + 1) // 2
    assert first != second
    assert blocks_visited(global_order, owner, 2) > 2 * len(SHARDS)


def test_a_token_resumes_the_block_order_and_another_block_size_is_refused():
    source = "::".join(SHARDS)
    with ringfeed.Loader(source, shuffle_block=3, epochs=1, **KW) as loader:
        whole = keys(loader)
    with ringfeed.Loader(source, shuffle_block=3, epochs=1, **KW) as loader:
        head = keys(loader, stop=5)
        state = loader.state_dict()
    with ringfeed.Loader(source, shuffle_block=3, epochs=1, state=state, **KW) as loader:
        assert head + keys(loader) == whole
    with pytest.raises(ringfeed.Error, match="shuffle_block=3"):
        ringfeed.Loader(source, shuffle_block=2, epochs=1, state=state, **KW)
