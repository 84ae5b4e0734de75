""""Is my GPU waiting?": the loader's one-word verdict names the stage that holds the consumer
back, in set-ups made to be bound by one stage each (a read-bound one is in tests/remote)."""
import os
import time

import pytest

import ringfeed

JPEGS = os.path.join(os.environ.get("DL_TEST_SHARDS", ""), "sweep-gnu.tar")
pytestmark = pytest.mark.skipif(not os.path.exists(JPEGS), reason="the test shards are not built")


def consume(loader, batches, pause_s=0.0):
    for _ in range(batches):
        batch = next(loader)
        assert batch is not None
        del batch
        time.sleep(pause_s)
    return loader.stats()


def test_a_slow_consumer_is_the_bottleneck(capsys):
    # Two workers make a batch of 8 small images in a few ms; the consumer takes 80 ms each.
    with ringfeed.Loader(JPEGS, batch_size=8, image_size=32, crop="resize", workers=2, framework="dlpack",
                         log_stats_every=4) as loader:
        s = consume(loader, 12, pause_s=0.08)
    assert s["bottleneck"] == "consumer", s["bottleneck_why"]
    assert s["consumer_wait_frac"] < 0.05
    assert "keeps up" in s["bottleneck_why"]
    logged = capsys.readouterr().err
    assert logged.count("ringfeed: after") == 3 and "bottleneck consumer" in logged


def test_one_worker_decoding_is_the_bottleneck():
    # Full-size JPEGs resized to 224 by a single worker, the consumer taking each batch at once.
    with ringfeed.Loader(JPEGS, batch_size=16, image_size=224, workers=1, framework="dlpack") as loader:
        s = consume(loader, 8)
    assert s["bottleneck"] == "decode", s["bottleneck_why"]
    assert s["consumer_wait_frac"] > 0.5
    assert s["worker_decode_frac"] > 0.5 and s["worker_decode_frac"] > 4 * s["worker_read_frac"]


def test_too_early_to_say():
    with ringfeed.Loader(JPEGS, batch_size=8, image_size=32, workers=1, framework="dlpack") as loader:
        assert loader.stats()["bottleneck"] == "unknown"
        next(loader)
        assert loader.stats()["bottleneck_why"] == "too early: 1 batch"


@pytest.mark.parametrize("every", [-1, 2.5, "4", True])
def test_log_stats_every_takes_a_number_of_batches(every):
    # -1 logged at every batch (n % -1 is 0), "4" failed at the first batch it was used in.
    with pytest.raises(ValueError, match="log_stats_every=.*expected a number of batches"):
        ringfeed.Loader(JPEGS, batch_size=8, image_size=32, log_stats_every=every)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="workers=auto needs two CPUs to set one aside")
def test_workers_auto_sets_workers_aside_while_the_consumer_keeps_up_and_gives_them_back():
    with ringfeed.Loader(JPEGS, batch_size=8, image_size=32, crop="resize", framework="dlpack", epochs=1000,
                         on_error="skip") as loader:
        s = consume(loader, 24, pause_s=0.05)
        assert s["workers_active"] < s["workers"], s
        assert "the consumer kept up" in s["workers_active_why"]
        assert s["parked_s"] > 0
        # The workers still at work are judged on their own time: the verdict stays right.
        assert s["bottleneck"] == "consumer", s["bottleneck_why"]
        # A consumer that takes batches as fast as they come waits, and gets the workers back.
        s = consume(loader, 200)
        assert s["workers_active"] == s["workers"], s
        assert "the consumer waited" in s["workers_active_why"]


def test_workers_given_are_all_kept_at_work():
    with ringfeed.Loader(JPEGS, batch_size=8, image_size=32, crop="resize", workers=2, framework="dlpack",
                         on_error="skip") as loader:
        s = consume(loader, 24, pause_s=0.05)
    assert s["workers_active"] == s["workers"] == 2 and s["workers_active_why"] == "" and s["parked_s"] == 0
