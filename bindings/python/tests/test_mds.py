"""MosaicML Streaming's MDS datasets read in place: the third-party shards of ../shared/testdata
decoded here by the format's description, datasets written here as MDSWriter writes them (images,
labels, text, JSON, numbers, arrays), and damaged ones, each named."""
import bz2
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import struct
import subprocess
import tarfile

import pytest

import ringfeed
from conftest import TESTDATA

np = pytest.importorskip("numpy")
MDS = os.path.join(TESTDATA, "mds")
needs_testdata = pytest.mark.skipif(not os.path.isdir(MDS), reason="third-party test data absent")
KW = dict(batch_size=4, shuffle=0, framework="numpy", workers=2)

# An ndarray's value types by their number in its own header.
DTYPE_CODES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32", 33: "int32",
               34: "float32", 64: "uint64", 65: "int64", 66: "float64"}
SCALARS = {"int": "int64", **{t: t for t in DTYPE_CODES.values()}}


def read_mds(folder):
    """Every sample of the MDS dataset in FOLDER as {column: value}, read by the format's
    description: n, n + 1 offsets, then per sample the variable columns' sizes and the columns."""
    index = json.load(open(os.path.join(folder, "index.json")))
    out = []
    for sh in index["shards"]:
        data = open(os.path.join(folder, sh["raw_data"]["basename"]), "rb").read()
        n = struct.unpack_from("<I", data)[0]
        offsets = struct.unpack_from(f"<{n + 1}I", data, 4)
        cols = list(zip(sh["column_names"], sh["column_encodings"], sh["column_sizes"]))
        for i in range(n):
            sample = data[offsets[i]:offsets[i + 1]]
            nvar = sum(size is None for _, _, size in cols)
            sizes = iter(struct.unpack_from(f"<{nvar}I", sample))
            at, row = 4 * nvar, {}
            for name, enc, size in cols:
                size = next(sizes) if size is None else size
                row[name] = decode(enc, sample[at:at + size])
                at += size
            out.append(row)
    return out


def decode(enc, raw):
    if enc in SCALARS:
        return np.frombuffer(raw, SCALARS[enc])[0]
    if enc.startswith("ndarray"):
        parts = enc.split(":")
        dtype = parts[1] if len(parts) > 1 else None
        at = 0
        if dtype is None:
            dtype, at = DTYPE_CODES[raw[0]], 1
        if len(parts) > 2:
            shape = tuple(int(d) for d in parts[2].split(","))
        else:
            ndim, width = raw[at] >> 2, 1 << (raw[at] & 3)
            shape = tuple(np.frombuffer(raw[at + 1:at + 1 + ndim * width], f"<u{width}"))
            at += 1 + ndim * width
        return np.frombuffer(raw[at:], dtype).reshape(shape)
    if enc in ("str", "str_int", "str_float", "str_decimal"):
        return raw.decode()
    if enc == "json":
        return json.loads(raw)
    return raw


def encode(enc, value):
    if enc in SCALARS:
        return np.array(value, SCALARS[enc]).tobytes()
    if enc.startswith("ndarray"):
        parts = enc.split(":")
        head = b""
        if len(parts) == 1:
            code = {v: k for k, v in DTYPE_CODES.items()}[value.dtype.name]
            head += bytes([code])
        if len(parts) < 3:
            head += bytes([value.ndim << 2 | 1]) + np.array(value.shape, "<u2").tobytes()
        return head + value.tobytes()
    if enc in ("str", "str_int"):
        return str(value).encode()
    if enc == "json":
        return json.dumps(value).encode()
    return value


def write_mds(folder, columns, samples, per_shard=4, sub=""):
    """An MDS dataset as MDSWriter lays it out: columns in name order, one shard per PER_SHARD
    samples, each holding its settings between the offsets and the samples."""
    os.makedirs(os.path.join(folder, sub), exist_ok=True)
    names = sorted(columns)
    encs = [columns[k] for k in names]
    fixed = {"int": 8, **{t: np.dtype(t).itemsize for t in DTYPE_CODES.values()}}
    sizes = [fixed.get(e) for e in encs]
    shards = []
    for s in range(0, len(samples), per_shard):
        body = []
        for row in samples[s:s + per_shard]:
            parts = [encode(e, row[k]) for k, e in zip(names, encs)]
            head = b"".join(struct.pack("<I", len(p)) for p, size in zip(parts, sizes) if size is None)
            body.append(head + b"".join(parts))
        conf = {"column_encodings": encs, "column_names": names, "column_sizes": sizes, "compression": None,
                "format": "mds", "hashes": [], "samples": len(body), "size_limit": 1 << 26, "version": 2,
                "zip_data": None}
        base = os.path.join(sub, f"shard.{s // per_shard:05d}.mds") if sub else f"shard.{s // per_shard:05d}.mds"
        settings = json.dumps(conf, sort_keys=True).encode()
        start = 4 + 4 * (len(body) + 1) + len(settings)
        offsets = np.cumsum([start] + [len(b) for b in body]).astype("<u4")
        data = struct.pack("<I", len(body)) + offsets.tobytes() + settings + b"".join(body)
        open(os.path.join(folder, base), "wb").write(data)
        shards.append(dict(conf, raw_data={"basename": base, "bytes": len(data), "hashes": {}}))
    json.dump({"shards": shards, "version": 2}, open(os.path.join(folder, "index.json"), "w"))
    return shards


def everything(loader):
    rows = []
    for b in loader:
        for i in range(len(b["key"])):
            rows.append({k: (np.copy(v[i]) if isinstance(v, np.ndarray) else v[i] if isinstance(v, list) else v)
                         for k, v in b.items()})
    return rows


@needs_testdata
@pytest.mark.parametrize("name", ["naive_MDSdataset", "joining-sample_dataset/pet", "joining-sample_dataset/x",
                                  "joining-sample_dataset/y", "joining-sample_dataset/color"])
def test_third_party_shards_read_as_their_format_says(name):
    folder = os.path.join(MDS, name)
    want = read_mds(folder)
    got = everything(ringfeed.Loader(folder, **KW))
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        # Streaming's image datasets name the class y: it is the label, and stays field y too.
        assert g["label"] == (w["y"] if "y" in w else -1)
        for column, value in w.items():
            if isinstance(value, str):
                assert g[column] == value
            else:
                assert np.array_equal(g[column], value) and g[column].dtype == np.asarray(value).dtype
    # The index file itself names the dataset too, and a merged index reads its subfolders' shards.
    assert len(ringfeed.Loader(os.path.join(folder, "index.json"), **KW)) == len(ringfeed.Loader(folder, **KW))


def jpeg(i, size=(40, 30)):
    from PIL import Image
    rng = np.random.default_rng(i)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


COLUMNS = {"image": "jpeg", "label": "int", "caption": "str", "meta": "json", "score": "float32",
           "vec": "ndarray", "box": "ndarray:int16:2,2", "raw": "bytes"}


def rows(n):
    return [{"image": jpeg(i), "label": i % 5, "caption": f"photo {i} ü", "meta": {"i": i, "tags": ["a"] * (i % 3)},
             "score": i / 4, "vec": np.arange(3, dtype=np.float32) + i, "box": np.full((2, 2), i, np.int16),
             "raw": bytes([i]) * (i + 1)} for i in range(n)]


def test_an_mds_dataset_gives_what_a_tar_shard_of_the_same_samples_gives(tmp_path):
    pytest.importorskip("PIL")
    samples = rows(10)
    write_mds(str(tmp_path / "mds"), COLUMNS, samples)
    with tarfile.open(tmp_path / "same.tar", "w") as t:
        for i, row in enumerate(samples):
            for ext, data in (("jpg", row["image"]), ("cls", str(row["label"]).encode())):
                info = tarfile.TarInfo(f"{i:04d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    kw = dict(KW, image_size=24, crop="center", flip=True, seed=3, shuffle=1)
    mds, tar = everything(ringfeed.Loader(str(tmp_path / "mds"), **kw)), everything(ringfeed.Loader(str(tmp_path / "same.tar"), **kw))
    assert [int(r["label"]) for r in mds] == [int(r["label"]) for r in tar]
    for m, t in zip(mds, tar):
        assert np.array_equal(m["image"], t["image"])
        i = int(m["key"].rsplit(":", 1)[1]) + 4 * int(m["key"].split(".")[1])
        want = samples[i]
        assert m["label"] == want["label"] and m["caption"] == want["caption"] and m["meta"] == want["meta"]
        assert m["score"] == np.float32(want["score"]) and np.array_equal(m["vec"], want["vec"])
        assert m["box"].dtype == np.int16 and np.array_equal(m["box"], want["box"]) and m["raw"] == want["raw"]


def pil_value(img):
    """A "pil" column's value: width, height, the mode's length, the mode, then img.tobytes()."""
    mode = img.mode.encode()
    return struct.pack("<III", img.width, img.height, len(mode)) + mode + img.tobytes()


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA"])
@pytest.mark.parametrize("channels", [3, 1])
def test_pil_pixels_give_what_the_same_pixels_as_png_give(tmp_path, mode, channels):
    """Raw pixels of a pil column against the same pixels stored as PNG in a tar shard; for grey
    output from colour, PIL's own convert("L") (BT.601, as the loader takes it)."""
    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(7)
    images = [Image.fromarray(rng.integers(0, 255, (20 + i, 30 + 2 * i, 4), dtype=np.uint8), "RGBA").convert(mode)
              for i in range(5)]
    write_mds(str(tmp_path / "mds"), {"image": "pil", "label": "int"},
              [{"image": pil_value(im), "label": i} for i, im in enumerate(images)])
    with tarfile.open(tmp_path / "png.tar", "w") as t:
        for i, im in enumerate(images):
            ref = im.convert("L") if channels == 1 else im.convert("RGB")
            buf = io.BytesIO()
            ref.save(buf, format="PNG")
            for ext, data in (("png", buf.getvalue()), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"{i:04d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    kw = dict(KW, image_size=16, crop="random_resized", flip=True, seed=5, channels=channels)
    got, want = everything(ringfeed.Loader(str(tmp_path / "mds"), **kw)), everything(ringfeed.Loader(str(tmp_path / "png.tar"), **kw))
    assert len(got) == 5 and [int(r["label"]) for r in got] == [int(r["label"]) for r in want]
    for g, w in zip(got, want):
        assert np.array_equal(g["image"], w["image"])


def test_pil_pixels_of_other_modes_or_sizes_are_sample_errors(tmp_path, capfd):
    Image = pytest.importorskip("PIL.Image")
    rgb = Image.new("RGB", (4, 3), (1, 2, 3))
    values = [pil_value(rgb.convert("P")), pil_value(rgb)[:-1], pil_value(rgb), struct.pack("<III", 0, 3, 3) + b"RGB"]
    write_mds(str(tmp_path), {"image": "pil"}, [{"image": v} for v in values])
    got = everything(ringfeed.Loader(str(tmp_path), **dict(KW, image_size=4, crop="resize")))
    assert [int(r["image"].max()) for r in got] == [0, 0, 3, 0]
    err = capfd.readouterr().err
    assert "sample 0" in err and "mode 'P'" in err and "sample 1" in err and "the value holds 35" in err
    assert "sample 3" in err and "0x3" in err


def test_jpegs_kept_as_bytes_in_an_image_column_are_the_image(tmp_path):
    write_mds(str(tmp_path), {"image": "bytes", "label": "int"}, [{"image": jpeg(i), "label": i} for i in range(3)])
    got = everything(ringfeed.Loader(str(tmp_path), **dict(KW, image_size=8)))
    assert [r["image"].shape for r in got] == [(8, 8, 3)] * 3 and [int(r["label"]) for r in got] == [0, 1, 2]
    assert all("image_" not in r for r in got)


def test_varying_arrays_pad_and_fields_select(tmp_path):
    samples = [{"vec": np.arange(i + 1, dtype=np.int32), "caption": str(i)} for i in range(6)]
    write_mds(str(tmp_path), {"vec": "ndarray:int32", "caption": "str"}, samples)
    with pytest.raises(ringfeed.Error, match="pad=1"):
        everything(ringfeed.Loader(str(tmp_path), **dict(KW, on_error="fail")))
    got = everything(ringfeed.Loader(str(tmp_path), pad=1, **KW))
    assert [int(r["vec_len"]) for r in got] == list(range(1, 7))
    assert all(np.array_equal(r["vec"][:i + 1], np.arange(i + 1)) for i, r in enumerate(got))
    only = next(iter(ringfeed.Loader(str(tmp_path), fields="caption", **KW)))
    assert "vec" not in only and only["caption"] == ["0", "1", "2", "3"]


def test_columns_past_the_fields_a_dataset_holds_are_named(tmp_path, capfd):
    columns = {"label": "int", **{f"c{k:02d}": "str" for k in range(17)}}
    write_mds(str(tmp_path), columns, [{"label": i, **{f"c{k:02d}": str(k) for k in range(17)}} for i in range(3)])
    got = everything(ringfeed.Loader(str(tmp_path), log="warn", **KW))
    assert [int(r["label"]) for r in got] == [0, 1, 2] and all(r["c15"] == "15" and "c16" not in r for r in got)
    assert "column c16: left out, a dataset has at most 16 distinct fields" in capfd.readouterr().err


def test_sample_tables_are_cached_and_follow_the_index(tmp_path, monkeypatch):
    """Each shard's sample table is kept like a tar index: beside it, or in the cache folder when
    the dataset's folder is marked read-only. An index.json edited since (a column renamed) is read
    as it now is."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    data = tmp_path / "data"
    write_mds(str(data), {"label": "int", "caption": "str"}, [{"label": i, "caption": f"c{i}"} for i in range(6)])
    first = everything(ringfeed.Loader(str(data), **KW))
    assert sorted(p.name for p in data.glob("*.rfidx")) == ["shard.00000.mds.rfidx", "shard.00001.mds.rfidx"]
    assert everything(ringfeed.Loader(str(data), **KW)) == first
    index = json.loads((data / "index.json").read_text())
    for shard in index["shards"]:
        shard["column_names"] = ["text" if n == "caption" else n for n in shard["column_names"]]
    (data / "index.json").write_text(json.dumps(index))
    renamed = everything(ringfeed.Loader(str(data), **KW))
    assert [r["text"] for r in renamed] == [f"c{i}" for i in range(6)] and all("caption" not in r for r in renamed)
    marked = tmp_path / "marked"
    write_mds(str(marked), {"label": "int"}, [{"label": i} for i in range(3)])
    marked.chmod(0o555)
    try:
        assert [int(r["label"]) for r in everything(ringfeed.Loader(str(marked), **KW))] == [0, 1, 2]
        assert not list(marked.glob("*.rfidx")) and list((tmp_path / "cache" / "ringfeed").glob("*.mds.rfidx"))
    finally:
        marked.chmod(0o755)


def test_a_column_of_two_types_across_datasets_is_refused(tmp_path):
    write_mds(str(tmp_path / "a"), {"v": "ndarray:int32"}, [{"v": np.ones(2, np.int32)}])
    write_mds(str(tmp_path / "b"), {"v": "ndarray:float32"}, [{"v": np.ones(2, np.float32)}])
    with pytest.raises(ringfeed.Error, match="column v is 'ndarray:float32', unlike the shards before it"):
        ringfeed.Loader(f"{tmp_path / 'a'}::{tmp_path / 'b'}", **KW)
    both = everything(ringfeed.Loader(f"{tmp_path / 'a'}::{tmp_path / 'a'}", **KW))
    assert len(both) == 2 and all(r["v"].dtype == np.int32 for r in both)


def test_a_dataset_without_a_column_the_batch_needs_is_refused_at_open(tmp_path):
    """Every sample of a shard that lacks a tensor column or the image would fail one by one: the
    open says so once, naming the shard, the column and where it is."""
    pytest.importorskip("PIL")
    write_mds(str(tmp_path / "a"), {"v": "ndarray:int32"}, [{"v": np.ones(2, np.int32)}] * 3)
    write_mds(str(tmp_path / "b"), {"v": "ndarray:int32", "w": "int"}, [{"v": np.ones(2, np.int32), "w": 1}] * 3)
    write_mds(str(tmp_path / "c"), {"image": "jpeg", "v": "ndarray:int32"},
              [{"image": jpeg(i), "v": np.ones(2, np.int32)} for i in range(3)])
    with pytest.raises(ringfeed.Error, match=r"DL_ENOFIELD: MDS index .*a/index.json: shard shard.00000.mds has "
                                             r"no column w, a tensor field of .*b/shard.00000.mds"):
        ringfeed.Loader([str(tmp_path / "a"), str(tmp_path / "b")], **KW)
    with pytest.raises(ringfeed.Error, match=r"a/index.json: shard shard.00000.mds has no image column, while "
                                             r".*c/shard.00000.mds holds images"):
        ringfeed.Loader([str(tmp_path / "c"), str(tmp_path / "a")], **dict(KW, image_size=16))
    # The fields both hold are read from both; bytes columns may be absent (None) as before.
    got = everything(ringfeed.Loader([str(tmp_path / "a"), str(tmp_path / "b")], **dict(KW, fields="v")))
    assert len(got) == 6 and all(np.array_equal(r["v"], [1, 1]) for r in got)


def damaged(tmp_path, how):
    folder = str(tmp_path / how)
    shards = write_mds(folder, {"image": "jpeg", "label": "int", "caption": "str"}, rows(8))
    path = os.path.join(folder, shards[0]["raw_data"]["basename"])
    data = bytearray(open(path, "rb").read())
    n = struct.unpack_from("<I", data)[0]
    offsets = list(struct.unpack_from(f"<{n + 1}I", data, 4))
    if how == "truncated":
        data = data[:offsets[2] + 10]
    elif how == "sizes":  # sample 1's image size made larger than the sample
        struct.pack_into("<I", data, offsets[1] + 4, 10 ** 6)
    elif how == "order":
        struct.pack_into("<I", data, 4 + 4 * 2, offsets[1] - 1)
    open(path, "wb").write(data)
    return folder


@pytest.mark.parametrize("how,left,why", [("truncated", 6, "past the end of the file"),
                                          ("sizes", 7, "add up to more than its length"),
                                          ("order", 6, "offsets are out of order")])
def test_damaged_samples_are_left_out_and_named(tmp_path, how, left, why, capfd):
    pytest.importorskip("PIL")
    folder = damaged(tmp_path, how)
    loader = ringfeed.Loader(folder, **dict(KW, image_size=16))
    assert sum(len(b["key"]) for b in loader) == left
    err = capfd.readouterr().err
    assert "shard.00000.mds" in err and why in err and "left out" in err
    with pytest.raises(ringfeed.Error) as e:
        ringfeed.Loader(folder, **dict(KW, on_error="fail"))
    assert e.value.name == "DL_ECORRUPT" and why in str(e.value) and "shard.00000.mds sample" in str(e.value)


def test_a_damaged_value_is_a_sample_error_naming_shard_and_sample(tmp_path, capfd):
    folder = str(tmp_path)
    shards = write_mds(folder, {"vec": "ndarray", "n": "int32"}, [{"vec": np.ones(3, np.float32), "n": i} for i in range(4)])
    path = os.path.join(folder, shards[0]["raw_data"]["basename"])
    data = bytearray(open(path, "rb").read())
    offsets = struct.unpack_from("<5I", data, 4)
    data[offsets[2] + 4 + 4] = 99  # sample 2's dtype number (after its size and the int32)
    open(path, "wb").write(data)
    got = everything(ringfeed.Loader(folder, **KW))
    assert [int(r["n"]) for r in got] == [0, 1, 0, 3]  # the substitute is zeros
    err = capfd.readouterr().err
    assert "shard.00000.mds" in err and "sample 2" in err and "unknown dtype number" in err


@pytest.mark.parametrize("index,why", [
    ("{", "malformed JSON"),
    ('{"version": 2}', 'no "shards" list'),
    ('{"shards": [{"format": "jsonl", "version": 2}]}', "format 'jsonl'"),
    ('{"shards": [{"format": "mds", "version": 3}]}', "version 3"),
    ('{"shards": [{"format": "mds", "version": 2, "column_names": ["a"], "column_encodings": ["int"],'
     ' "column_sizes": [4], "raw_data": {"basename": "s.mds"}, "samples": 1}]}', "malformed"),
    ('{"shards": [{"format": "mds", "version": 2, "column_names": ["a"], "column_encodings": ["str"],'
     ' "column_sizes": [null], "raw_data": {"basename": "../s.mds"}, "samples": 1}]}', "outside the dataset"),
    ('{"shards": [{"format": "mds", "version": 2, "column_names": ["a"], "column_encodings": ["str"],'
     ' "column_sizes": [null], "raw_data": {"basename": "s.mds"}, "zip_data": {"basename": "s.mds.zstd"},'
     ' "compression": "zstd", "samples": 1}]}', "gives no uncompressed size (raw_data bytes)"),
    ('{"shards": [{"format": "mds", "version": 2, "column_names": ["a", "a"], "column_encodings": ["str", "int"],'
     ' "column_sizes": [null, 4], "raw_data": {"basename": "s.mds"}, "samples": 1}]}', "names column a twice"),
])
def test_a_bad_index_is_named_with_its_reason(tmp_path, index, why):
    (tmp_path / "index.json").write_text(index)
    with pytest.raises(ringfeed.Error) as e:  # named as an index: a folder's says "shards" to be one
        ringfeed.Loader(str(tmp_path / "index.json") if '"shards"' not in index else str(tmp_path), **KW)
    assert why in str(e.value) and ("index.json" in str(e.value) or "s.mds.zstd" in str(e.value))


def test_an_image_folder_with_an_index_json_of_its_own_stays_an_image_folder(tmp_path):
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "a.jpg").write_bytes(jpeg(1))
    (tmp_path / "index.json").write_text('{"images": ["cat/a.jpg"]}')
    got = everything(ringfeed.Loader(str(tmp_path), **dict(KW, image_size=8)))
    assert len(got) == 1 and got[0]["label"] == 0


def test_a_remote_mds_shard_alone_is_refused_with_what_to_do():
    """(Remote datasets are read through their index.json: tests/remote/test_mds_remote.py.)"""
    with pytest.raises(ringfeed.Error, match="read through its dataset's index.json"):
        ringfeed.Loader("s3://bucket/data/shard.00000.mds", **KW)


@needs_testdata
def test_zstd_compressed_shards_are_read_as_their_uncompressed_copy(tmp_path):
    """Streaming's compression='zstd' keeps only shard.NNNNN.mds.zstd: decompressed at open into a
    temporary file, the same samples (and keys) as the shard uncompressed by zstd itself."""
    zipped = tmp_path / "zipped"
    shutil.copytree(os.path.join(MDS, "my-copy-arxiv"), zipped)
    plain = tmp_path / "plain"
    shutil.copytree(zipped, plain)
    subprocess.run(["zstd", "-q", "-d", "--rm", str(plain / "shard.00000.mds.zstd")], check=True)
    want = read_mds(str(plain))
    got = everything(ringfeed.Loader(str(zipped), **KW))
    assert len(got) == len(want) == 173
    assert all(np.array_equal(g["tokens"], w["tokens"]) for g, w in zip(got, want))
    assert [g["key"] for g in got] == [g["key"] for g in everything(ringfeed.Loader(str(plain), **KW))]


@needs_testdata
def test_with_cache_dir_the_uncompressed_copy_is_made_once(tmp_path):
    """cache_dir keeps the uncompressed copies (local datasets too): a later open reads the same
    entry (not rewritten: the same inode, its use time renewed); a changed shard gets a new one."""
    zipped = tmp_path / "zipped"
    shutil.copytree(os.path.join(MDS, "my-copy-arxiv"), zipped)
    cache = tmp_path / "cache"
    want = everything(ringfeed.Loader(str(zipped), **KW))
    got = everything(ringfeed.Loader(str(zipped), cache_dir=str(cache), **KW))
    assert [g["key"] for g in got] == [w["key"] for w in want]
    assert all(np.array_equal(g["tokens"], w["tokens"]) for g, w in zip(got, want))
    entries = [p for p in cache.iterdir() if p.name.endswith("-shard.00000.mds")]
    assert len(entries) == 1
    unpacked = subprocess.run(["zstd", "-dc", str(zipped / "shard.00000.mds.zstd")], check=True,
                              capture_output=True).stdout
    assert entries[0].read_bytes() == unpacked
    inode = entries[0].stat().st_ino
    os.utime(entries[0], (1000, 1000))
    again = everything(ringfeed.Loader(str(zipped), cache_dir=str(cache), **KW))
    assert [g["key"] for g in again] == [w["key"] for w in want]
    assert entries[0].stat().st_ino == inode and entries[0].stat().st_mtime > 1000
    os.utime(zipped / "shard.00000.mds.zstd", (2000, 2000))  # another version of the shard
    ringfeed.Loader(str(zipped), cache_dir=str(cache), **KW).close()
    assert len([p for p in cache.iterdir() if p.name.endswith("-shard.00000.mds")]) == 2
    with pytest.raises(ringfeed.Error, match="the source is on local disk"):  # nothing to keep
        ringfeed.Loader(os.path.join(MDS, "naive_MDSdataset"), cache_dir=str(cache), **KW)


def zstd_bytes(data):
    return subprocess.run(["zstd", "-q", "-c"], input=data, check=True, capture_output=True).stdout


# Each as Streaming compresses a shard for compression='zstd', 'gz' and 'bz2'.
CODECS = {"zstd": zstd_bytes, "gz": gzip.compress, "bz2": bz2.compress}


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_a_damaged_or_other_compression_is_named(tmp_path, codec):
    write_mds(str(tmp_path / "ok"), {"label": "int", "caption": "str"}, [{"label": i, "caption": "x" * i} for i in range(4)])
    index = json.loads((tmp_path / "ok" / "index.json").read_text())
    raw = (tmp_path / "ok" / "shard.00000.mds").read_bytes()
    zipped = CODECS[codec](raw)
    name = f"shard.00000.mds.{codec}"

    def dataset(folder, data, compression=codec, raw_bytes=len(raw)):
        folder = tmp_path / folder
        folder.mkdir()
        sh = dict(index["shards"][0], compression=compression,
                  raw_data={"basename": "shard.00000.mds", "bytes": raw_bytes, "hashes": {}},
                  zip_data={"basename": name, "bytes": len(data), "hashes": {}})
        (folder / "index.json").write_text(json.dumps({"shards": [sh], "version": 2}))
        (folder / name).write_bytes(data)
        return str(folder)

    labels = lambda src: [int(r["label"]) for r in everything(ringfeed.Loader(src, **KW))]
    assert labels(dataset("good", zipped, codec + ":7")) == [0, 1, 2, 3]
    # Two streams one after the other (zstd frames, gzip members, bzip2 streams) are one shard.
    half = len(raw) // 2
    assert labels(dataset("two", CODECS[codec](raw[:half]) + CODECS[codec](raw[half:]))) == [0, 1, 2, 3]
    other = "gz" if codec != "gz" else "bz2"
    for folder, data, kw, why in [
            ("cut", zipped[:-9], {}, f"{name}: its {codec} data ends early (truncated?)"),
            ("noise", zipped[:20] + bytes(40) + zipped[60:], {}, f"{name}: {codec}: "),
            ("small", zipped, {"raw_bytes": len(raw) - 1}, "decompresses to more than the"),
            ("large", zipped, {"raw_bytes": len(raw) + 1}, f"decompresses to {len(raw)} bytes, its index gives"),
            ("other", CODECS[other](raw), {}, f"{name}: {codec}: "),
            ("br", zipped, {"compression": "br"}, "is compressed with br: zstd, gz and bz2 shards are read")]:
        with pytest.raises(ringfeed.Error, match=re.escape(why)):
            ringfeed.Loader(dataset(folder, data, **kw), **KW)


def test_dlshard_converts_an_mds_dataset_to_the_same_stream(tmp_path):
    pytest.importorskip("PIL")
    dlshard, dlbench = os.environ.get("DL_DLSHARD"), os.environ.get("DL_DLBENCH")
    if not dlshard or not dlbench:
        pytest.skip("DL_DLSHARD / DL_DLBENCH not set")
    write_mds(str(tmp_path / "mds"), COLUMNS, rows(9))
    subprocess.run([dlshard, "create", str(tmp_path / "rfs" / "x"), str(tmp_path / "mds")], check=True,
                   capture_output=True)
    digest = [[line for line in subprocess.run([dlbench, src, "--workers", "2", "--batch", "4", "--size", "16",
                                                "--digest"], check=True, capture_output=True, text=True).stdout.splitlines()
               if line.startswith("batch ")] for src in (str(tmp_path / "mds"), str(tmp_path / "rfs" / "x-000000.rfs"))]
    assert digest[0] == digest[1] and len(digest[0]) == 3
    fields = everything(ringfeed.Loader(str(tmp_path / "rfs" / "x-000000.rfs"), **dict(KW, image_size=16)))
    assert [int(r["label"]) for r in fields] == [i % 5 for i in range(9)]
    assert np.array_equal(fields[4]["box"], np.full((2, 2), 4, np.int16)) and fields[4]["vec"][0] == 4
    # str and json columns keep their kind in the ringfeed shard; bytes stay bytes
    want = rows(9)
    assert [r["caption"] for r in fields] == [w["caption"] for w in want]
    assert [r["meta"] for r in fields] == [w["meta"] for w in want]
    assert [r["raw"] for r in fields] == [w["raw"] for w in want]


@pytest.mark.parametrize("channels", [3, 1])
def test_dlshard_converts_pil_pixels_to_png_with_the_same_stream(tmp_path, channels):
    """Ringfeed shards keep a pil column's raw pixels as PNG (lossless): the converted shard gives
    the same bytes as the MDS dataset, in all four modes; a mode the loader does not read stops the
    conversion naming the sample."""
    Image = pytest.importorskip("PIL.Image")
    dlshard = os.environ.get("DL_DLSHARD")
    if not dlshard:
        pytest.skip("DL_DLSHARD not set")
    rng = np.random.default_rng(3)
    images = [Image.fromarray(rng.integers(0, 255, (20 + i, 30 + i, 4), dtype=np.uint8), "RGBA").convert(mode)
              for i, mode in enumerate(["RGB", "RGBA", "L", "LA"] * 2)]
    write_mds(str(tmp_path / "mds"), {"image": "pil", "label": "int"},
              [{"image": pil_value(im), "label": i} for i, im in enumerate(images)])
    subprocess.run([dlshard, "create", str(tmp_path / "rfs" / "x"), str(tmp_path / "mds")], check=True,
                   capture_output=True)
    kw = dict(KW, image_size=16, crop="random_resized", flip=True, seed=5, channels=channels)
    got = everything(ringfeed.Loader(str(tmp_path / "rfs" / "x-000000.rfs"), **kw))
    want = everything(ringfeed.Loader(str(tmp_path / "mds"), **kw))
    assert len(got) == len(want) == 8 and all("error" not in g for g in got)
    for g, w in zip(got, want):
        assert int(g["label"]) == int(w["label"]) and np.array_equal(g["image"], w["image"])
    write_mds(str(tmp_path / "bad"), {"image": "pil"}, [{"image": pil_value(images[0].convert("P"))}])
    out = subprocess.run([dlshard, "create", str(tmp_path / "out" / "y"), str(tmp_path / "bad"), "--strict"],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "shard.00000.mds member sample 0" in out.stderr and "mode 'P'" in out.stderr, \
        out.stderr


def test_dlshard_verify_and_ls_read_an_mds_dataset(tmp_path):
    pytest.importorskip("PIL")
    dlshard = os.environ.get("DL_DLSHARD")
    if not dlshard:
        pytest.skip("DL_DLSHARD not set")
    run = lambda *a: subprocess.run([dlshard, *a], capture_output=True, text=True)
    good = str(tmp_path / "good")
    write_mds(good, COLUMNS, rows(9))
    v = run("verify", good)
    assert v.returncode == 0 and v.stdout.splitlines()[-1] == "3 shards verified: ok", v.stdout + v.stderr
    assert run("verify", os.path.join(good, "index.json")).returncode == 0
    ls = run("ls", good, "-v")
    assert ls.returncode == 0 and ls.stdout.startswith(f"{good}: MDS dataset, 9 samples (9 with an image) in 3 files")
    assert "  field vec" in ls.stdout and len([x for x in ls.stdout.splitlines() if " label " in x]) == 9

    # Damage of three kinds: a record past the end of its shard, a JPEG cut short, an ndarray's dtype.
    bad = str(tmp_path / "bad")
    shards = write_mds(bad, {"image": "jpeg", "label": "int", "vec": "ndarray"},
                       [{"image": jpeg(i), "label": i, "vec": np.ones(2, np.float32)} for i in range(8)])
    first, second = (os.path.join(bad, s["raw_data"]["basename"]) for s in shards)
    data = bytearray(open(first, "rb").read())
    offsets = struct.unpack_from("<5I", data, 4)
    open(first, "wb").write(data[:offsets[3] + 10])  # samples 3 gone past the end
    data = bytearray(open(second, "rb").read())
    offsets = struct.unpack_from("<5I", data, 4)
    # Sample 5 (the second shard's 1): its JPEG's entropy-coded data overwritten near its end;
    # sample 6: the ndarray's dtype number (after two sizes, the image and the label) made unknown.
    image_at = offsets[1] + 8
    size = struct.unpack_from("<I", data, offsets[1])[0]
    data[image_at + size // 2:image_at + size - 2] = b"\xff" * (size - 2 - size // 2)
    image6 = struct.unpack_from("<I", data, offsets[2])[0]
    data[offsets[2] + 8 + image6 + 8] = 99
    open(second, "wb").write(data)
    v = run("verify", bad)
    assert v.returncode == 1, v.stdout + v.stderr
    assert "shard.00000.mds: 1 of its 4 samples left out (sample 3: past the end of the file)" in v.stderr
    lines = v.stdout.splitlines()
    assert any("shard.00001.mds: sample shard.00001.mds:1: " in x for x in lines), v.stdout
    assert any("sample shard.00001.mds:2: field vec: " in x and "dtype" in x for x in lines), v.stdout
    assert lines[-1] == "3 bad records", v.stdout
    ls = run("ls", bad)
    assert ls.returncode == 0 and "7 samples" in ls.stdout and "1 left out as damaged" in ls.stdout


def test_dlshard_verify_checks_the_digests_an_mds_index_records(tmp_path):
    """MDSWriter(hashes=[...]) records each shard file's digests in index.json (raw_data, and
    zip_data when compressed); verify checks every one it knows the algorithm of."""
    dlshard = os.environ.get("DL_DLSHARD")
    if not dlshard:
        pytest.skip("DL_DLSHARD not set")
    xxhash = pytest.importorskip("xxhash")
    algos = {"md5": hashlib.md5, "sha1": hashlib.sha1, "sha256": hashlib.sha256, "sha3_256": hashlib.sha3_256,
             "blake2b": hashlib.blake2b, "blake2s": hashlib.blake2s, "xxh32": xxhash.xxh32, "xxh64": xxhash.xxh64,
             "xxh3_64": xxhash.xxh3_64, "xxh128": xxhash.xxh128, "xxh3_128": xxhash.xxh3_128}
    folder = tmp_path / "mds"
    write_mds(str(folder), {"label": "int", "caption": "str"}, [{"label": i, "caption": "x" * i} for i in range(8)])
    index = json.loads((folder / "index.json").read_text())
    for sh in index["shards"]:
        data = (folder / sh["raw_data"]["basename"]).read_bytes()
        sh["hashes"] = sorted(algos)
        sh["raw_data"]["hashes"] = {a: f(data).hexdigest() for a, f in algos.items()}
    # The first shard kept only compressed, as compression="zstd" leaves it: its zip's digest is
    # checked; its raw file is not there to check.
    first = index["shards"][0]
    zipped = zstd_bytes((folder / "shard.00000.mds").read_bytes())
    (folder / "shard.00000.mds.zstd").write_bytes(zipped)
    (folder / "shard.00000.mds").unlink()
    first.update(compression="zstd", zip_data={"basename": "shard.00000.mds.zstd", "bytes": len(zipped),
                                               "hashes": {"sha1": hashlib.sha1(zipped).hexdigest()}})
    index["shards"][1]["raw_data"]["hashes"].update(whirlpool="00", sha512=None)  # unknown; not a digest
    (folder / "index.json").write_text(json.dumps(index))
    # The loader reads the dataset whatever the digests hold (it does not check them).
    assert len(everything(ringfeed.Loader(str(folder), **KW))) == 8
    run = lambda: subprocess.run([dlshard, "verify", str(folder)], capture_output=True, text=True)
    v = run()
    assert v.returncode == 0, v.stdout + v.stderr
    assert f"{folder}: 12 digests of its shard files checked, all as recorded" in v.stdout
    assert "shard.00001.mds: its 'whirlpool' digest is not checked" in v.stdout
    # One byte of the second shard changed (a caption's last letter): every sample still reads,
    # but no digest of the file is as recorded.
    second = folder / "shard.00001.mds"
    data = bytearray(second.read_bytes())
    data[-1] ^= 1
    second.write_bytes(bytes(data))
    v = run()
    assert v.returncode == 1, v.stdout + v.stderr
    wrong = [x for x in v.stdout.splitlines() if "but the index records" in x]
    assert len(wrong) == 11 and all(x.startswith(f"{second}: ") for x in wrong), v.stdout
    want = hashlib.sha1(bytes(data)).hexdigest()
    assert f"{second}: sha1 digest {want}, but the index records {index['shards'][1]['raw_data']['hashes']['sha1']}" in v.stdout
    assert v.stdout.splitlines()[-1] == "11 bad records", v.stdout
    # A FIFO where the compressed shard should be is named (by the load and by the digest check),
    # not waited on for a writer; "hashes" that is no object leaves the rest of the index readable.
    (folder / "shard.00000.mds.zstd").unlink()
    os.mkfifo(folder / "shard.00000.mds.zstd")
    index["shards"][1]["raw_data"]["hashes"] = ["sha1"]
    (folder / "index.json").write_text(json.dumps(index))
    v = subprocess.run([dlshard, "verify", str(folder)], capture_output=True, text=True, timeout=60)
    assert v.returncode == 1 and "shard.00000.mds.zstd: not a regular file" in v.stdout, v.stdout + v.stderr


def test_dlshard_verify_reads_an_image_folder(tmp_path):
    pytest.importorskip("PIL")
    dlshard = os.environ.get("DL_DLSHARD")
    if not dlshard:
        pytest.skip("DL_DLSHARD not set")
    for c in ("cat", "dog"):
        (tmp_path / c).mkdir()
        for i in range(3):
            (tmp_path / c / f"{i}.jpg").write_bytes(jpeg(i))
    v = subprocess.run([dlshard, "verify", str(tmp_path)], capture_output=True, text=True)
    assert v.returncode == 0 and v.stdout.strip() == "6 images verified: ok", v.stdout + v.stderr
    (tmp_path / "dog" / "1.jpg").write_bytes(jpeg(1)[:200])
    v = subprocess.run([dlshard, "verify", str(tmp_path)], capture_output=True, text=True)
    assert v.returncode == 1 and "1.jpg" in v.stdout and v.stdout.splitlines()[-1] == "1 bad record", v.stdout
    # Beside shards: both counted, each by its name.
    mds = str(tmp_path.parent / (tmp_path.name + "-mds"))
    write_mds(mds, COLUMNS, rows(9))
    v = subprocess.run([dlshard, "verify", mds, str(tmp_path)], capture_output=True, text=True)
    assert "3 shards and 6 images verified: damaged (see above)" in v.stdout, v.stdout
