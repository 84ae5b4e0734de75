"""A new user's first hour, as the README has it: the training loop of 90 epochs with set_epoch,
a run that ends said, not silent, and a resumed epoch that counts as the whole epoch does."""
import json
import subprocess
import warnings

import pytest

import ringfeed
from conftest import DLBENCH

KW = dict(batch_size=32, image_size=16, workers=2, framework="dlpack", seed=3)


def test_ninety_epochs_each_for_one_epoch_with_set_epoch(synthetic):
    with ringfeed.Loader(synthetic, **KW) as loader:  # no epochs=: epochs without end
        per_epoch = len(loader)
        assert per_epoch == 4  # 120 samples, batches of 32, the last short
        seen = []
        for epoch in range(90):
            loader.set_epoch(epoch)
            assert len(loader) == per_epoch
            batches = [(b["epoch"], b["index"], tuple(b["key"])) for b in loader]
            assert [(e, i) for e, i, _ in batches] == [(epoch, i) for i in range(per_epoch)], epoch
            seen.append(sorted(k for _, _, keys in batches for k in keys))
        assert all(keys == seen[0] for keys in seen) and len(seen[0]) == 120


def test_set_epoch_picks_any_epoch_and_repeats_it_alike(synthetic):
    with ringfeed.Loader(synthetic, **KW) as loader:
        loader.set_epoch(57)
        first = [b["key"] for b in loader]
        loader.set_epoch(57)
        assert [b["key"] for b in loader] == first
        loader.set_epoch(3)
        assert [b["key"] for b in loader] != first


def test_a_run_of_epochs_that_has_ended_says_so_once(synthetic):
    with ringfeed.Loader(synthetic, epochs=2, **KW) as loader:
        assert sum(1 for _ in loader) == 4 and sum(1 for _ in loader) == 4
        assert len(loader) == 0
        with pytest.warns(RuntimeWarning, match="epochs=2.*yields nothing.*leave epochs out"):
            assert list(loader) == []
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert list(loader) == []  # said once
        with pytest.raises(ValueError, match=r"set_epoch\(2\).*epochs=2.*leave epochs out"):
            loader.set_epoch(2)


def test_a_resumed_epoch_counts_its_batches_from_where_it_stopped(synthetic):
    with ringfeed.Loader(synthetic, **KW) as loader:
        whole = [(b["index"], b["key"]) for b in loader]
    with ringfeed.Loader(synthetic, **KW) as loader:
        it = iter(loader)
        head = [(b["index"], b["key"]) for b in (next(it), next(it))]
        del it
        state = loader.state_dict()
    with ringfeed.Loader(synthetic, state=state, **KW) as loader:
        assert len(loader) == 2  # the epoch's batches left
        rest = [(b["index"], b["key"]) for b in loader]
        assert head + rest == whole and [i for i, _ in rest] == [2, 3]
        assert loader.epoch == 1 and len(loader) == 4


def test_dlbench_resumed_prints_the_batches_as_the_whole_run_did(synthetic):
    def digests(*extra):
        out = subprocess.run([DLBENCH, synthetic, "--batch", "16", "--size", "16", "--workers", "2", "--digest",
                              "--json", *extra], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)
    whole = digests()["batch_digests"]
    token = digests("--stop-after", "3")["state"]
    resumed = digests("--resume", token)["batch_digests"]
    assert resumed == whole[3:] and resumed[0].startswith("0:3 ")


def test_dlshard_create_checks_each_sample_and_leaves_out_the_broken(synthetic, tmp_path):
    import glob
    import io
    import os
    import tarfile
    from conftest import DLSHARD
    first = sorted(glob.glob(os.path.join(os.path.dirname(synthetic), "*.tar")))[0]
    members = {}
    with tarfile.open(first) as tar:
        for m in tar.getmembers()[:6]:  # three samples: jpg and cls
            members[m.name] = tar.extractfile(m).read()
    jpgs = sorted(n for n in members if n.endswith(".jpg"))
    members[jpgs[1]] = members[jpgs[1]][: len(members[jpgs[1]]) // 3]  # the data ends early
    src = tmp_path / "in.tar"
    with tarfile.open(src, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

    def create(out, *flags):
        return subprocess.run([DLSHARD, "create", str(tmp_path / out / "x"), str(src), *flags],
                              capture_output=True, text=True, timeout=60)

    left = create("left")
    assert left.returncode == 0, left.stderr
    assert left.stdout.startswith("2 samples in 1 shard")
    assert "1 bad sample left out" in left.stderr and f"member {jpgs[1]}:" in left.stderr
    assert "--keep-bad" in left.stderr and "in.tar" in left.stderr
    ok = subprocess.run([DLSHARD, "verify", str(tmp_path / "left" / "x-000000.rfs")], capture_output=True, text=True)
    assert ok.returncode == 0 and "verified: ok" in ok.stdout
    kept = create("kept", "--keep-bad", "--strict")
    assert kept.returncode == 1 and kept.stdout.startswith("3 samples in 1 shard")
    assert "1 bad sample kept (--keep-bad)" in kept.stderr
    damaged = subprocess.run([DLSHARD, "verify", str(tmp_path / "kept" / "x-000000.rfs")], capture_output=True,
                             text=True)
    assert damaged.returncode == 1 and "1 bad record" in damaged.stdout
    assert create("strict", "--strict").returncode == 1
    assert os.path.exists(tmp_path / "strict" / "x-000000.rfs")

    # every sample bad: no empty shard for the loader to find "no samples" in later
    with tarfile.open(src, "w") as tar:
        info = tarfile.TarInfo(jpgs[1])
        info.size = len(members[jpgs[1]])
        tar.addfile(info, io.BytesIO(members[jpgs[1]]))
    none = create("none")
    assert none.returncode == 1 and not none.stdout, none.stdout
    assert none.stderr.rstrip().endswith("dlshard: every sample was bad: no shard written"), none.stderr
    assert f"member {jpgs[1]}:" in none.stderr and not os.listdir(tmp_path / "none")

    # a folder given as the prefix: shards named -000000.rfs in it, or beside it, before
    (tmp_path / "folder").mkdir()
    for prefix in (f"{tmp_path / 'folder'}/", str(tmp_path / "folder")):
        out = subprocess.run([DLSHARD, "create", prefix, str(src)], capture_output=True, text=True, timeout=60)
        said = f"dlshard: OUT_PREFIX {prefix} is a folder: give the shards' name in it too, such as {prefix}"
        assert out.returncode == 2 and out.stderr.startswith(said + ("" if prefix.endswith("/") else "/") + "train")
    assert not os.listdir(tmp_path / "folder") and not glob.glob(str(tmp_path / "folder-*"))


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_float_batches_on_the_cpu_are_the_uint8_ones_normalised(synthetic, layout):
    np = pytest.importorskip("numpy")
    kw = dict(KW, framework="numpy", batch_size=16, image_size=24, flip=True, layout=layout, epochs=1)
    mean, std = np.float32([0.485, 0.456, 0.406]), np.float32([0.229, 0.224, 0.225])
    # As the GPU's conversion folds it: x * (1 / (255 std)) + (-mean / std), in float32.
    scale, shift = np.float32(1) / (np.float32(255) * std), -mean / std
    with ringfeed.Loader(synthetic, **kw) as loader:
        raw = [b["image"].astype(np.float32) for b in loader]
    shape = (1, 3, 1, 1) if layout == "NCHW" else (1, 1, 1, 3)
    want = [r * scale.reshape(shape) + shift.reshape(shape) for r in raw]
    with ringfeed.Loader(synthetic, dtype="float32", **kw) as loader:
        got = [b["image"].copy() for b in loader]
    assert len(got) == len(want) and got[0].dtype == np.float32 and got[0].shape == raw[0].shape
    for g, w in zip(got, want):
        assert np.array_equal(g, w) or np.abs(g - w).max() <= 2 * np.finfo(np.float32).eps * 4
    with ringfeed.Loader(synthetic, dtype="float16", **kw) as loader:
        half = [b["image"].copy() for b in loader]
    assert half[0].dtype == np.float16 and all(np.array_equal(h, w.astype(np.float16)) for h, w in zip(half, want))
    with pytest.raises(ValueError, match="numpy has no bfloat16"):
        ringfeed.Loader(synthetic, dtype="bfloat16", **kw)


def test_channels_last_is_nhwc_memory_under_nchw_shape(synthetic):
    """layout=channels_last: what a channels_last model reads without a copy, the same values as NHWC."""
    kw = dict(KW, batch_size=16, image_size=24, flip=True, epochs=1)
    np = pytest.importorskip("numpy")
    with ringfeed.Loader(synthetic, **dict(kw, framework="numpy")) as loader:
        nhwc = [b["image"].copy() for b in loader]
    with ringfeed.Loader(synthetic, **dict(kw, framework="numpy", layout="channels_last")) as loader:
        n = 0
        for b, want in zip(loader, nhwc):
            assert b["image"].shape[1:] == (3, 24, 24) and b["image"].strides == (24 * 24 * 3, 1, 24 * 3, 3)
            assert np.array_equal(b["image"], want.transpose(0, 3, 1, 2))
            n += 1
        assert n == len(nhwc) > 1
    torch = pytest.importorskip("torch")
    with ringfeed.Loader(synthetic, **dict(kw, framework="torch", layout="channels_last", dtype="bfloat16")) as loader:
        image = next(iter(loader))["image"]
        assert image.shape == (16, 3, 24, 24) and image.is_contiguous(memory_format=torch.channels_last)
        # a model's own .contiguous(memory_format=torch.channels_last) then copies nothing
        assert image.contiguous(memory_format=torch.channels_last).data_ptr() == image.data_ptr()
        del image


def test_bfloat16_batches_on_the_cpu_round_as_torch_does(synthetic):
    torch = pytest.importorskip("torch")
    kw = dict(KW, framework="torch", batch_size=16, image_size=24, epochs=1)
    with ringfeed.Loader(synthetic, **kw) as loader:
        raw = [b["image"].float() for b in loader]
    with ringfeed.Loader(synthetic, dtype="bfloat16", mean=(0.5, 0.5, 0.5), std=(0.25, 0.5, 1), **kw) as loader:
        got = [b["image"].clone() for b in loader]
    scale = 1 / (255 * torch.tensor([0.25, 0.5, 1.0]))
    shift = -torch.tensor([0.5, 0.5, 0.5]) / torch.tensor([0.25, 0.5, 1.0])
    for g, r in zip(got, raw):
        assert g.dtype == torch.bfloat16 and g.shape == r.shape
        assert torch.equal(g, (r * scale + shift).to(torch.bfloat16))


def test_mean_and_std_on_uint8_batches_are_refused_not_dropped(synthetic):
    with pytest.raises(ringfeed.Error) as e:
        ringfeed.Loader(synthetic, mean=(0.485, 0.456, 0.406), **KW)
    assert "with dtype=uint8 the pixels stay 0..255" in e.value.message, e.value.message


def test_a_bad_sample_in_a_float_batch_is_normalised_zeros(tmp_path):
    np = pytest.importorskip("numpy")
    import io
    import tarfile
    src = tmp_path / "one.tar"
    with tarfile.open(src, "w") as tar:
        for name, data in (("a.jpg", b"\xff\xd8\xff\xe0 not really"), ("a.cls", b"1")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with ringfeed.Loader(str(src), batch_size=1, image_size=4, dtype="float32", framework="numpy", epochs=1,
                         log="quiet") as loader:
        b = next(loader)
    assert b["error"][0] != 0
    want = -np.float32([0.485, 0.456, 0.406]) / np.float32([0.229, 0.224, 0.225])
    assert np.allclose(b["image"][0], want, rtol=0, atol=1e-6)


def test_batch_transform_is_called_on_each_batch(synthetic):
    np = pytest.importorskip("numpy")
    seen = []

    def flip_labels(batch):  # returning None hands out the batch it changed
        seen.append(batch["index"])
        batch["label"] = -batch["label"]
        batch["image"] = batch["image"][:, ::-1]

    def as_new(batch):
        return {"x": batch["image"].astype(np.float32) / 255, "y": batch["label"]}

    kw = dict(KW, framework="numpy", epochs=1, shuffle=False)
    with ringfeed.Loader(synthetic, **kw) as loader:
        plain = [(b["image"].copy(), b["label"].copy()) for b in loader]
    with ringfeed.Loader(synthetic, batch_transform=flip_labels, **kw) as loader:
        flipped = [(b["image"].copy(), b["label"].copy()) for b in loader]
    assert seen == list(range(len(plain)))
    for (img, lab), (fimg, flab) in zip(plain, flipped):
        assert np.array_equal(fimg, img[:, ::-1]) and np.array_equal(flab, -lab)
    with ringfeed.Loader(synthetic, batch_transform=as_new, **kw) as loader:
        b = next(loader)
    assert set(b) == {"x", "y"} and b["x"].dtype == np.float32 and b["x"].max() <= 1
    with pytest.raises(TypeError, match="batch_transform"):
        ringfeed.Loader(synthetic, batch_transform="flip", **kw)


def test_keywords_given_as_none(synthetic):
    with ringfeed.Loader(synthetic, crop=None, flip=None, **KW) as loader:  # an option's default
        assert len(loader) == 4
    for key in ("transform", "num_workers", "shuffle_buffer"):
        with pytest.raises(ringfeed.Error) as e:
            ringfeed.Loader(synthetic, **{key: None}, **KW)
        assert e.value.name == "DL_EOPTION" and f"unknown option '{key}'" in e.value.message
    with pytest.raises(ringfeed.Error, match="batch_transform=fn"):
        ringfeed.Loader(synthetic, transform=lambda b: b, **KW)


def test_an_image_folder_names_its_classes_as_torchvision_does(synthetic, tmp_path):
    pytest.importorskip("numpy")
    import glob
    import os
    import tarfile
    first = sorted(glob.glob(os.path.join(os.path.dirname(synthetic), "*.tar")))[0]
    with tarfile.open(first) as tar:
        jpgs = [m for m in tar.getmembers() if m.name.endswith(".jpg")][:6]
        for i, m in enumerate(jpgs):  # dog, cat, ant in turn: folders are not made in sorted order
            folder = tmp_path / "root" / ("dog", "cat", "ant")[i % 3]
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{i}.jpg").write_bytes(tar.extractfile(m).read())
    with ringfeed.Loader(str(tmp_path / "root"), **dict(KW, batch_size=6, shuffle=False, framework="numpy")) as loader:
        assert loader.classes == ["ant", "cat", "dog"]
        assert loader.class_to_idx == {"ant": 0, "cat": 1, "dog": 2}
        batch = next(loader)  # each key "<class>/<file>"
        assert batch["label"].tolist() == [0, 0, 1, 1, 2, 2]
        assert [loader.classes[label] for label in batch["label"]] == [k.split("/")[0] for k in batch["key"]]
    with ringfeed.Loader(synthetic, **KW) as loader:  # tar shards: labels no folder names
        assert loader.classes is None and loader.class_to_idx is None


def test_shards_made_from_an_image_folder_keep_its_class_names(synthetic, tmp_path):
    import glob
    import os
    import tarfile
    from conftest import DLSHARD
    first = sorted(glob.glob(os.path.join(os.path.dirname(synthetic), "*.tar")))[0]
    with tarfile.open(first) as tar:
        jpgs = [m for m in tar.getmembers() if m.name.endswith(".jpg")][:6]
        for i, m in enumerate(jpgs):
            folder = tmp_path / "root" / ("ant", "cat", "dog")[i // 2]
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{i}.jpg").write_bytes(tar.extractfile(m).read())
    made = subprocess.run([DLSHARD, "create", str(tmp_path / "out" / "x"), str(tmp_path / "root"),
                           "--samples-per-shard", "2"], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0 and made.stdout.startswith("6 samples in 3 shards"), made.stderr
    # the last shard holds dogs alone, and still names every class, as the training script needs
    with ringfeed.Loader(str(tmp_path / "out" / "x-000002.rfs"), **KW) as loader:
        assert loader.classes == ["ant", "cat", "dog"]
        assert loader.class_to_idx == {"ant": 0, "cat": 1, "dog": 2}
    for listed in (tmp_path / "out" / "x-000000.rfs", tmp_path / "root"):  # the shard says them as its folder does
        out = subprocess.run([DLSHARD, "ls", str(listed)], capture_output=True, text=True)
        assert out.returncode == 0 and "  classes 3: ant cat dog\n" in out.stdout, out.stdout
    # written from Python: the same
    path = str(tmp_path / "named.rfs")
    with ringfeed.Writer(path, classes=["no", "yes"]) as w:
        w.add("0", label=1)
    with ringfeed.Loader(path, batch_size=1, framework="dlpack") as loader:
        assert loader.classes == ["no", "yes"]
    with pytest.raises(TypeError, match="list of class names"):
        ringfeed.Writer(path, classes="no")
    with pytest.raises(ringfeed.Error, match="class name 1"):
        ringfeed.Writer(path, classes=["no", ""])
    assert not os.path.exists(path + ".part")


def test_a_mistyped_keyword_names_the_option_it_likely_meant(synthetic):
    for typed, meant in (("imagesize", "image_size"), ("shufle", "shuffle"), ("dtyp", "dtype")):
        with pytest.raises(ringfeed.Error) as e:
            ringfeed.Loader(synthetic, **{typed: 1}, **KW)
        assert e.value.message == f"unknown option '{typed}' (did you mean {meant}?)", e.value.message
        with pytest.raises(ringfeed.Error) as e:  # None is checked by the binding: the same words
            ringfeed.Loader(synthetic, **{typed: None}, **KW)
        assert e.value.message == f"unknown option '{typed}' (did you mean {meant}?)", e.value.message
    out = subprocess.run([DLBENCH, "--synthetic", "10", "--option", "batchsize=8"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 1 and "unknown option 'batchsize' (did you mean batch_size?)" in out.stderr


def test_a_value_is_read_as_written_and_a_mistyped_one_named(synthetic):
    torch = pytest.importorskip("torch")
    with ringfeed.Loader(synthetic, layout="channels-last", crop="Center", **dict(KW, framework="torch")) as loader:
        image = next(loader)["image"]
    assert image.shape[1] == 3 and image.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(ringfeed.Error) as e:
        ringfeed.Loader(synthetic, crop="centre", **KW)
    assert e.value.message.endswith("expected one of random_resized center resize none (did you mean center?)")


def test_a_mistyped_flag_is_said_last_in_one_line():
    from conftest import DLSHARD
    for cmd, said in (([DLBENCH, "--wokers", "4"],
                       "dlbench: unknown option '--wokers' (did you mean --workers? dlbench --help"),
                      ([DLBENCH, "--zzz"], "dlbench: unknown option '--zzz' (dlbench --help"),
                      # another loader's names: the flag that is one of their words
                      ([DLBENCH, "--batch-size", "8"], "dlbench: unknown option '--batch-size' (did you mean --batch?"),
                      ([DLBENCH, "--num_workers=4"], "dlbench: unknown option '--num_workers=4' (did you mean "
                                                     "--workers?"),
                      ([DLBENCH, "--pin-memory"], "dlbench: unknown option '--pin-memory' (dlbench --help"),
                      ([DLBENCH, "--batch"], "dlbench: --batch needs a value"),
                      ([DLSHARD, "create", "--kept", "o", "i.tar"], "dlshard: unknown option '--kept'"),
                      ([DLSHARD, "crate"], "dlshard: unknown command 'crate': create, verify, index or ls")):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and lines[-1].startswith(said), out.stderr


def test_a_framework_that_is_not_installed_says_what_to_install(synthetic):
    import os
    import sys
    code = ("import sys\nsys.modules['numpy'] = None\n"
            f"sys.path.insert(0, {os.path.abspath(os.path.join(os.path.dirname(__file__), '..'))!r})\n"
            "import ringfeed\n"
            f"ringfeed.Loader({synthetic!r}, framework='numpy')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "framework='numpy' needs numpy: pip install numpy" in out.stderr, out.stderr
    assert "apt install python3-numpy" in out.stderr and "framework='dlpack' needs nothing" in out.stderr


def test_dlbench_that_fails_before_a_batch_says_none_came(tmp_path):
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "a.jpg").write_bytes(b"not an image")
    out = subprocess.run([DLBENCH, str(tmp_path), "--on-error", "fail"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1, out.stderr
    assert "first batch none," in out.stdout and "first batch -" not in out.stdout, out.stdout
    assert "cat/a.jpg" in out.stderr.splitlines()[-1] and "not a JPEG, PNG or WebP" in out.stderr, out.stderr


def test_dlbench_says_how_many_workers_it_ran(synthetic):
    # make run shows the default (workers=auto), so the line says what that came to
    import re
    for flags, said in (([], r", \d+ workers?, io "), (["--workers", "1"], r", 1 worker, io "),
                        (["--workers", "3"], r", 3 workers, io ")):
        out = subprocess.run([DLBENCH, synthetic, "--batch", "8", "--size", "32", "--stop-after", "2", *flags],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and re.search(said, out.stdout), out.stdout
