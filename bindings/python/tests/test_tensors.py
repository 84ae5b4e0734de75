"""Tensor fields: .npy and .npy.zst members of tar shards and raw fields of ringfeed shards become
batch tensors of their own dtype, bit-exact; pad=1 pads a varying leading dimension and adds
<field>_len; token files give windows equal to a numpy reference; zstd golden frames decode or fail
cleanly."""

import io
import os
import shutil
import subprocess
import tarfile

import pytest

import ringfeed
from conftest import TESTDATA

np = pytest.importorskip("numpy")


def npy_bytes(a):
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def zstd(data):
    if not shutil.which("zstd"):
        pytest.skip("zstd command absent")
    return subprocess.run(["zstd", "-q", "-c", "-3"], input=data, capture_output=True, check=True).stdout


def write_tar(path, members):
    with tarfile.open(path, "w") as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))


def copies(batch):
    return {k: (v.copy() if hasattr(v, "copy") else v) for k, v in batch.items()}


def test_npy_and_zstd_members_come_back_bit_exact(tmp_path):
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((5, 3)).astype(np.float32) for _ in range(12)]
    ys = [rng.integers(-9, 9, 7).astype(np.int64) for _ in range(12)]
    members = []
    for i in range(12):
        members += [(f"s{i:03d}.x.npy", npy_bytes(xs[i])), (f"s{i:03d}.y.npy.zst", zstd(npy_bytes(ys[i]))),
                    (f"s{i:03d}.cls", str(i).encode())]
    shard = tmp_path / "t.tar"
    write_tar(shard, members)
    loader = ringfeed.Loader(str(shard), batch_size=5, shuffle=False, framework="numpy", workers=2)
    batches = [copies(b) for b in loader]
    assert [b["x"].shape for b in batches] == [(5, 5, 3), (5, 5, 3), (2, 5, 3)]
    assert "image" not in batches[0]
    x = np.concatenate([b["x"] for b in batches])
    y = np.concatenate([b["y"] for b in batches])
    assert x.dtype == np.float32 and y.dtype == np.int64
    assert np.array_equal(x, np.stack(xs)) and np.array_equal(y, np.stack(ys))
    assert np.concatenate([b["label"] for b in batches]).tolist() == list(range(12))


def test_pad_pads_varying_leading_dimensions(tmp_path):
    seqs = [np.arange(2 * n, dtype=np.int16).reshape(n, 2) + 100 * n for n in (3, 1, 6, 4)]
    shard = tmp_path / "v.tar"
    write_tar(shard, [(f"k{i}.seq.npy", npy_bytes(a)) for i, a in enumerate(seqs)])
    b = next(ringfeed.Loader(str(shard), batch_size=4, shuffle=False, pad=True, framework="numpy", workers=1))
    assert b["seq"].shape == (4, 6, 2) and b["seq"].dtype == np.int16
    assert b["seq_len"].tolist() == [3, 1, 6, 4]
    for i, a in enumerate(seqs):
        assert np.array_equal(b["seq"][i, : len(a)], a) and not b["seq"][i, len(a):].any()
    with pytest.raises(ringfeed.Error) as e:
        list(ringfeed.Loader(str(shard), batch_size=4, shuffle=False, on_error="fail", log="quiet",
                             framework="numpy"))
    assert "pad=1" in e.value.message and "k" in e.value.message
    assert "field seq: 1x2 int16, the batch holds 3x2 int16 (pad=1" in e.value.message, e.value.message
    # another type: named as numpy names it, and pad would not help
    write_tar(shard, [("k0.seq.npy", npy_bytes(seqs[0])), ("k1.seq.npy", npy_bytes(seqs[0].astype(np.float32)))])
    with pytest.raises(ringfeed.Error) as e:
        list(ringfeed.Loader(str(shard), batch_size=2, shuffle=False, on_error="fail", log="quiet",
                             framework="numpy"))
    assert e.value.message.endswith("field seq: 3x2 float32, the batch holds 3x2 int16"), e.value.message


def test_raw_fields_of_ringfeed_shards(tmp_path):
    rng = np.random.default_rng(2)
    arrays = [rng.integers(0, 255, (16, 16, 4)).astype(np.uint8) for _ in range(9)]
    path = tmp_path / "r.rfs"
    with ringfeed.Writer(str(path)) as w:
        for i, a in enumerate(arrays):
            w.add(f"rec{i}", label=i, fields={"depth": ("zstd", npy_bytes(a)), "meta": ("raw", npy_bytes(np.array([i, -i])))})
    got = [copies(b) for b in ringfeed.Loader(str(path), batch_size=4, shuffle=False, framework="numpy", workers=2)]
    depth = np.concatenate([b["depth"] for b in got])
    assert np.array_equal(depth, np.stack(arrays))
    assert np.concatenate([b["meta"] for b in got]).tolist() == [[i, -i] for i in range(9)]
    assert [k for b in got for k in b["key"]] == [f"rec{i}" for i in range(9)]


def test_text_and_json_fields_of_ringfeed_shards_keep_their_kind(tmp_path):
    """"text" and "json" fields come back as str and parsed JSON whatever their names; "bytes" by its
    name's extension, as a tar member."""
    path = tmp_path / "t.rfs"
    with ringfeed.Writer(str(path)) as w:
        for i in range(5):
            w.add(f"rec{i}", label=i, fields={"caption": ("text", f"photo {i} \u00fc"), "meta": ("json", {"i": i, "t": [1] * i}),
                                              "blob": ("bytes", bytes([i, 0])), "notes.txt": ("bytes", b"n%d" % i)})
        # Values these kinds cannot hold are refused before the record starts; the writer goes on.
        with pytest.raises(TypeError, match="a text field takes a str"):
            w.add("bad", fields={"caption": ("text", np.arange(3))})
        with pytest.raises(TypeError):
            w.add("bad", fields={"meta": ("json", object())})
    got = [copies(b) for b in ringfeed.Loader(str(path), batch_size=5, shuffle=False, framework="numpy", workers=1)]
    b = got[0]
    assert b["caption"] == [f"photo {i} \u00fc" for i in range(5)]
    assert b["meta"] == [{"i": i, "t": [1] * i} for i in range(5)]
    assert b["blob"] == [bytes([i, 0]) for i in range(5)]
    assert b["notes.txt"] == [f"n{i}" for i in range(5)] and b["key"] == [f"rec{i}" for i in range(5)]


def test_a_refused_record_is_dropped_and_the_writer_goes_on(tmp_path):
    path = tmp_path / "w.rfs"
    with ringfeed.Writer(str(path)) as w:
        w.add("rec0", label=0, fields={"meta": ("raw", npy_bytes(np.array([0])))})
        with pytest.raises(ringfeed.Error) as e:  # refused by the library, after the record began
            w.add("bad", label=9, fields={"meta": ("raw", npy_bytes(np.array([9]))), "x": ("nonsense", b"x")})
        assert e.value.name == "DL_EOPTION" and "unknown codec 'nonsense' (raw, zstd, jpeg, png, webp, bytes, text, json)" in e.value.message
        with pytest.raises(ValueError):  # refused in Python (not a (codec, data) pair), before it began
            w.add("worse", label=9, fields={"meta": ("raw", b"x", "extra")})
        w.add("rec1", label=1, fields={"meta": ("raw", npy_bytes(np.array([1])))})
    got = [copies(b) for b in ringfeed.Loader(str(path), batch_size=2, shuffle=False, framework="numpy", workers=1)]
    assert [k for b in got for k in b["key"]] == ["rec0", "rec1"]
    assert np.concatenate([b["meta"] for b in got]).tolist() == [[0], [1]]


def test_writer_misuse_is_an_error_not_a_crash(tmp_path):
    path = tmp_path / "m.rfs"
    w = ringfeed.Writer(str(path))
    w.add("rec0", label=0, fields={"meta": np.array([0])})
    with pytest.raises(ValueError, match="pickle"):  # object arrays would be stored as pickles
        w.add("objects", fields={"meta": np.array([object()])})
    with pytest.raises(ValueError, match="NUL"):  # a C string would have cut it short, to "a"
        w.add("a\0b", label=1)
    with pytest.raises(TypeError, match="fields maps field names"):
        w.add("listed", fields=[1, 2])
    # what the loader would not read is refused here, where it is written, not at every read
    with pytest.raises(TypeError, match=r"a raw field takes an array or bytes, not str: give \('text', value\)"):
        w.add("str", fields={"meta": "abc"})
    with pytest.raises(TypeError, match="of dtype <U3 would not be read.*give \\('text', value\\)"):
        w.add("unicode", fields={"meta": np.array(["abc"])})
    with pytest.raises(TypeError, match="of dtype complex128 would not be read"):
        w.add("complex", fields={"meta": ("zstd", np.array([1j]))})
    w.add("rec1", label=1, fields={"meta": np.array([1], dtype=">i8")})  # big-endian: the same value
    # an image field holds the encoded file: an array would have been stored as .npy under "jpeg"
    with pytest.raises(TypeError, match="a jpeg field takes the encoded file's bytes, not ndarray"):
        w.add("pixels", fields={"image": ("jpeg", np.zeros((4, 4, 3), np.uint8))})
    with pytest.raises(ringfeed.Error, match="codec jpeg, but its bytes are a PNG file \\(give codec png\\)"):
        w.add("png", fields={"image": ("jpeg", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")})
    w.close()
    with pytest.raises(ringfeed.Error, match="the writer is closed"):  # was a segmentation fault
        w.add("late", label=2)
    w.close()  # a second close does nothing
    got = next(ringfeed.Loader(str(path), batch_size=4, shuffle=False, framework="numpy", workers=1))
    assert got["key"] == ["rec0", "rec1"] and got["meta"].tolist() == [[0], [1]]
    for where in (tmp_path / "p.rfs", os.fsencode(tmp_path / "b.rfs")):  # any kind of path, as the Loader
        with ringfeed.Writer(where) as w:
            w.add("k", label=3)
        assert next(ringfeed.Loader(where, batch_size=1, framework="numpy", workers=1))["label"].tolist() == [3]


def test_token_windows_match_a_numpy_reference(tmp_path):
    tokens = (np.arange(1000, dtype=np.uint32) * 7919 % 50257).astype(np.uint16)
    path = tmp_path / "t.bin"
    tokens.tofile(path)
    L = 16
    windows = np.stack([tokens[w * L: w * L + L + 1] for w in range((len(tokens) - 1) // L)])
    loader = ringfeed.Loader(f"tokens:{path}", dtype="uint16", seq_len=L, batch_size=8, shuffle=False,
                             framework="numpy", workers=2)
    got = np.concatenate([b["tokens"].copy() for b in loader])
    assert got.dtype == np.uint16 and np.array_equal(got, windows)
    # Shuffled, ranked and resumed like images: every window once per epoch, each intact.
    seen = []
    for rank in range(2):
        for b in ringfeed.Loader(f"tokens:{path}", dtype="uint16", seq_len=L, batch_size=5, seed=3, rank=rank,
                                 world_size=2, framework="numpy", workers=2):
            for key, row in zip(b["key"], b["tokens"]):
                w = int(key.rsplit(":", 1)[1])
                assert np.array_equal(row, windows[w])
                seen.append(w)
    assert sorted(seen) == list(range(len(windows) - len(windows) % 2))
    with pytest.raises(ringfeed.Error) as e:
        ringfeed.Loader(f"tokens:{path}", seq_len=L)
    assert e.value.name == "DL_EOPTION"


ZSTD = os.path.join(TESTDATA, "zstd")


@pytest.mark.skipif(not os.path.isdir(ZSTD), reason="third-party test data absent")
def test_zstd_golden_frames_decode_or_fail_cleanly(tmp_path):
    names = []
    members = []
    for sub in ("golden-decompression", "golden-decompression-errors"):
        for f in sorted(os.listdir(os.path.join(ZSTD, sub))):
            names.append((sub, f))
            members.append((f"g{len(members):02d}.data.npy.zst", open(os.path.join(ZSTD, sub, f), "rb").read()))
    shard = tmp_path / "z.tar"
    write_tar(shard, members)
    for i, (sub, f) in enumerate(names):
        one = tmp_path / f"one{i}.tar"
        write_tar(one, [members[i]])
        with pytest.raises(ringfeed.Error) as e:
            list(ringfeed.Loader(str(one), batch_size=1, on_error="fail", log="quiet", framework="numpy"))
        # A frame that decodes is then not a .npy payload; one that does not is a zstd error.
        assert e.value.name in ("DL_ECORRUPT", "DL_ELIMIT"), (f, e.value)
        assert "zstd" in e.value.message or ".npy" in e.value.message, (f, e.value.message)
        if sub == "golden-decompression" and f != "zeroSeq_2B.zst":  # 1.5.4 rejects that one
            assert ".npy" in e.value.message, (f, e.value.message)


def test_dlshard_converts_npy_folders_and_tars_keeping_the_stream(tmp_path):
    dlshard = os.environ.get("DL_DLSHARD") or os.path.join(os.path.dirname(os.environ.get("RINGFEED_LIBRARY", "")), "dlshard")
    if not os.path.exists(dlshard):
        pytest.skip("dlshard not built")
    rng = np.random.default_rng(5)
    folder = tmp_path / "npys"
    folder.mkdir()
    arrays = [rng.standard_normal((4, 4)).astype(np.float64) for _ in range(10)]
    for i, a in enumerate(arrays):
        np.save(folder / f"{i:04d}.npy", a)
    subprocess.run([dlshard, "create", str(tmp_path / "out" / "f"), str(folder), "--samples-per-shard", "4"],
                   check=True, capture_output=True)
    src = str(tmp_path / "out" / "f-{000000..000002}.rfs")
    a = [copies(b) for b in ringfeed.Loader(str(folder), batch_size=3, shuffle=False, framework="numpy")]
    b = [copies(x) for x in ringfeed.Loader(src, batch_size=3, shuffle=False, framework="numpy")]
    assert np.array_equal(np.concatenate([x["npy"] for x in a]), np.stack(arrays))
    assert np.array_equal(np.concatenate([x["npy"] for x in b]), np.stack(arrays))
    # A tar with .npy and .npy.zst members converts to the same stream.
    shard = tmp_path / "t.tar"
    write_tar(shard, [m for i, x in enumerate(arrays) for m in (
        (f"k{i:02d}.a.npy", npy_bytes(x)), (f"k{i:02d}.b.npy.zst", zstd(npy_bytes(x[0]))))])
    subprocess.run([dlshard, "create", str(tmp_path / "tt"), str(shard)], check=True, capture_output=True)
    out = subprocess.run([dlshard, "verify", str(tmp_path / "tt-000000.rfs")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout
    kw = dict(batch_size=4, seed=9, framework="numpy", workers=2)
    for x, y in zip(ringfeed.Loader(str(shard), **kw), ringfeed.Loader(str(tmp_path / "tt-000000.rfs"), **kw)):
        assert x["key"] == y["key"]
        assert np.array_equal(x["a"], y["a"]) and np.array_equal(x["b"], y["b"])


@pytest.mark.skipif(not os.path.isdir(os.path.join(TESTDATA, "libjpeg-turbo")), reason="third-party test data absent")
def test_any_zst_member_is_zstd_compressed(tmp_path):
    jpg = open(os.path.join(TESTDATA, "libjpeg-turbo", "testimages", "testorig.jpg"), "rb").read()
    plain, packed = tmp_path / "p.tar", tmp_path / "z.tar"
    write_tar(plain, [("a.jpg", jpg), ("a.cls", b"3")])
    write_tar(packed, [("a.jpg.zst", zstd(jpg)), ("a.cls", b"3")])
    kw = dict(batch_size=1, image_size=32, crop="center", framework="numpy", workers=1)
    x, y = next(ringfeed.Loader(str(plain), **kw)), next(ringfeed.Loader(str(packed), **kw))
    assert "error" not in y and np.array_equal(x["image"], y["image"]) and y["label"].tolist() == [3]


def test_a_damaged_zst_image_is_left_out_by_dlshard_create_and_named(tmp_path):
    dlshard = os.environ.get("DL_DLSHARD")
    if not dlshard:
        pytest.skip("DL_DLSHARD not set")
    packed = tmp_path / "z.tar"
    write_tar(packed, [("a.jpg.zst", zstd(b"\xff\xd8" + bytes(5000))[:-7]), ("a.cls", b"3")])
    out = subprocess.run([dlshard, "create", str(tmp_path / "o"), str(packed)], capture_output=True, text=True)
    assert out.returncode == 1 and "every sample was bad: no shard written" in out.stderr, out.stdout + out.stderr
    assert "1 bad sample left out" in out.stderr and "member a.jpg.zst: zstd: the frame is cut short" in out.stderr
    strict = subprocess.run([dlshard, "create", str(tmp_path / "s"), str(packed), "--strict"], capture_output=True,
                            text=True)
    assert strict.returncode == 1 and "member a.jpg.zst" in strict.stderr, strict.stderr


def test_dlshard_verify_names_the_tensors_and_zst_images_the_loader_refuses(tmp_path):
    """verify finds what the loader would skip: .npy payloads cut short or not .npy at all, raw or
    zstd, in ringfeed shards and tars, damaged .jpg.zst images and samples lacking the image the
    others have; the records it names are the loader's errors, and the sound ones pass."""
    dlshard = os.environ.get("DL_DLSHARD")
    if not dlshard:
        pytest.skip("DL_DLSHARD not set")
    good = npy_bytes(np.arange(12, dtype=np.float32).reshape(3, 4))
    bad = {"cut-header": good[:40], "not-npy": b"plain text, no .npy", "cut-data": good[:-8]}
    rfs = tmp_path / "t.rfs"
    with ringfeed.Writer(str(rfs)) as w:
        w.add("ok-raw", label=0, fields={"depth": ("raw", good)})
        w.add("ok-zstd", label=0, fields={"depth": ("zstd", good)})
        for i, (key, data) in enumerate(bad.items()):
            w.add(key, label=1, fields={"depth": ("raw" if i % 2 else "zstd", data)})
    shard = tmp_path / "t.tar"
    members = [("ok-a.depth.npy", good), ("ok-b.depth.npy.zst", zstd(good))]
    members += [(f"{key}.depth.npy", data) for key, data in bad.items()]
    members += [("bad-zst.depth.npy.zst", zstd(good)[:-9])]
    write_tar(shard, members)

    def named(path):
        out = subprocess.run([dlshard, "verify", str(path)], capture_output=True, text=True)
        assert out.returncode == 1 and "damaged" in out.stdout, out.stdout
        return out.stdout

    def refused(path):
        b = next(ringfeed.Loader(str(path), batch_size=10, shuffle=False, framework="numpy", log="quiet",
                                 drop_last=False))
        return {k for k, e in zip(b["key"], b["error"]) if e}

    for path in (rfs, shard):
        report = named(path)
        wrong = refused(path)
        assert wrong == set(bad) | ({"bad-zst"} if path == shard else set()), wrong
        for key in wrong:
            assert f"{key}" in report and "field depth:" in report, report
        assert "ok-" not in report and report.count("\n") == len(wrong) + 2, report
    if os.path.isdir(os.path.join(TESTDATA, "libjpeg-turbo")):
        jpg = open(os.path.join(TESTDATA, "libjpeg-turbo", "testimages", "testorig.jpg"), "rb").read()
        images = tmp_path / "z.tar"
        write_tar(images, [("a.jpg.zst", zstd(jpg)), ("b.jpg.zst", zstd(jpg[:len(jpg) // 3] + bytes(9))),
                           ("c.cls", b"3")])
        report = named(images)
        assert "member b.jpg.zst" in report and "a.jpg.zst" not in report, report
        # A sample without the image the others have (a lone .cls, a link member not followed).
        assert "member c (offset 0): sample has no image member" in report, report
        assert refused(images) == {"b", "c"}
        # Kept as they are (--keep-bad), the ringfeed shard's verify names them again.
        subprocess.run([dlshard, "create", str(tmp_path / "z"), str(images), "--keep-bad"], capture_output=True)
        assert "record 2 (key c," in named(tmp_path / "z-000000.rfs")


def test_damaged_tensor_records_are_caught_while_copied(tmp_path):
    """Tensor-only records are checksummed during the copy into the batch: a flipped byte in the
    data or in the .npy header of a record fails that record alone."""
    path = tmp_path / "d.rfs"
    arrays = [np.full((64, 64), i, dtype=np.uint8) for i in range(6)]
    with ringfeed.Writer(str(path)) as w:
        for i, a in enumerate(arrays):
            w.add(f"r{i}", label=i, fields={"x": ("raw", a)})
    raw = bytearray(path.read_bytes())
    record = lambda i: 4096 + 8192 * i  # each 4224-byte record takes two 4 KiB pages
    assert raw[record(2): record(2) + 6] == b"\x93NUMPY" and raw[record(4): record(4) + 6] == b"\x93NUMPY"
    raw[record(2) + 128 + 500] ^= 0xFF  # inside record 2's data
    raw[record(4) + 20] ^= 0x01         # inside record 4's .npy header
    path.write_bytes(bytes(raw))
    for io in ("auto", "mmap"):
        b = next(ringfeed.Loader(str(path), batch_size=6, shuffle=False, framework="numpy", log="quiet", io=io))
        assert [e != 0 for e in b["error"]] == [False, False, True, False, True, False], io
        for i in (0, 1, 3, 5):
            assert np.array_equal(b["x"][i], arrays[i])
        assert not b["x"][2].any()
