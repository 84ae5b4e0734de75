"""The Loader as PyTorch users drive one: a `for` per epoch, set_epoch, the batch's epoch, and a
clear word when it is wrapped in a DataLoader."""
import os

import pytest

import ringfeed
from conftest import TESTDATA

np = pytest.importorskip("numpy")
WDS = os.path.join(TESTDATA, "webdataset", "WebDataset.jl-test-sample.tar")
pytestmark = pytest.mark.skipif(not os.path.exists(WDS), reason="third-party test data absent")
KW = dict(batch_size=16, image_size=32, workers=2, framework="numpy", seed=5)


def run(loader):
    """One `for` over LOADER: what each batch was (its tensors dropped, so slots return)."""
    return [{"epoch": b["epoch"], "index": b["index"], "key": b["key"]} for b in loader]


def keys_of(batches):
    return [k for b in batches for k in b["key"]]


def test_each_for_is_one_epoch_and_the_last_is_empty():
    with ringfeed.Loader(WDS, epochs=2, **KW) as loader:
        per_epoch = len(loader)
        assert loader.epoch == 0
        first = run(loader)
        assert len(first) == per_epoch and {b["epoch"] for b in first} == {0}
        assert [b["index"] for b in first] == list(range(per_epoch))
        assert loader.epoch == 1
        second = run(loader)
        assert len(second) == per_epoch and {b["epoch"] for b in second} == {1}
        assert sorted(keys_of(first)) == sorted(keys_of(second)) and keys_of(first) != keys_of(second)
        assert run(loader) == [] and run(loader) == []


def test_epochs_without_end_one_per_for():
    with ringfeed.Loader(WDS, epochs=0, **KW) as loader:
        for e in range(3):
            batches = run(loader)
            assert len(batches) == len(loader) and {b["epoch"] for b in batches} == {e}


def test_breaking_out_leaves_the_rest_of_the_epoch_for_the_next_for():
    with ringfeed.Loader(WDS, epochs=2, **KW) as loader:
        for i, batch in enumerate(loader):
            if i == 1:
                break
        del batch  # a batch kept is a slot kept
        rest = run(loader)
        assert len(rest) == len(loader) - 2 and {b["epoch"] for b in rest} == {0}


def test_set_epoch_starts_that_epoch_as_a_continuous_run_has_it():
    with ringfeed.Loader(WDS, epochs=4, **KW) as continuous:
        epochs = [keys_of(run(continuous)) for _ in range(4)]
    with ringfeed.Loader(WDS, epochs=4, **KW) as loader:
        loader.set_epoch(0)  # the epoch that comes next anyway: nothing changes
        assert keys_of(run(loader)) == epochs[0]
        loader.set_epoch(3)
        assert loader.epoch == 3
        got = run(loader)
        assert keys_of(got) == epochs[3] and {b["epoch"] for b in got} == {3}
        assert run(loader) == []
        loader.set_epoch(1)
        assert keys_of(run(loader)) == epochs[1]
    with ringfeed.Loader(WDS, epochs=4, start_epoch=2, **KW) as loader:
        assert loader.epoch == 2 and keys_of(run(loader)) == epochs[2]
    with pytest.raises(ringfeed.Error) as e:
        ringfeed.Loader(WDS, start_epoch=1, state={"token": "rf2.5.0.3.90.0000000000000000"}, **KW)
    assert e.value.name == "DL_EOPTION"


def test_a_run_opened_past_its_last_epoch_says_so(capfd):
    with ringfeed.Loader(WDS, epochs=3, start_epoch=3, **KW) as loader:
        assert run(loader) == []
    assert "starts at epoch 3 (start_epoch) and ends after epoch 2 (epochs=3): no batch is left" in capfd.readouterr().err
    with ringfeed.Loader(WDS, epochs=1, **KW) as loader:
        run(loader)
        token = loader.state_dict()
    with ringfeed.Loader(WDS, epochs=1, state=token, **KW) as loader:
        assert run(loader) == []
    assert "starts at epoch 1 (from the resume token) and ends after epoch 0" in capfd.readouterr().err
    with ringfeed.Loader(WDS, epochs=3, start_epoch=2, **KW) as loader:
        left = len(loader)
        assert len(run(loader)) == left > 0
    assert "no batch is left" not in capfd.readouterr().err


def test_set_epoch_of_the_epoch_under_way_starts_it_again():
    with ringfeed.Loader(WDS, epochs=2, **KW) as continuous:
        first = keys_of(run(continuous))
    with ringfeed.Loader(WDS, epochs=2, **KW) as loader:
        for i, batch in enumerate(loader):
            if i == 1:
                break
        del batch
        loader.set_epoch(0)  # as a validation pass that stopped early and runs again
        again = run(loader)
        assert keys_of(again) == first and [b["index"] for b in again] == list(range(len(loader)))


def test_a_resumed_epoch_ends_where_the_epoch_ends():
    with ringfeed.Loader(WDS, epochs=2, **KW) as loader:
        whole = keys_of(run(loader))
    with ringfeed.Loader(WDS, epochs=2, **KW) as loader:
        head = [{"key": next(loader)["key"]} for _ in range(2)]
        state = loader.state_dict()
    with ringfeed.Loader(WDS, epochs=2, state=state, **KW) as loader:
        assert loader.epoch == 0
        rest = run(loader)
        assert keys_of(head) + keys_of(rest) == whole
        left = len(loader)
        assert loader.epoch == 1 and len(run(loader)) == left
    # The token counts a prefix of the shuffled order: in file order it would name other samples.
    with pytest.raises(ringfeed.Error) as e:
        ringfeed.Loader(WDS, epochs=2, state=state, **dict(KW, shuffle=0))
    assert e.value.name == "DL_ESTATE" and "shuffle=1, not shuffle=0" in str(e.value)


def test_wrapping_in_a_dataloader_says_what_to_do():
    torch = pytest.importorskip("torch")
    with ringfeed.Loader(WDS, **KW) as loader:
        with pytest.raises(TypeError, match="iterate it directly"):
            next(iter(torch.utils.data.DataLoader(loader)))
        assert "WebDataset.jl-test-sample.tar" in repr(loader) and "epoch 0" in repr(loader)
    assert "closed" in repr(loader)
