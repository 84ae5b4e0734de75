"""WebP, lossy and lossless, alpha dropped: in tar shards, an ImageFolder and ringfeed shards made
by dlshard, the same pixels as PIL decodes (crop=none)."""
import io
import os
import subprocess
import tarfile

import pytest

import ringfeed

np = pytest.importorskip("numpy")
Image = pytest.importorskip("PIL.Image")
if not __import__("PIL.features", fromlist=["check"]).check("webp"):
    pytest.skip("PIL without WebP", allow_module_level=True)

W, H = 72, 48


def picture(i):
    y, x = np.mgrid[0:H, 0:W]
    rgb = np.stack([(x * 3 + i * 20) % 256, (y * 5 + i * 7) % 256, ((x + y) * 2 + i) % 256], -1).astype(np.uint8)
    alpha = ((x * 7 + y) % 256).astype(np.uint8)
    return Image.fromarray(np.dstack([rgb, alpha]), "RGBA") if i % 3 == 2 else Image.fromarray(rgb)


def webp(i):
    buf = io.BytesIO()
    picture(i).save(buf, format="WEBP", lossless=(i % 2 == 0), quality=80)
    return buf.getvalue()


def pil_pixels(data):
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("webp")
    with tarfile.open(root / "w.tar", "w") as t:
        for i in range(12):
            for ext, data in (("webp", webp(i)), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"{i:04d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    for i in range(12):
        d = root / "folder" / f"c{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:04d}.webp").write_bytes(webp(i))
    (root / "folder" / "c0" / "notes.txt").write_text("not an image")
    return root


def check(source, by_key):
    seen = 0
    # log=warn whatever DL_LOG_LEVEL says: the folder test reads the warning.
    with ringfeed.Loader(str(source), batch_size=4, image_size=(H, W), crop="none", shuffle=False,
                         framework="numpy", log="warn") as loader:
        for batch in loader:
            assert "error" not in batch
            for j, key in enumerate(batch["key"]):
                i = by_key(key)
                diff = np.abs(batch["image"][j].astype(int) - pil_pixels(webp(i)).astype(int))
                assert diff.mean() <= 1, (key, diff.mean())
                seen += 1
    return seen


def test_webp_in_tar_matches_pil(sources):
    assert check(sources / "w.tar", int) == 12


def test_webp_in_an_image_folder(sources, capfd):
    assert check(sources / "folder", lambda k: int(os.path.basename(k).split(".")[0])) == 12
    err = capfd.readouterr().err
    assert "1 file that is not .jpg/.jpeg/.png/.webp was left out (1 .txt)" in err


def test_webp_through_dlshard(sources, tmp_path):
    build = os.path.dirname(os.environ.get("DL_DLSHARD") or os.environ.get("RINGFEED_LIBRARY", ""))
    dlshard = os.path.join(build, "dlshard")
    if not os.path.exists(dlshard):
        pytest.skip("dlshard not built")
    subprocess.run([dlshard, "create", str(tmp_path / "w"), str(sources / "w.tar")], check=True, capture_output=True)
    rfs = tmp_path / "w-000000.rfs"
    listing = subprocess.run([dlshard, "ls", str(rfs)], check=True, capture_output=True, text=True).stdout
    assert "webp" in listing
    assert "ok" in subprocess.run([dlshard, "verify", str(rfs)], capture_output=True, text=True).stdout
    assert check(rfs, int) == 12


def test_animated_webp_is_an_error_naming_it(tmp_path):
    frames = [picture(0), picture(1)]
    buf = io.BytesIO()
    frames[0].save(buf, format="WEBP", save_all=True, append_images=frames[1:], duration=50)
    with tarfile.open(tmp_path / "a.tar", "w") as t:
        info = tarfile.TarInfo("0000.webp")
        info.size = len(buf.getvalue())
        t.addfile(info, io.BytesIO(buf.getvalue()))
    with ringfeed.Loader(str(tmp_path / "a.tar"), batch_size=1, image_size=16, on_error="fail",
                         framework="numpy") as loader:
        with pytest.raises(ringfeed.Error) as e:
            next(loader)
    assert "animated WebP" in e.value.message and "0000.webp" in e.value.message
