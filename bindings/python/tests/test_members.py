"""Image-text shards: captions, JSON and binary members reach the consumer with their samples,
under shuffling and rank splits; fields= keeps only what is named and reads no more."""
import io
import json
import os
import random
import tarfile

import pytest

import ringfeed

np = pytest.importorskip("numpy")
Image = pytest.importorskip("PIL.Image")

CAPTIONS = ["a café in Zürich, crème brûlée", "東京の夜景と桜", "서울의 가을", "emoji 🐈‍⬛🚀✨ end",
            "Ελληνικά και русский текст", "plain ascii", "", "עברית ומספרים 123"]


def expected(i):
    rng = random.Random(i)
    return {"caption.txt": CAPTIONS[i % len(CAPTIONS)],
            "json": {"i": i, "tags": [CAPTIONS[(i + 1) % len(CAPTIONS)]], "score": i / 7} if i % 5 else None,
            "bin": bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300)))}


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    path = tmp_path_factory.mktemp("members") / "captions.tar"
    with tarfile.open(path, "w") as t:
        for i in range(48):
            buf = io.BytesIO()
            Image.fromarray(np.full((24, 24, 3), i * 5, np.uint8)).save(buf, format="PNG")
            want = expected(i)
            members = [("png", buf.getvalue()), ("cls", str(i).encode()),
                       ("caption.txt", want["caption.txt"].encode()), ("bin", want["bin"])]
            if want["json"] is not None:
                members.append(("json", json.dumps(want["json"], ensure_ascii=False).encode()))
            for ext, data in members:
                info = tarfile.TarInfo(f"{i:05d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return str(path)


def check(batch):
    for j, key in enumerate(batch["key"]):
        i = int(key)
        assert batch["label"][j] == i
        want = expected(i)
        assert batch["caption.txt"][j] == want["caption.txt"]
        assert batch["json"][j] == want["json"]
        assert batch["bin"][j] == want["bin"]


@pytest.mark.parametrize("world_size", [1, 2])
def test_members_stay_with_their_samples_shuffled_and_split(shard, world_size):
    seen = []
    for rank in range(world_size):
        with ringfeed.Loader(shard, batch_size=5, image_size=16, shuffle=True, seed=3, rank=rank,
                             world_size=world_size, workers=3, framework="numpy") as loader:
            for batch in loader:
                check(batch)
                seen += batch["key"]
    assert len(seen) == len(set(seen)) and len(seen) >= 48 - world_size * 5


def test_fields_keeps_only_what_is_named_and_reads_less(shard):
    with ringfeed.Loader(shard, batch_size=8, image_size=16, shuffle=False, framework="numpy") as loader:
        for batch in loader:
            check(batch)
        everything = loader.stats()["bytes_read"]
    with ringfeed.Loader(shard, batch_size=8, image_size=16, shuffle=False, framework="numpy",
                         fields="caption.txt") as loader:
        for batch in loader:
            assert "json" not in batch and "bin" not in batch
            assert batch["caption.txt"] == [expected(int(k))["caption.txt"] for k in batch["key"]]
        assert loader.stats()["bytes_read"] < everything
    with pytest.raises(ringfeed.Error) as e:
        ringfeed.Loader(shard, fields="caption")
    assert e.value.name == "DL_EOPTION" and "caption.txt" in e.value.message


def test_real_webdataset_members():
    from conftest import TESTDATA
    kamil = os.path.join(TESTDATA, "webdataset", "kamildre-example", "dataset_shard_000000.tar")
    if not os.path.exists(kamil):
        pytest.skip("third-party test data absent")
    with ringfeed.Loader(kamil, batch_size=3, image_size=32, shuffle=False, framework="numpy") as loader:
        batch = next(loader)
    maps = batch["instance_attribute_maps.json"]
    assert len(maps) == 3 and all(isinstance(m, list) and m[0]["name"] == "World" for m in maps)
    assert batch["depth"].shape[0] == 3


def test_hidden_members_of_a_macos_tar_belong_to_no_sample(tmp_path):
    """macOS tar stores "._NAME" (the file's metadata, AppleDouble) before each member and
    ".DS_Store" beside them. Taken as samples they split each image from its label: 40 samples,
    30 of them errors, labels -1."""
    path = tmp_path / "mac.tar"
    apple = b"\x00\x05\x16\x07" + bytes(200)
    with tarfile.open(path, "w") as t:
        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        add("./.DS_Store", b"\0\0\0\1Bud1" + bytes(100))
        for i in range(10):
            buf = io.BytesIO()
            Image.fromarray(np.full((16, 16, 3), i * 20, np.uint8)).save(buf, format="PNG")
            for ext, data in (("png", buf.getvalue()), ("cls", str(i).encode())):
                add(f"./._{i:03d}.{ext}", apple)
                add(f"./{i:03d}.{ext}", data)
        add("photos/.hidden.png", apple)
    with ringfeed.Loader(str(path), batch_size=5, image_size=16, shuffle=False, framework="numpy") as loader:
        labels, keys = [], []
        for batch in loader:
            labels += batch["label"].tolist()
            keys += batch["key"]
            assert all(abs(int(img.mean()) - int(k) * 20) <= 1 for img, k in zip(batch["image"], batch["key"]))
        assert loader.stats()["errors"] == 0
    assert keys == [f"{i:03d}" for i in range(10)] and labels == list(range(10))


def test_large_pax_headers_of_extended_attributes_are_read(tmp_path):
    """GNU tar --xattrs and macOS tar keep extended attributes as pax records of some KiB; a header
    over 16 KiB was taken for damage, and every sample after it was dropped."""
    path = tmp_path / "xattrs.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as t:
        for i in range(6):
            buf = io.BytesIO()
            Image.fromarray(np.full((16, 16, 3), i * 20, np.uint8)).save(buf, format="PNG")
            for ext, data in (("png", buf.getvalue()), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"{i:03d}.{ext}")
                info.size = len(data)
                if i == 2:
                    info.pax_headers = {"SCHILY.xattr.user.provenance": "x" * 40000}
                t.addfile(info, io.BytesIO(data))
    with ringfeed.Loader(str(path), batch_size=2, image_size=16, shuffle=False, framework="numpy") as loader:
        labels = [label for batch in loader for label in batch["label"].tolist()]
    assert labels == list(range(6))


def rewrite_headers(data, change):
    """DATA (a tar) with CHANGE(header, size) applied to each header and its checksum made again."""
    out, at = bytearray(data), 0
    while at + 512 <= len(out) and any(out[at:at + 512]):
        header = out[at:at + 512]
        size = int(header[124:136].rstrip(b"\0 ") or b"0", 8)
        change(header, size)
        header[148:156] = b" " * 8
        header[148:156] = b"%06o\0 " % sum(header)
        out[at:at + 512] = header
        at += 512 + (size + 511) // 512 * 512
    return bytes(out)


def test_sizes_in_base_256_and_in_pax_records_are_read(tmp_path):
    """Members of 8 GiB and more do not fit the header's 11 octal digits: GNU tar writes their size
    in base 256 (a first byte of 0x80), pax in a "size" record. Both on small members here."""
    def shard(fmt):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
            for i in range(4):
                png = io.BytesIO()
                Image.fromarray(np.full((8, 8, 3), 20 + i * 40, np.uint8)).save(png, format="PNG")
                for ext, data in (("png", png.getvalue()), ("cls", str(i).encode())):
                    info = tarfile.TarInfo(f"{i:03d}.{ext}")
                    info.size = len(data)
                    if fmt == tarfile.PAX_FORMAT:
                        info.pax_headers = {"size": str(len(data))}
                    t.addfile(info, io.BytesIO(data))
        return buf.getvalue()

    def base_256(header, size):
        header[124:136] = b"\x80" + size.to_bytes(11, "big")

    def pax_only(header, size):  # a file's ustar field says 0; its pax record says how long it is
        if header[156:157] == b"0":
            header[124:136] = b"%011o\0" % 0

    for name, data in (("base256.tar", rewrite_headers(shard(tarfile.GNU_FORMAT), base_256)),
                       ("pax.tar", rewrite_headers(shard(tarfile.PAX_FORMAT), pax_only))):
        (tmp_path / name).write_bytes(data)
        with ringfeed.Loader(str(tmp_path / name), batch_size=4, image_size=8, shuffle=False,
                             framework="numpy") as loader:
            batch = next(loader)
        assert batch["label"].tolist() == [0, 1, 2, 3], name
        assert [int(batch["image"][i].mean()) for i in range(4)] == [20, 60, 100, 140], name


def test_members_written_apart_from_their_sample(tmp_path, capfd):
    """`tar cf shard.tar *.png *.cls` writes every image, then every label: each key made two
    samples, an image labelled -1 and a label with no image (an error). A label is joined to its
    sample, either way round; other members apart from their sample are named."""
    def shard(name, order):
        with tarfile.open(tmp_path / name, "w") as t:
            for ext in order:
                for i in range(6):
                    buf = io.BytesIO()
                    Image.fromarray(np.full((16, 16, 3), i * 20, np.uint8)).save(buf, format="PNG")
                    data = {"png": buf.getvalue(), "cls": str(i).encode(), "txt": f"image {i}".encode()}[ext]
                    info = tarfile.TarInfo(f"{i:03d}.{ext}")
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))
        return str(tmp_path / name)

    for order in (("png", "cls"), ("cls", "png")):
        with ringfeed.Loader(shard("-".join(order) + ".tar", order), batch_size=3, image_size=16, shuffle=False,
                             framework="numpy") as loader:
            got = [(k, int(label), int(img.mean())) for b in loader for k, label, img in
                   zip(b["key"], b["label"], b["image"])]
            assert loader.stats()["errors"] == 0
        assert got == [(f"{i:03d}", i, i * 20) for i in range(6)], order
    captions = shard("captions.tar", ("png", "txt"))
    for _ in range(2):  # said on every open, not only while the shard is first indexed
        with ringfeed.Loader(captions, batch_size=3, image_size=16, shuffle=False, framework="numpy",
                             log="warn") as loader:
            assert len(loader) == 4  # 12 samples: no caption is joined to its image's sample
        assert "the members of 6 samples are not next to each other (sample 000)" in capfd.readouterr().err


def test_link_members_are_named(tmp_path, capfd):
    """A folder of links archived as links (tar's default) gives members with no bytes; their
    samples said only "no image member". The shard says why on every open."""
    path = tmp_path / "links.tar"
    with tarfile.open(path, "w") as t:
        for i in range(4):
            buf = io.BytesIO()
            Image.fromarray(np.full((16, 16, 3), i * 20, np.uint8)).save(buf, format="PNG")
            info = tarfile.TarInfo(f"{i:03d}.png")
            if i < 2:
                info.size = len(buf.getvalue())
                t.addfile(info, io.BytesIO(buf.getvalue()))
            else:
                info.type, info.linkname = (tarfile.SYMTYPE, "000.png") if i == 2 else (tarfile.LNKTYPE, "001.png")
                t.addfile(info)
            label = tarfile.TarInfo(f"{i:03d}.cls")
            label.size = 1
            t.addfile(label, io.BytesIO(str(i).encode()))
    for _ in range(2):
        with ringfeed.Loader(str(path), batch_size=4, image_size=16, shuffle=False, framework="numpy",
                             log="warn", epochs=1) as loader:
            assert sum(len(batch["key"]) for batch in loader) == 4 and loader.stats()["errors"] == 2
        assert "2 members are links, not files (002.png -> 000.png)" in capfd.readouterr().err


def test_sparse_members_are_named_and_the_rest_read(tmp_path, capfd):
    """`tar --sparse` stores a file with holes as its data and a map: taken as the file, its bytes
    were wrong, and in GNU's own format the member vanished (and a map continued in further blocks
    would have been read as the next header). Each is named, and every other sample is read."""
    import shutil
    import subprocess
    tar = shutil.which("tar")
    if not tar or "GNU tar" not in subprocess.run([tar, "--version"], capture_output=True, text=True).stdout:
        pytest.skip("needs GNU tar")
    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        buf = io.BytesIO()
        Image.fromarray(np.full((16, 16, 3), i * 20, np.uint8)).save(buf, format="PNG")
        with open(src / f"{i:03d}.png", "wb") as f:
            f.write(buf.getvalue())
            for _ in range(30 if i == 2 else 0):  # holes after the image's end: 30 pieces of data
                f.seek(64 << 10, 1)
                f.write(b"x")
        (src / f"{i:03d}.cls").write_text(str(i))
    if os.stat(src / "002.png").st_blocks * 512 >= os.stat(src / "002.png").st_size:
        pytest.skip("this file system keeps no holes")
    names = sorted(os.listdir(src))
    for version in ("gnu", "0.0", "0.1", "1.0"):
        shard = tmp_path / f"sparse-{version}.tar"
        how = ["--format=gnu"] if version == "gnu" else ["--format=posix", f"--sparse-version={version}"]
        subprocess.run([tar, "--sparse", *how, "-cf", str(shard), "-C", str(src), *names], check=True)
        for _ in range(2):  # said on every open
            with ringfeed.Loader(str(shard), batch_size=5, image_size=16, shuffle=False, framework="numpy",
                                 on_error="skip", log="warn", epochs=1) as loader:
                got = [(k, int(label), int(img.mean())) for b in loader for k, label, img, bad in
                       zip(b["key"], b["label"], b["image"], b["error"]) if not bad]
                assert loader.stats()["errors"] == 1, version
            assert got == [(f"{i:03d}", i, i * 20) for i in (0, 1, 3, 4)], version
            assert "1 member is a sparse file (002.png)" in capfd.readouterr().err, version


def test_names_that_are_not_utf8_come_back_whole(tmp_path):
    """Keys were decoded with replacement ("caf\xe9" and "caf\xe8" both became "caf\ufffd"), and
    a field name that is not UTF-8 made every batch raise UnicodeDecodeError. Both come as
    Python's tarfile gives names: the bytes kept as surrogates."""
    path = tmp_path / "latin1.tar"
    # The last two: a key that ends inside a UTF-8 sequence, then one that begins with its tail.
    keys = [b"caf\xe9", b"caf\xe8", b"plain", b"cut\xc3", b"\xa9tail\xc3\xa9"]
    with open(path, "wb") as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT,
                                               encoding="utf-8", errors="surrogateescape") as t:
        for i, key in enumerate(keys):
            buf = io.BytesIO()
            Image.fromarray(np.full((16, 16, 3), i * 20, np.uint8)).save(buf, format="PNG")
            for ext, data in ((b"png", buf.getvalue()), (b"cls", str(i).encode()), (b"n\xe9te", b"note %d" % i)):
                info = tarfile.TarInfo((key + b"." + ext).decode("utf-8", "surrogateescape"))
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    with ringfeed.Loader(str(path), batch_size=5, image_size=16, shuffle=False, framework="numpy") as loader:
        batch = next(iter(loader))
    assert [k.encode("utf-8", "surrogateescape") for k in batch["key"]] == keys
    assert batch["key"][3:] == ["cut\udcc3", "\udca9tail\xe9"]
    assert batch["label"].tolist() == [0, 1, 2, 3, 4]
    assert batch["n\udce9te"] == [b"note %d" % i for i in range(5)]


def test_long_keys_come_back_whole_batch_after_batch(tmp_path):
    """A batch's keys come as one string the library joins in a buffer of the batch's slot, which
    grows past its first 4 KiB here (eight keys of about 900 bytes) and is reused for the batches
    after: every key in every batch comes back whole and in order."""
    path = tmp_path / "long.tar"
    keys = [f"{i:02d}/" + "k" * (850 + 7 * i) for i in range(24)]
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as t:
        for i, key in enumerate(keys):
            buf = io.BytesIO()
            Image.fromarray(np.full((16, 16, 3), i, np.uint8)).save(buf, format="PNG")
            for ext, data in (("png", buf.getvalue()), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    with ringfeed.Loader(str(path), batch_size=8, image_size=16, shuffle=False, framework="numpy", prefetch=2,
                         epochs=2) as loader:
        got = [batch["key"] for _ in range(2) for batch in loader]
    assert got == [keys[i:i + 8] for i in range(0, 24, 8)] * 2


def test_labels_are_read_as_pythons_int_reads_them(tmp_path):
    path = tmp_path / "labels.tar"
    texts = ["+3", " 4\n", "-2", "0007", "\t12 \r\n"]
    with tarfile.open(path, "w") as t:
        for i, text in enumerate(texts):
            buf = io.BytesIO()
            Image.fromarray(np.full((8, 8, 3), 9, np.uint8)).save(buf, format="PNG")
            for ext, data in (("png", buf.getvalue()), ("cls", text.encode())):
                info = tarfile.TarInfo(f"{i:03d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    with ringfeed.Loader(str(path), batch_size=5, image_size=8, shuffle=False, framework="numpy") as loader:
        assert next(loader)["label"].tolist() == [int(text) for text in texts]  # "+3" was -1, with a warning


def test_a_shard_unpacked_into_a_folder_keeps_its_labels(tmp_path, capfd):
    """`tar xf shard.tar -C folder` gives 000.jpg, 000.cls, ...: the folder's samples had label -1
    and the .cls files were dropped without a word."""
    for i in range(4):
        Image.fromarray(np.full((8, 8, 3), i * 30, np.uint8)).save(tmp_path / f"{i:03d}.png")
        if i != 2:
            (tmp_path / f"{i:03d}.cls").write_text("x" if i == 3 else f"{i + 10}\n")
    (tmp_path / "notes.txt").write_text("a caption with no image")
    np.save(tmp_path / "001.depth.npy", np.zeros((2, 2), np.float32))  # a field of its own sample, labelled too
    with ringfeed.Loader(str(tmp_path), batch_size=1, image_size=8, shuffle=False, framework="numpy",
                         log="warn") as loader:
        got = [(b["key"][0], int(b["label"][0])) for b in loader]
    assert got == [("000", 10), ("001", 11), ("001", 11), ("002", -1), ("003", -1)], got
    err = capfd.readouterr().err
    assert "003.cls holds no integer label" in err
    assert "1 file that is not an image, .npy or .cls was left out (1 .txt)" in err


def test_labels_that_are_no_integer_are_said_once_a_shard_at_every_open(tmp_path, capfd):
    """-1 stands for them, as for a sample without a .cls; the shard's index is not cached, so a
    later open says it again (before, only the first did, a warning per member)."""
    path = tmp_path / "labels.tar"
    texts = [b"3\n", b" 4 ", b"cat", b"", b"99999999999999999999", b"+7", b"-2"]
    with tarfile.open(path, "w") as t:
        for i, text in enumerate(texts):
            buf = io.BytesIO()
            Image.fromarray(np.full((8, 8, 3), i, np.uint8)).save(buf, format="PNG")
            for ext, data in (("png", buf.getvalue()), ("cls", text)):
                info = tarfile.TarInfo(f"{i:03d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    for _ in range(2):
        with ringfeed.Loader(str(path), batch_size=7, image_size=8, shuffle=False, framework="numpy",
                             log="warn") as loader:
            assert next(loader)["label"].tolist() == [3, 4, -1, -1, -1, 7, -2]
        err = capfd.readouterr().err
        assert err.count("ringfeed warning") == 1, err
        assert (f"shard {path}: 3 .cls members hold no integer label, and -1 is used (member 002.cls: label is not "
                "an integer)") in err
    assert not os.path.exists(f"{path}.rfidx")
    (tmp_path / "big.cls").write_bytes(texts[4])
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "big.png")
    with ringfeed.Loader(str(tmp_path), batch_size=1, image_size=8, framework="numpy", log="warn") as loader:
        assert next(loader)["label"].tolist() == [-1]
    assert "big.cls holds no integer label: its text is out of range (past 2^63)" in capfd.readouterr().err


def test_members_named_as_the_batch_names_its_own_parts_do_not_hide_them(tmp_path, capfd):
    """000.image and 000.label are members like any other: they come as image_ and label_, and
    the batch's decoded image and .cls label stay where they are."""
    path = tmp_path / "clash.tar"
    with tarfile.open(path, "w") as t:
        for i in range(4):
            buf = io.BytesIO()
            Image.fromarray(np.full((8, 8, 3), 10 * i, np.uint8)).save(buf, format="PNG")
            for ext, data in (("png", buf.getvalue()), ("cls", str(i).encode()), ("image", b"meta %d" % i),
                              ("label", b"cat"), ("key", b"k")):
                info = tarfile.TarInfo(f"{i:03d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    b = next(iter(ringfeed.Loader(str(path), batch_size=4, image_size=8, shuffle=0, framework="numpy")))
    assert b["image"].shape == (4, 8, 8, 3) and b["image"][3].max() == 30
    assert b["label"].tolist() == [0, 1, 2, 3] and b["key"] == ["000", "001", "002", "003"]
    assert b["image_"] == [b"meta %d" % i for i in range(4)] and b["label_"] == [b"cat"] * 4 and b["key_"] == [b"k"] * 4
    err = capfd.readouterr().err
    assert "field image is delivered as image_" in err and "field key is delivered as key_" in err


def test_members_past_the_fields_a_dataset_holds_are_named_on_every_open(tmp_path, capfd):
    """A dataset holds 16 distinct fields besides image and label, and a field name is at most 63
    bytes: a member past either is left out with a warning naming it, on every open (the shard's
    index is not cached, which would keep the later opens quiet)."""
    path = tmp_path / "wide.tar"
    long_name = "x" * 64
    with tarfile.open(path, "w") as t:
        for i in range(2):
            buf = io.BytesIO()
            Image.fromarray(np.full((8, 8, 3), 10 * i, np.uint8)).save(buf, format="PNG")
            members = [("png", buf.getvalue()), ("cls", str(i).encode())]
            members += [(f"f{k:02d}", b"%d" % k) for k in range(16)]
            members += [("f16", b"16"), (long_name, b"long")]
            for ext, data in members:
                info = tarfile.TarInfo(f"{i:03d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    for _ in range(2):
        with ringfeed.Loader(str(path), batch_size=2, image_size=8, shuffle=0, framework="numpy",
                             log="warn") as loader:
            b = next(iter(loader))
        assert [b[f"f{k:02d}"] for k in range(16)] == [[b"%d" % k] * 2 for k in range(16)]
        assert "f16" not in b and long_name not in b and b["label"].tolist() == [0, 1]
        err = capfd.readouterr().err
        assert (f"shard {path} member 000.f16: left out, a dataset has at most 16 distinct fields besides "
                "image and label") in err
    only_long = tmp_path / "long.tar"
    with tarfile.open(only_long, "w") as t:
        info = tarfile.TarInfo(f"000.{long_name}")
        info.size = 4
        t.addfile(info, io.BytesIO(b"long"))
        info = tarfile.TarInfo("000.cls")
        info.size = 1
        t.addfile(info, io.BytesIO(b"3"))
    with ringfeed.Loader(str(only_long), batch_size=1, shuffle=0, framework="numpy", log="warn") as loader:
        assert next(iter(loader))["label"].tolist() == [3]
    assert f"member 000.{long_name}: left out, its field name is longer than 63 bytes" in capfd.readouterr().err
