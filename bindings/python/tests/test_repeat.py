"""repeat=: a source of several '::' parts (a list in Python) mixed in chosen measure, as
Streaming's Stream(repeat=) and WebDataset's mixing do: each part's samples R times an epoch
(whole copies, then a subset that changes every epoch), over ranks, worker counts and resumes."""
import collections
import io
import tarfile

import pytest

import ringfeed

np = pytest.importorskip("numpy")
Image = pytest.importorskip("PIL.Image")


def shard(path, prefix, n):
    """N samples keyed PREFIX000...: a 32x32 gradient (so crops of it differ) and a label."""
    with tarfile.open(path, "w") as t:
        for i in range(n):
            x = np.arange(32, dtype=np.uint8)
            img = np.stack([np.add.outer(x, x * 3) + i, np.add.outer(x * 5, x), np.full((32, 32), i)], -1)
            buf = io.BytesIO()
            Image.fromarray(img.astype(np.uint8)).save(buf, format="PNG")
            for ext, data in (("png", buf.getvalue()), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"{prefix}{i:03d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return str(path)


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    d = tmp_path_factory.mktemp("repeat")
    return [shard(d / "a.tar", "a", 30), shard(d / "b.tar", "b", 4)]


KW = dict(batch_size=5, image_size=16, framework="numpy", workers=2)


def test_each_part_comes_as_often_as_its_factor_says(parts):
    loader = ringfeed.Loader(parts, repeat=[1, 3], **KW)
    assert len(loader) == 9 and loader.stats()["epoch_samples"] == 42 and loader.stats()["dataset_samples"] == 34
    keys = [k for b in loader for k in b["key"]]
    counts = collections.Counter(keys)
    assert len(keys) == 42 and all(counts[f"a{i:03d}"] == 1 for i in range(30))
    assert all(counts[f"b{i:03d}"] == 3 for i in range(4))
    # A fraction takes another subset every epoch; the rest of the part is left for later epochs.
    loader = ringfeed.Loader(parts, repeat=[0.5, 1], epochs=3, **KW)
    runs = [[k for b in loader for k in b["key"]] for _ in range(3)]
    subsets = [frozenset(k for k in keys if k[0] == "a") for keys in runs]
    assert all(len(keys) == 19 and len(s) == 15 for keys, s in zip(runs, subsets))
    assert all(sorted(k for k in keys if k[0] == "b") == [f"b{i:03d}" for i in range(4)] for keys in runs)
    assert len(set(subsets)) == 3
    # In order (shuffle=0): part by part, whole copies first.
    ordered = ringfeed.Loader(parts, repeat=[0.1, 2], shuffle=0, **KW)
    assert [k for b in ordered for k in b["key"]] == ["a000", "a001", "a002"] + [f"b{i:03d}" for i in range(4)] * 2


def test_the_same_stream_over_workers_and_ranks(parts):
    def stream(**kw):
        loader = ringfeed.Loader(parts, repeat=[0.6, 2.5], crop="random_resized", flip=True, **dict(KW, **kw))
        return [(b["key"], b["image"].copy()) for b in loader]
    one, four = stream(workers=1), stream(workers=4)
    assert [k for k, _ in one] == [k for k, _ in four]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(one, four))
    whole = collections.Counter(k for keys, _ in one for k in keys)
    ranks = collections.Counter(k for r in range(2) for keys, _ in stream(rank=r, world_size=2, drop_last=0) for k in keys)
    assert ranks == whole and sum(whole.values()) == 18 + 10  # even: no rank leaves one over
    # Two copies of one sample in an epoch are cropped and flipped apart, as two samples are.
    images = collections.defaultdict(list)
    for keys, batch in one:
        for k, img in zip(keys, batch):
            images[k].append(img)
    copies = [v for k, v in images.items() if k[0] == "b" and len(v) > 1]
    assert copies and any(not np.array_equal(v[0], v[1]) for v in copies)


def test_a_resumed_run_goes_on_with_the_same_copies(parts):
    full = [k for b in ringfeed.Loader(parts, repeat=[0.5, 3], **KW) for k in b["key"]]
    head = ringfeed.Loader(parts, repeat=[0.5, 3], **KW)
    first = [k for _ in range(2) for k in next(head)["key"]]
    state = head.state_dict()
    rest = [k for b in ringfeed.Loader(parts, repeat=[0.5, 3], state=state, **KW) for k in b["key"]]
    assert first + rest == full
    with pytest.raises(ringfeed.Error) as e:
        ringfeed.Loader(parts, repeat=[1, 3], state=state, **KW)
    assert e.value.name == "DL_ESTATE"
    with pytest.raises(ringfeed.Error) as e:
        ringfeed.Loader(parts, state=state, **KW)
    assert e.value.name == "DL_ESTATE"


@pytest.mark.parametrize("repeat,more,why", [
    ([1], {}, "repeat= gives 1 factor for a source of 2 parts"),
    ([1, 2, 3], {}, "repeat= gives 3 factors for a source of 2 parts"),
    ("1,x", {}, "expected a factor from 0 to 1000"),
    ([-1, 1], {}, "expected a factor from 0 to 1000"),
    ([0, 0], {}, "repeat=0,0: no sample is seen at these factors"),
    ([1, 2], {"shuffle_block": 1}, "repeat= and shuffle_block=1 do not go together")])
def test_factors_that_do_not_fit_are_named(parts, repeat, more, why):
    with pytest.raises(ringfeed.Error, match=why):
        ringfeed.Loader(parts, repeat=repeat, **dict(KW, **more))


def test_a_shard_named_twice_is_read_twice_and_said(parts, capfd):
    """Naming a shard again (a list, overlapping globs or braces, another spelling of its path)
    gives its samples again, as before, but no longer without a word: repeat= is the way to weigh."""
    a, b = parts
    other = a.replace("/a.tar", "/../" + a.split("/")[-2] + "/a.tar")
    quiet = dict(KW, log="warn")
    batches = lambda samples: -(-samples // KW["batch_size"])  # noqa: E731 - the last one short
    assert len(ringfeed.Loader([a, b], **quiet)) == batches(34)
    assert "named more than once" not in capfd.readouterr().err
    assert len(ringfeed.Loader([a, b, a], **quiet)) == batches(64)
    err = capfd.readouterr().err
    assert f"source: {a} is named more than once, so its samples come as many times an epoch (1 file named " \
           "again); to weigh a part of the source, name it once and give repeat=" in err, err
    assert len(ringfeed.Loader([a, other], **quiet)) == batches(60)
    assert f"(also as {other})" in capfd.readouterr().err
    assert len(ringfeed.Loader(a.replace("a.tar", "{a,b,a,b}.tar"), **quiet)) == batches(68)
    assert "(2 files named again)" in capfd.readouterr().err
