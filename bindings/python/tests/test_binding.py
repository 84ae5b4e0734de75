"""The ctypes binding: tensors through DLPack, state_dict resume, errors, lifetimes, pixels."""

import io
import os
import random
import resource
import subprocess
import sys
import tarfile
import threading
import time

import pytest

import ringfeed
from conftest import TESTDATA

np = pytest.importorskip("numpy")

WDS = os.path.join(TESTDATA, "webdataset", "WebDataset.jl-test-sample.tar")
needs_testdata = pytest.mark.skipif(not os.path.exists(WDS), reason="third-party test data absent")


def wds_labels():
    labels = {}
    with tarfile.open(WDS) as t:
        for m in t.getmembers():
            if m.name.endswith(".cls"):
                key = m.name.split("/")[-1].split(".")[0]
                prefix = m.name.rsplit("/", 1)[0] + "/" if "/" in m.name else ""
                labels[prefix + key] = int(t.extractfile(m).read().strip())
    return labels


@needs_testdata
def test_numpy_batches_from_a_real_shard():
    labels = wds_labels()
    with ringfeed.Loader(WDS, batch_size=16, image_size=32, crop="resize", shuffle=False,
                         workers=2, framework="numpy") as loader:
        assert len(loader) == 6
        # Batches are zero-copy views of the loader's slots: keep copies, not the views.
        batches = [{k: (v.copy() if hasattr(v, "copy") else v) for k, v in b.items()} for b in loader]
    assert len(batches) == 6
    b = batches[0]
    assert b["image"].shape == (16, 32, 32, 3) and b["image"].dtype == np.uint8
    assert b["label"].shape == (16,) and b["label"].dtype == np.int64
    assert batches[-1]["image"].shape[0] == 90 - 5 * 16
    keys = [k for b in batches for k in b["key"]]
    assert len(keys) == 90 and len(set(keys)) == 90
    got = {k: int(lab) for b in batches for k, lab in zip(b["key"], b["label"])}
    assert got == labels
    assert b["image"].std() > 5  # real pixels, not a substitute


@needs_testdata
def test_torch_tensors_equal_numpy_arrays():
    torch = pytest.importorskip("torch")
    kw = dict(batch_size=32, image_size=24, seed=3, flip=True, workers=2)
    a = [{k: (v.copy() if hasattr(v, "copy") else v) for k, v in x.items()}
         for x in ringfeed.Loader(WDS, framework="numpy", **kw)]
    b = [{k: (v.clone() if hasattr(v, "clone") else v) for k, v in x.items()}
         for x in ringfeed.Loader(WDS, framework="torch", **kw)]
    assert len(a) == len(b) == 3
    for x, y in zip(a, b):
        assert isinstance(y["image"], torch.Tensor) and y["image"].dtype == torch.uint8
        assert y["label"].dtype == torch.int64
        assert np.array_equal(x["image"], y["image"].numpy())
        assert np.array_equal(x["label"], y["label"].numpy())
        assert x["key"] == y["key"]


@needs_testdata
def test_dlpack_objects_without_a_framework():
    loader = ringfeed.Loader(WDS, batch_size=8, image_size=16, framework="dlpack", workers=1)
    b = next(loader)
    img = b["image"]
    assert img.shape == (8, 16, 16, 3) and img.__dlpack_device__() == (1, 0)
    arr = np.from_dlpack(img)
    assert arr.shape == (8, 16, 16, 3)
    with pytest.raises(BufferError):
        img.__dlpack__()
    loader.close()
    assert int(arr.sum()) > 0  # still valid after close: the array holds the batch


@needs_testdata
def test_resume_through_state_dict_equals_the_uninterrupted_stream():
    kw = dict(batch_size=8, image_size=20, seed=7, epochs=2, flip=True, workers=2, framework="numpy")
    full = [b["image"].copy() for b in ringfeed.Loader(WDS, **kw)]
    loader = ringfeed.Loader(WDS, **kw)
    head = [next(loader)["image"].copy() for _ in range(5)]
    state = loader.state_dict()
    loader.close()
    rest = [b["image"].copy() for b in ringfeed.Loader(WDS, state=state, **kw)]
    assert len(head) + len(rest) == len(full)
    for x, y in zip(head + rest, full):
        assert np.array_equal(x, y)
    again = ringfeed.Loader(WDS, **kw)
    next(again)
    again.load_state_dict(state)
    assert np.array_equal(next(again)["image"], full[5])


@needs_testdata
def test_a_refused_state_leaves_the_loader_where_it_was():
    kw = dict(batch_size=8, image_size=20, seed=7, epochs=2, flip=True, workers=2, framework="numpy")
    full = [b["image"].copy() for b in ringfeed.Loader(WDS, **kw)]
    loader = ringfeed.Loader(WDS, **kw)
    for _ in range(3):
        next(loader)
    with pytest.raises(ValueError, match="state_dict"):
        loader.load_state_dict({"step": 3})
    token = loader.state_dict()["token"]
    parts = token.split(".")  # rf2.SEED.EPOCH.OFFSET.N.FINGERPRINT.sS: another dataset's fingerprint
    parts[5] = parts[5][:-4] + ("0000" if not parts[5].endswith("0000") else "1111")
    other = ".".join(parts)
    with pytest.raises(ringfeed.Error) as e:
        loader.load_state_dict({"token": other})
    assert e.value.name == "DL_ESTATE" and "another dataset" in e.value.message
    assert np.array_equal(next(loader)["image"], full[3])
    loader.close()


@needs_testdata
def test_pickling_a_loader_says_what_to_do_instead():
    import copy
    import pickle
    with ringfeed.Loader(WDS, batch_size=8, image_size=20, workers=1, framework="numpy") as loader:
        for attempt in (pickle.dumps, copy.deepcopy, copy.copy):
            with pytest.raises(TypeError, match="one in each process"):
                attempt(loader)
        assert next(loader)["image"].shape == (8, 20, 20, 3)


def test_errors_are_exceptions_with_code_names(tmp_path):
    with pytest.raises(ringfeed.Error) as e:
        ringfeed.Loader(str(tmp_path / "missing.tar"))
    assert e.value.name == "ENOENT" and "missing.tar" in e.value.message
    with pytest.raises(ringfeed.Error) as e:
        ringfeed.Loader(str(tmp_path), crop="sideways")
    assert e.value.name == "DL_EOPTION" and "crop=sideways" in str(e.value)
    with pytest.raises(ringfeed.Error) as e:  # quoted whole, not split into "seed=1" and "2"
        ringfeed.Loader(str(tmp_path), seed="1 2")
    assert e.value.name == "DL_EOPTION" and "seed=1 2: expected a non-negative integer" in e.value.message
    for size in ((224,), (10, 20, 30), []):  # not an IndexError, nor a third number dropped
        with pytest.raises(ValueError, match="one size or \\(height, width\\)"):
            ringfeed.Loader(str(tmp_path), image_size=size)
    # A dtype as a framework names it is the word (here refused for the source's sake only).
    dtypes = [np.float16, np.dtype("float32")]
    try:
        import torch
        dtypes.append(torch.bfloat16)
    except ImportError:
        pass
    for dtype in dtypes:
        with pytest.raises(ringfeed.Error, match="DL_ENOSAMPLES"):
            ringfeed.Loader(str(tmp_path), dtype=dtype)


@needs_testdata
def test_a_source_is_any_kind_of_path_or_a_list_of_them(tmp_path):
    import pathlib
    one = len(ringfeed.Loader(WDS, batch_size=1, image_size=16, workers=1))  # samples
    for source in (pathlib.Path(WDS), os.fsencode(WDS), [pathlib.Path(WDS), os.fsencode(WDS)], (WDS,)):
        n = 2 if isinstance(source, list) else 1
        assert len(ringfeed.Loader(source, batch_size=1, image_size=16, workers=1)) == n * one, source
    # Any iterable of paths: a generator, as glob.iglob and Path.glob give.
    generated = (p for p in [WDS, pathlib.Path(WDS)])
    assert len(ringfeed.Loader(generated, batch_size=1, image_size=16, workers=1)) == 2 * one
    with pytest.raises(TypeError, match="not int"):
        ringfeed.Loader(7)
    # A file name that is not UTF-8 goes to the library as its bytes.
    odd = tmp_path / os.fsdecode(b"shard-\xff.tar")
    os.symlink(os.path.abspath(WDS), odd)
    assert len(ringfeed.Loader(odd, batch_size=1, image_size=16, workers=1)) == one
    assert len(ringfeed.Loader(os.fsencode(odd), batch_size=1, image_size=16, workers=1)) == one
    # A local path written as a URL (fsspec, Streaming) is the path.
    assert len(ringfeed.Loader("file://" + os.path.abspath(WDS), batch_size=1, image_size=16, workers=1)) == one


def test_option_values_with_spaces_are_quoted(tmp_path):
    from ringfeed._loader import _format
    assert _format("cache_dir", str(tmp_path / "My Drive")) == f'"{tmp_path}/My Drive"'
    assert _format("cache_dir", tmp_path / "x") == str(tmp_path / "x")  # pathlib, as it is
    with pytest.raises(ValueError, match="spaces and quotes"):
        _format("ca_file", 'a "b" c')


@needs_testdata
def test_a_name_with_glob_characters_that_exists_is_that_name(tmp_path):
    import shutil
    one = len(ringfeed.Loader(WDS, batch_size=1, image_size=16, workers=1))
    for name in ("data[1]", "what?", "all*"):  # "no file matches" before
        os.makedirs(tmp_path / name)
        shutil.copy(WDS, tmp_path / name / "shard[0].tar")
        assert len(ringfeed.Loader(str(tmp_path / name / "shard[0].tar"), batch_size=1, image_size=16)) == one
    assert len(ringfeed.Loader(str(tmp_path / "what?" / "*.tar"), batch_size=1, image_size=16)) == one
    # A bracket left open does not hide the "::" after it (only a URL's [IPv6] host does).
    with pytest.raises(ringfeed.Error) as e:
        ringfeed.Loader(f"{tmp_path}/x[1.tar::{WDS}")
    assert e.value.name == "ENOENT" and f"source {tmp_path}/x[1.tar: no file matches" in e.value.message


def test_sources_ringfeed_does_not_read_say_what_it_does(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing is asked of it
    for source, name, said in (
            ("pipe:curl -s https://host/shard-{000..009}.tar", "DL_EUNSUPPORTED", "give the URL or path it reads"),
            ("gs://bucket/shard.tar", "DL_EUNSUPPORTED", "only http://, https://, s3:// and hf:// URLs are read"),
            ("ftp://host/shard.tar", "DL_EUNSUPPORTED", "only http://, https://, s3:// and hf:// URLs are read"),
            ("s3://bucket", "DL_EOPTION", "names no object: give s3://bucket/key, or a pattern")):
        with pytest.raises(ringfeed.Error) as e:
            ringfeed.Loader(source, retries=0)
        assert e.value.name == name and said in e.value.message, (source, e.value)


@needs_testdata
def test_a_folder_of_shards_says_to_give_them_by_a_glob(tmp_path):
    import shutil
    shutil.copy(WDS, tmp_path / "shard-0.tar")
    with pytest.raises(ringfeed.Error) as e:
        ringfeed.Loader(str(tmp_path))
    assert e.value.name == "DL_ENOSAMPLES" and "it holds shards" in e.value.message
    assert len(ringfeed.Loader(str(tmp_path / "*.tar"), batch_size=4, image_size=16, workers=1)) > 0


@needs_testdata
def test_a_compressed_or_foreign_shard_says_what_it_is(tmp_path):
    import lzma
    import zipfile
    with open(WDS, "rb") as f:
        tar = f.read()
    (tmp_path / "a.tar.xz").write_bytes(lzma.compress(tar))
    with zipfile.ZipFile(tmp_path / "a.zip", "w") as z:
        z.writestr("x.jpg", b"0" * 600)
    (tmp_path / "a.bin").write_bytes(bytes(range(256)) * 8)
    for name, what in (("a.tar.xz", "an xz-compressed file, not a tar"), ("a.zip", "a zip archive, not a tar"),
                       ("a.bin", "not a tar archive")):
        with pytest.raises(ringfeed.Error) as e:  # the shard's warning is in the error, whatever the log level
            ringfeed.Loader(str(tmp_path / name))
        assert e.value.name == "DL_ENOSAMPLES" and f"shard {tmp_path / name}: {what}" in e.value.message
        with pytest.raises(ringfeed.Error) as e:
            ringfeed.Loader(str(tmp_path / name), on_error="fail")
        assert e.value.name == ("DL_ECORRUPT" if name == "a.bin" else "DL_EUNSUPPORTED") and what in e.value.message
    # One such shard among good ones is skipped with its warning, as a damaged shard is.
    mixed = ringfeed.Loader(f"{WDS}::{tmp_path / 'a.tar.xz'}", batch_size=4, image_size=16, workers=1)
    assert len(mixed) == len(ringfeed.Loader(WDS, batch_size=4, image_size=16, workers=1))
    with pytest.raises(ringfeed.Error) as e:
        ringfeed.Loader("tokens:https://127.0.0.1:9/a.bin", dtype="uint16", seq_len=8)
    assert e.value.name == "DL_EUNSUPPORTED" and "local disk only" in e.value.message
    # Token files written as file:// URLs are the files, as shards are.
    windows = {"dtype": "uint16", "seq_len": 8, "batch_size": 1}
    plain = len(ringfeed.Loader(f"tokens:{tmp_path}/a.bin", **windows))
    assert len(ringfeed.Loader(f"tokens:file://{tmp_path}/a.b*::file://{tmp_path}/a.bin", **windows)) == 2 * plain > 0
    # A glob that matches nothing is named by its open; an empty part is no part, as for shards.
    assert len(ringfeed.Loader(f"tokens:{tmp_path}/a.bin::", **windows)) == plain
    with pytest.raises(ringfeed.Error) as e:
        ringfeed.Loader(f"tokens:{tmp_path}/a.bin::{tmp_path}/none*.bin", **windows)
    assert e.value.name == "ENOENT" and f"{tmp_path}/none*.bin" in e.value.message


def _everything(source, **kw):
    with ringfeed.Loader(source, batch_size=8, image_size=16, shuffle=False, workers=2, framework="numpy",
                         epochs=1, **kw) as loader:
        return [(k, int(label), image.copy()) for b in loader
                for k, label, image in zip(b["key"], b["label"], b["image"])]


def _same(a, b):
    return len(a) == len(b) > 0 and all(x[0] == y[0] and x[1] == y[1] and np.array_equal(x[2], y[2])
                                        for x, y in zip(a, b))


@needs_testdata
def test_compressed_tar_shards_are_read_through_an_uncompressed_copy(tmp_path, capfd):
    import bz2
    import gzip
    with open(WDS, "rb") as f:
        tar = f.read()
    (tmp_path / "a.tar.gz").write_bytes(gzip.compress(tar))
    (tmp_path / "a.tar.bz2").write_bytes(bz2.compress(tar))
    subprocess.run(["zstd", "-q", "-o", str(tmp_path / "a.tar.zst"), WDS], check=True)
    want = _everything(WDS)
    capfd.readouterr()
    for name in ("a.tar.gz", "a.tar.bz2", "a.tar.zst"):
        # Without cache_dir a temporary copy at every open; keys, labels and pixels as the tar's.
        assert _same(_everything(str(tmp_path / name), log="info"), want), name
        assert f"shard {tmp_path / name}: decompressed into a temporary copy ({len(tar)} bytes)" in capfd.readouterr().err
    # Named twice, it is said as a plain shard named twice is, though each copy is a file of its own.
    ringfeed.Loader([str(tmp_path / "a.tar.gz")] * 2, batch_size=8, image_size=16).close()
    assert f"source: {tmp_path / 'a.tar.gz'} is named more than once" in capfd.readouterr().err
    # The member index is kept by the compressed file's identity, and a later open reads it (an index
    # written again would be a new file: it is written beside the shard and renamed into place).
    indexed = os.stat(tmp_path / "a.tar.gz.rfidx").st_ino
    assert _same(_everything(str(tmp_path / "a.tar.gz")), want)
    assert os.stat(tmp_path / "a.tar.gz.rfidx").st_ino == indexed
    # With cache_dir the copy is made once, kept by the compressed file's identity, and read again.
    cache = tmp_path / "cache"
    assert _same(_everything(str(tmp_path / "a.tar.gz"), cache_dir=str(cache)), want)
    (entry,) = [p for p in cache.iterdir() if not p.name.startswith(".")]
    assert entry.read_bytes() == tar and entry.name.endswith("-a.tar.gz")
    made = entry.stat().st_ino
    assert _same(_everything(str(tmp_path / "a.tar.gz"), cache_dir=str(cache), log="info"), want)
    assert "decompressed" not in capfd.readouterr().err
    assert [p.stat().st_ino for p in cache.iterdir() if not p.name.startswith(".")] == [made]
    # A copy larger than cache_limit is a temporary one, as a remote shard larger than the cache.
    assert _same(_everything(str(tmp_path / "a.tar.zst"), cache_dir=str(tmp_path / "small"), cache_limit="64K",
                             log="info"), want)
    assert "its uncompressed copy is not kept in cache_dir (no room within cache_limit)" in capfd.readouterr().err
    assert not [p for p in (tmp_path / "small").iterdir() if not p.name.startswith(".")]
    # A tar whose first member's name begins as bzip2 data does is a tar.
    odd = tmp_path / "odd.tar"
    with tarfile.open(odd, "w", format=tarfile.USTAR_FORMAT) as t, tarfile.open(WDS) as src:
        for m in src.getmembers():
            data = src.extractfile(m).read()
            m.name = "BZh91AY&SY" + m.name
            t.addfile(m, io.BytesIO(data))
    assert [k[:10] for k, _, _ in _everything(str(odd))] == ["BZh91AY&SY"] * len(want)


@needs_testdata
def test_a_damaged_compressed_shard_keeps_what_comes_before_the_damage(tmp_path, capfd):
    import gzip
    with open(WDS, "rb") as f:
        tar = f.read()
    packed = gzip.compress(tar)
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(packed[:len(packed) // 2])
    got = _everything(str(cut), on_error="skip")
    err = capfd.readouterr().err
    assert f"shard {cut}: its gz data ends early (truncated?); keeping the members before it" in err
    want = _everything(WDS)
    assert 0 < len(got) < len(want) and all(g[0] == w[0] for g, w in zip(got, want))
    with pytest.raises(ringfeed.Error) as e:
        ringfeed.Loader(str(cut), on_error="fail")
    assert e.value.name == "DL_ECORRUPT" and f"shard {cut}: its gz data ends early (truncated?)" in e.value.message
    assert not os.path.exists(f"{cut}.rfidx")  # said again at every open, not hidden behind a cached index


@needs_testdata
def test_a_first_open_indexes_its_shards_ahead_and_still_says_what_each_holds(tmp_path, capfd):
    """Several shards without an index are scanned at once before the load; what a scan finds (a
    link member, a cut) is said once, by the load, and such a shard keeps no index, so that every
    open says it."""
    with open(WDS, "rb") as f:
        tar = f.read()
    for i in range(3):
        (tmp_path / f"plain-{i}.tar").write_bytes(tar)
    linked = tmp_path / "linked.tar"
    with tarfile.open(linked, "w", format=tarfile.USTAR_FORMAT) as t, tarfile.open(WDS) as src:
        for m in src.getmembers():
            t.addfile(m, src.extractfile(m))
        link = tarfile.TarInfo("extra/link.jpg")
        link.type, link.linkname = tarfile.SYMTYPE, "elsewhere.jpg"
        t.addfile(link)
    with tarfile.open(WDS) as src:
        middle = src.getmembers()[len(src.getmembers()) // 2]
    cut = tmp_path / "cut.tar"
    cut.write_bytes(tar[:middle.offset_data + middle.size // 2])  # in a member's data
    said = (f"shard {linked}: 1 members are links", f"shard {cut}: member data runs past the end of the file")
    got = _everything(str(tmp_path / "*.tar"), on_error="skip")
    err = capfd.readouterr().err
    assert [err.count(s) for s in said] == [1, 1], err
    assert all(os.path.exists(tmp_path / f"plain-{i}.tar.rfidx") for i in range(3))
    assert not os.path.exists(f"{cut}.rfidx") and not os.path.exists(f"{linked}.rfidx")
    # The indexes give the samples the scans gave, and the two shards are said again.
    assert _same(_everything(str(tmp_path / "*.tar"), on_error="skip"), got)
    again = capfd.readouterr().err
    assert [again.count(s) for s in said] == [1, 1], again


@needs_testdata
def test_the_ranks_of_a_host_begin_their_index_scans_apart(tmp_path, capfd, monkeypatch):
    """torchrun's ranks of one host open the same shards at once: each begins its scans at its own
    part of the list (LOCAL_RANK of LOCAL_WORLD_SIZE), with its share of the CPUs (here under one a
    rank: the scans run on the opening thread), and skips a shard indexed meanwhile; one another
    process scans at the moment (its flock held) is left to it, and the load reads the index it
    writes instead of scanning the shard again."""
    import fcntl
    with open(WDS, "rb") as f:
        tar = f.read()
    shards = [tmp_path / f"s-{i}.tar" for i in range(4)]
    for s in shards:
        s.write_bytes(tar)
    source = str(tmp_path / "s-{0..3}.tar")
    want = _everything(source)  # indexes made by one process
    made = {s: s.with_name(s.name + ".rfidx").read_bytes() for s in shards}
    for s in shards:
        os.remove(f"{s}.rfidx")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1000")
    monkeypatch.setenv("LOCAL_RANK", "750")  # a rank three quarters along: shard 3 first
    _everything(str(shards[1]))  # as if another rank had indexed it already
    capfd.readouterr()
    index2 = shards[2].with_name(shards[2].name + ".rfidx")
    written = []
    with open(shards[2], "rb") as busy:  # ... and were scanning this one
        fcntl.flock(busy, fcntl.LOCK_EX)

        def finish():  # that rank's scan ends: its index written, then its lock let go
            index2.write_bytes(made[shards[2]])
            written.append(os.stat(index2).st_ino)
            fcntl.flock(busy, fcntl.LOCK_UN)
        threading.Timer(0.3, finish).start()
        t0 = time.monotonic()
        assert _same(_everything(source, log="debug"), want)
        waited = time.monotonic() - t0
    assert waited >= 0.25 and written == [os.stat(index2).st_ino]  # read, not scanned and written again
    err = capfd.readouterr().err
    assert (f"source: 2 of 4 shards indexed ahead in " in err and
            f" on 1 thread, beginning with {shards[3]} (LOCAL_RANK=750 of LOCAL_WORLD_SIZE=1000)" in err), err
    assert {s: s.with_name(s.name + ".rfidx").read_bytes() for s in shards} == made
    # Opened again, every index is current: nothing is scanned ahead.
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert _same(_everything(source, log="debug"), want)
    assert "indexed ahead" not in capfd.readouterr().err
    # Values torchrun would not give are read as one rank alone, as workers=auto reads them.
    for s in shards:
        os.remove(f"{s}.rfidx")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    monkeypatch.setenv("LOCAL_RANK", "-1")
    assert _same(_everything(source, log="debug"), want)
    err = capfd.readouterr().err
    assert "LOCAL_RANK=" not in err and ("source: 4 of 4 shards indexed ahead in " in err or
                                         len(os.sched_getaffinity(0)) == 1), err  # one CPU: no helpers


@needs_testdata
def test_a_kept_uncompressed_copy_stays_read_locked_while_loaders_index_it(tmp_path):
    """A copy kept in cache_dir is held with a shared flock by every loader reading it, so that no
    process evicts it meanwhile; indexing it takes no lock of its own, which would wait for the other
    readers' shared locks and drop the loader's own."""
    import fcntl
    import gzip
    with open(WDS, "rb") as f:
        (tmp_path / "a.tar.gz").write_bytes(gzip.compress(f.read()))
    cache = tmp_path / "cache"
    opts = dict(batch_size=8, image_size=16, shuffle=False, workers=1, framework="numpy", cache_dir=str(cache))
    with ringfeed.Loader(str(tmp_path / "a.tar.gz"), **opts) as first:
        want = [list(b["key"]) for b in first]
        kept = [p for p in cache.iterdir() if not p.name.startswith(".")]
        os.remove(tmp_path / "a.tar.gz.rfidx")  # the next loader scans the copy the first one reads
        t0 = time.monotonic()
        with ringfeed.Loader(str(tmp_path / "a.tar.gz"), **opts) as second:
            assert time.monotonic() - t0 < 10
            assert [list(b["key"]) for b in second] == want
        with open(kept[0], "rb") as f, pytest.raises(BlockingIOError):  # the first one's still held
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert len(kept) == 1 and os.path.exists(tmp_path / "a.tar.gz.rfidx")


@needs_testdata
def test_an_image_folder_names_the_entries_it_cannot_read(tmp_path, capfd):
    # A link to nothing (a dataset of links into a mount that is gone) was left out in silence.
    jpg = os.path.join(TESTDATA, "libjpeg-turbo", "testimages", "testorig.jpg")
    for cls in ("cat", "dog"):
        os.makedirs(tmp_path / cls)
        os.symlink(jpg, tmp_path / cls / "a.jpg")
    os.symlink(tmp_path / "gone" / "b.jpg", tmp_path / "dog" / "b.jpg")
    loader = ringfeed.Loader(str(tmp_path), batch_size=4, image_size=16, workers=1, shuffle=False, log="warn")
    assert next(loader)["key"] == ["cat/a", "dog/a"]
    loader.close()
    err = capfd.readouterr().err
    assert f"1 entry could not be read and was left out ({tmp_path / 'dog' / 'b.jpg'}: No such file" in err
    flat = tmp_path / "flat"  # a folder of files without class folders: the same
    os.makedirs(flat)
    os.symlink(jpg, flat / "a.jpg")
    os.symlink(tmp_path / "gone" / "b.jpg", flat / "b.jpg")
    with ringfeed.Loader(str(flat), batch_size=4, image_size=16, workers=1, log="warn") as loader:
        assert next(loader)["key"] == ["a"]
    assert f"1 entry could not be read and was left out ({flat / 'b.jpg'}: No such file" in capfd.readouterr().err
    # A FIFO named as an image (reading it would wait for a writer) is named too, in both layouts.
    for root, folder in ((tmp_path / "piped", tmp_path / "piped" / "cat"), (tmp_path / "pipedflat",) * 2):
        os.makedirs(folder)
        os.symlink(jpg, folder / "a.jpg")
        os.mkfifo(folder / "c.jpg")
        with ringfeed.Loader(str(root), batch_size=1, image_size=16, workers=1, log="warn") as loader:
            assert len(loader) == 1
        err = capfd.readouterr().err
        assert f"1 entry could not be read and was left out ({folder / 'c.jpg'}: not a regular file" in err, err


@needs_testdata
def test_more_shards_than_the_open_file_limit_allows_are_named_with_what_to_do(tmp_path):
    # A loader keeps every shard open. dl_open lifts the soft limit to the hard one; past that, the
    # error says which limit and what to do (it said "Too many open files" alone).
    jpg = os.path.join(TESTDATA, "libjpeg-turbo", "testimages", "testorig.jpg")
    for i in range(80):
        with tarfile.open(tmp_path / f"s-{i:03d}.tar", "w") as t:
            t.add(jpg, "s.jpg")
    code = ("import ringfeed, sys\n"
            "with ringfeed.Loader(sys.argv[1], batch_size=4, image_size=16, workers=1, framework='numpy') as l:\n"
            "    print(len(l))")
    source = f"{tmp_path}/s-{{000..079}}.tar"

    def run(soft, hard):
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(ringfeed.__file__)))
        return subprocess.run([sys.executable, "-c", code, source], capture_output=True, text=True, env=env,
                              preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)))
    low = run(48, 48)
    assert low.returncode != 0 and "too many open files: the process may open 48 (ulimit -n; hard limit 48)" in low.stderr
    assert "fewer, larger shards" in low.stderr, low.stderr
    lifted = run(48, 512)  # the soft limit alone is low: lifted, and the loader opens
    assert lifted.returncode == 0 and lifted.stdout.split() == ["20"], lifted.stderr


@needs_testdata
def test_an_empty_class_folder_is_named_and_keeps_its_label(tmp_path, capfd):
    """A class folder with no image (a copy cut short) was passed over in silence; torchvision's
    ImageFolder refuses it. Its label still counts, as in torchvision's class_to_idx."""
    jpg = os.path.join(TESTDATA, "libjpeg-turbo", "testimages", "testorig.jpg")
    for cls in ("ant", "bee", "cat"):
        os.makedirs(tmp_path / cls)
    for cls in ("ant", "cat"):
        os.symlink(jpg, tmp_path / cls / "a.jpg")
    with ringfeed.Loader(str(tmp_path), batch_size=2, image_size=16, workers=1, shuffle=False, log="warn",
                         framework="numpy") as loader:
        assert next(loader)["label"].tolist() == [0, 2]
        assert loader.classes == ["ant", "bee", "cat"]
    assert "1 class folder holds no image (bee, label 1)" in capfd.readouterr().err


def test_dataloader_keywords_name_what_to_write_instead(tmp_path):
    for keyword, hint in (("num_workers", "workers=N"), ("pin_memory", "always in pinned memory"),
                          ("prefetch_factor", "prefetch=N"), ("collate_fn", "come collated")):
        with pytest.raises(ringfeed.Error) as e:
            ringfeed.Loader(str(tmp_path), **{keyword: 2})
        assert e.value.name == "DL_EOPTION" and f"unknown option '{keyword}'" in e.value.message
        assert hint in e.value.message and "DataLoader" in e.value.message


@needs_testdata
def test_calls_after_close_raise_instead_of_crashing():
    loader = ringfeed.Loader(WDS, batch_size=16, image_size=32, workers=1, framework="numpy")
    loader.close()
    loader.close()  # twice is fine
    for call in (loader.state_dict, loader.stats, lambda: len(loader), loader.next_batch,
                 lambda: next(iter(loader))):
        with pytest.raises(ringfeed.Error) as e:
            call()
        assert "closed" in e.value.message


@needs_testdata
def test_a_forked_child_is_refused_the_parents_loader_and_opens_its_own():
    loader = ringfeed.Loader(WDS, batch_size=8, image_size=32, workers=2, framework="numpy")
    first = next(loader)
    pid = os.fork()
    if pid == 0:  # the child reports through its exit status only
        status = 1
        try:
            try:
                next(loader)
            except ringfeed.Error as e:
                status = 0 if e.name == "DL_EFORKED" and "fork()" in e.message else 2
            status = status or (0 if first["image"].shape[0] == 8 else 3)
            loader.close()
            own = ringfeed.Loader(WDS, batch_size=8, image_size=32, workers=1, framework="numpy")
            status = status or (0 if next(own)["image"].shape == (8, 32, 32, 3) else 4)
            own.close()
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert next(loader)["image"].shape[0] == 8  # the parent's loader is untouched
    loader.close()


def test_ctrl_c_interrupts_a_wait_for_a_slow_batch(tmp_path):
    """SIGINT reaches Python within 200 ms while dl_next_batch waits, and the loader closes fast."""
    shard = _slow_shard(tmp_path, 1500, 64)
    script = f'''
import os, signal, sys, threading, time
sys.path.insert(0, {os.path.dirname(os.path.dirname(ringfeed.__file__))!r})
import ringfeed
loader = ringfeed.Loader({str(shard)!r}, batch_size=32, workers=1, image_size=64, framework="numpy")
fired = []
def fire():
    time.sleep(0.4)
    fired.append(time.perf_counter())
    os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=fire, daemon=True).start()
try:
    for b in loader:
        pass
    print("finished")
except KeyboardInterrupt:
    waited = time.perf_counter() - fired[0]
    t0 = time.perf_counter()
    loader.close()
    print(f"interrupted {{waited:.3f}} closed {{time.perf_counter() - t0:.3f}}")
'''
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ))
    words = out.stdout.split()
    assert words and words[0] == "interrupted", out.stdout + out.stderr
    assert float(words[1]) < 0.2 and float(words[3]) < 0.1, out.stdout


@needs_testdata
def test_close_from_another_thread_waits_for_a_call_in_flight():
    """close() refuses new calls at once but frees the loader only after calls already made on
    another thread have returned: none of them runs on a freed loader."""
    loader = ringfeed.Loader(WDS, batch_size=8, image_size=20, workers=1, framework="numpy")
    batches = len(loader)
    entered, leave, seen = threading.Event(), threading.Event(), []

    def in_flight():
        with loader._use() as handle:
            entered.set()
            leave.wait(10)
            seen.append(ringfeed._loader.lib.dl_batches_per_epoch(handle))

    user = threading.Thread(target=in_flight)
    user.start()
    assert entered.wait(10)
    closer = threading.Thread(target=loader.close)
    closer.start()
    time.sleep(0.2)
    assert closer.is_alive()  # waiting for the call in flight
    with pytest.raises(ringfeed.Error, match="closed"):
        loader.state_dict()  # a new call is refused meanwhile
    leave.set()
    user.join(10)
    closer.join(10)
    assert not closer.is_alive() and seen == [batches]


def test_close_while_another_thread_waits_for_a_batch(tmp_path):
    """A consumer thread waiting for slow batches, closed from the main thread at random moments:
    it ends with DL_ECLOSED (or "closed" when close came first), never a crash or a hang."""
    shard = _slow_shard(tmp_path, 900, 48)
    rng = random.Random(3)
    for _ in range(12):
        loader = ringfeed.Loader(str(shard), batch_size=8, workers=1, image_size=32, framework="numpy")
        ends = []

        def consume():
            try:
                for _ in loader:
                    pass
                ends.append("done")
            except ringfeed.Error as e:
                ends.append(e.name)

        t = threading.Thread(target=consume)
        t.start()
        time.sleep(rng.uniform(0.0, 0.25))
        loader.close()
        t.join(10)
        assert not t.is_alive() and ends and ends[0] in ("DL_ECLOSED", "EBADF", "done"), ends


def _slow_shard(tmp_path, side, count):
    """COUNT noise PNGs of SIDE x SIDE pixels: slow to decode, so a consumer waits for them."""
    Image = pytest.importorskip("PIL.Image")
    noise = np.random.default_rng(side).integers(0, 255, (side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(noise).save(buf, format="PNG", compress_level=1)
    shard = tmp_path / "slow.tar"
    _tar(shard, [(f"{i:04d}.png", buf.getvalue()) for i in range(count)])
    return shard


def _tar(path, members):
    with tarfile.open(path, "w") as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))


@needs_testdata
def test_bad_sample_fails_or_is_replaced(tmp_path):
    good = open(os.path.join(TESTDATA, "libjpeg-turbo", "testimages", "testorig.jpg"), "rb").read()
    shard = tmp_path / "bad.tar"
    _tar(shard, [("a.jpg", good), ("a.cls", b"1"), ("b.jpg", good[: len(good) // 2]), ("b.cls", b"2")])
    with pytest.raises(ringfeed.Error) as e:
        list(ringfeed.Loader(str(shard), batch_size=2, shuffle=False, on_error="fail", log="quiet"))
    assert e.value.name == "DL_ECORRUPT" and "b.jpg" in e.value.message and "bad.tar" in e.value.message
    loader = ringfeed.Loader(str(shard), batch_size=2, shuffle=False, image_size=16, log="quiet", epochs=1,
                             framework="numpy")
    b = next(loader)
    assert b["error"][0] == 0 and b["error"][1] != 0
    assert b["image"][1].max() == 0 and b["label"].tolist() == [1, 2]
    assert loader.stats()["errors"] == 1


@needs_testdata
def test_tensors_outlive_the_loader_and_holding_every_slot_is_an_error():
    loader = ringfeed.Loader(WDS, batch_size=4, image_size=16, prefetch=3, epochs=0, workers=2,
                             framework="numpy")
    held = [next(loader) for _ in range(3)]
    with pytest.raises(ringfeed.Error) as e:
        next(loader)
    assert e.value.name == "DL_EBUSY"
    copy = held[0]["image"].copy()
    del held[1]  # any batch let go gives the next one its slot
    assert next(loader)["image"].shape == (4, 16, 16, 3)
    # A batch kept for good (a picture of the first batch, say) costs one slot: the loop goes on
    # (with one slot more for the batch `batch` still names while the next is fetched).
    del held[1:]
    first_keys = held[0]["key"]
    for _ in range(3 * len(loader)):
        batch = next(loader)
    del batch
    assert held[0]["key"] == first_keys and held[0]["image"].shape == (4, 16, 16, 3)
    loader.close()
    assert np.array_equal(held[0]["image"], copy)
    del held


@needs_testdata
def test_one_slot_serves_a_for_loop_that_lets_each_batch_go():
    # The loop's own generator names no batch while the next is taken: with prefetch=1, a body
    # that ends in `del batch` gets every batch; one that keeps it is told what to do.
    loader = ringfeed.Loader(WDS, batch_size=4, image_size=16, prefetch=1, epochs=2, workers=2, shuffle=False,
                             framework="numpy")
    keys = []
    for epoch in range(2):
        for batch in loader:
            keys += batch["key"]
            del batch
    assert len(keys) == 180 and keys[:90] == keys[90:] and len(set(keys)) == 90  # two epochs of 90
    loader = ringfeed.Loader(WDS, batch_size=4, image_size=16, prefetch=1, epochs=1, workers=2,
                             framework="numpy")
    with pytest.raises(ringfeed.Error, match=r"DL_EBUSY.*with prefetch=1 end the loop's body with `del batch`"):
        for batch in loader:
            pass
    loader.close()


@needs_testdata
@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_labels_kept_for_metrics_hold_no_slot(framework):
    # As with DataLoader: an evaluation loop keeps every batch's labels; they are copies, so the
    # loader goes on. The images stay views of the slots (the test above holds them).
    if framework == "torch":
        pytest.importorskip("torch")
    with ringfeed.Loader(WDS, batch_size=4, image_size=16, prefetch=2, epochs=1, workers=2, shuffle=False,
                         framework=framework) as loader:
        kept, keys = [], []
        batches = len(loader)
        for batch in loader:
            kept.append(batch["label"])
            keys += batch["key"]
        assert len(kept) == batches > 2
    with ringfeed.Loader(WDS, batch_size=4, image_size=16, workers=1, shuffle=False, framework="numpy") as again:
        labels = np.concatenate([b["label"] for b in again])
    kept = [np.asarray(k) for k in kept]
    assert np.array_equal(np.concatenate(kept), labels) and len(keys) == len(labels)
    assert kept[0].flags.writeable and kept[0].dtype == np.int64 and kept[0].shape == (4,)
    assert len({k.__array_interface__["data"][0] for k in kept}) == len(kept)  # no two share memory


def _rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


@needs_testdata
def test_no_growth_over_many_epochs():
    loader = ringfeed.Loader(WDS, batch_size=16, image_size=32, epochs=40, workers=2, framework="numpy")
    i = -1
    for i, b in enumerate(b for _ in range(40) for b in loader):
        if i == 6 * 5:
            start = _rss_mb()
    assert i + 1 == 40 * 6
    assert _rss_mb() - start < 16
    assert loader.stats()["samples"] == 40 * 90


def test_torchrun_environment_sets_rank_and_world_size(monkeypatch):
    if not os.path.exists(WDS):
        pytest.skip("third-party test data absent")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    keys = set()
    for r in range(3):
        kw = {} if r == 1 else {"rank": r}
        loader = ringfeed.Loader(WDS, batch_size=10, image_size=8, framework="numpy", **kw)
        assert len(loader) == 3
        keys |= {k for b in loader for k in b["key"]}
    assert len(keys) == 90


PNGSUITE = os.path.join(TESTDATA, "pngsuite")


def _pil_reference(path):
    Image = pytest.importorskip("PIL.Image")
    im = Image.open(path)
    if im.mode in ("I", "I;16", "I;16B"):
        a = (np.asarray(im).astype(np.uint32) >> 8).astype(np.uint8)
        return np.stack([a] * 3, axis=-1)
    if im.mode == "LA" or im.mode == "L" or im.mode == "1" or im.mode == "P" or im.mode.startswith("RGB"):
        return np.asarray(im.convert("RGB"))
    raise AssertionError(f"unexpected PIL mode {im.mode} for {path}")


@pytest.mark.skipif(not os.path.isdir(PNGSUITE), reason="third-party test data absent")
@pytest.mark.parametrize("channels", [3, 1])
def test_pngsuite_pixels_against_pil(tmp_path, channels):
    """Every PngSuite image against PIL's pixels: RGB, and grey as PIL's convert("L") makes it
    (ITU-R 601-2 luma, as for JPEG, WebP and pil pixels; libpng's own conversion weighs otherwise)."""
    Image = pytest.importorskip("PIL.Image")
    names = sorted(n for n in os.listdir(PNGSUITE) if n.endswith(".png") and not n.startswith("x"))
    by_size = {}
    for n in names:
        ref = _pil_reference(os.path.join(PNGSUITE, n))
        if channels == 1:
            ref = np.asarray(Image.fromarray(ref).convert("L"))[..., None]
        by_size.setdefault(ref.shape[:2], []).append((n, ref))
    checked = 0
    for (h, w), items in by_size.items():
        shard = tmp_path / f"png-{h}x{w}.tar"
        _tar(shard, [(f"{i:04d}.png", open(os.path.join(PNGSUITE, n), "rb").read())
                     for i, (n, _) in enumerate(items)])
        loader = ringfeed.Loader(str(shard), batch_size=len(items), crop="none", image_size=(h, w),
                                 shuffle=False, workers=2, framework="numpy", channels=channels)
        b = next(loader)
        assert "error" not in b, [items[i][0] for i, e in enumerate(b["error"]) if e]
        for i, (n, ref) in enumerate(items):
            assert np.array_equal(b["image"][i], ref), n
            checked += 1
    assert checked > 100


@needs_testdata
def test_works_without_numpy_or_torch():
    """The binding needs neither: it then hands out DLPack objects any framework can take."""
    import subprocess
    import sys
    code = (
        "import sys\n"
        "sys.modules['numpy'] = None\n"
        "sys.modules['torch'] = None\n"
        f"sys.path.insert(0, {os.path.abspath(os.path.join(os.path.dirname(__file__), '..'))!r})\n"
        "import ringfeed\n"
        f"loader = ringfeed.Loader({WDS!r}, batch_size=10, image_size=16, workers=1)\n"
        "b = next(loader)\n"
        "assert type(b['image']).__name__ == 'DLPackTensor', type(b['image'])\n"
        "assert b['image'].shape == (10, 16, 16, 3) and len(b['key']) == 10\n"
        "print(len(loader), loader.state_dict()['token'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "8"  # 9 batches an epoch, one taken: len() is what the epoch has left


@needs_testdata
def test_cuda_work_queues_asked_for_when_loaded():
    """A CUDA build loaded before CUDA starts, CUDA_DEVICE_MAX_CONNECTIONS unset, asks for 32 hardware
    queues (with CUDA's 8, the loader's GPU work waited behind the model's kernels); a value the user
    set is kept. A build without CUDA leaves the variable alone."""
    code = (
        f"sys_path = {os.path.abspath(os.path.join(os.path.dirname(__file__), '..'))!r}\n"
        "import ctypes, sys\n"
        "sys.path.insert(0, sys_path)\n"
        "import ringfeed\n"
        "libc = ctypes.CDLL(None)\n"
        "libc.getenv.restype = ctypes.c_char_p\n"
        "value = libc.getenv(b'CUDA_DEVICE_MAX_CONNECTIONS')\n"
        "try:\n"
        f"    ringfeed.Loader({WDS!r}, batch_size=10, image_size=16, workers=1, device='cuda:0')\n"
        "    built = 'cuda'\n"
        "except ringfeed.Error as e:\n"
        "    built = 'none' if 'built without CUDA' in e.message else 'cuda'\n"
        "print(built, value.decode() if value else '-')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    unset = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert unset.returncode == 0, unset.stderr
    built, value = unset.stdout.split()
    assert value == ("32" if built == "cuda" else "-")
    env["CUDA_DEVICE_MAX_CONNECTIONS"] = "4"
    kept = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert kept.returncode == 0, kept.stderr
    assert kept.stdout.split() == [built, "4"]
