"""Every crop mode's pixels against PIL, and against torchvision where it is installed: real
photos and reference images from ../shared/testdata (JPEG and PNG) and the synthetic sets (q90
4:2:0 and q96 4:4:4), flips, both layouts.

The reference decodes the whole image, takes the same source rectangle and resamples it with
PIL's antialiased bilinear filter; ringfeed decodes JPEGs at 1/2, 1/4 or 1/8 scale where the
crop allows and resamples in fixed point, so the two differ by the spread of those choices,
bounded here per image. The rectangle of random_resized comes from the loader's documented draws:
splitmix64 of (seed, epoch, index), then torchvision's RandomResizedCrop algorithm, recomputed
below, so a change to the crops a seed selects fails this test too.
"""
import io
import math
import os
import subprocess
import tarfile

import pytest

import ringfeed
from conftest import TESTDATA

np = pytest.importorskip("numpy")
Image = pytest.importorskip("PIL.Image")

PHOTOS = [os.path.join(TESTDATA, *p) for p in [
    ("jpeg-decoder", "benches", "tower.jpg"), ("jpeg-decoder", "benches", "large_image.jpg"),
    ("libjpeg-turbo", "testimages", "testorig.jpg"), ("libjpeg-turbo", "testimages", "testorig.png"),
    ("libjpeg-turbo", "testimages", "vgl_5674_0098.png")]]
needs_testdata = pytest.mark.skipif(not all(map(os.path.exists, PHOTOS)), reason="third-party test data absent")
BUILD = os.path.dirname(os.environ.get("DL_DLSHARD") or os.environ.get("RINGFEED_LIBRARY", ""))
DLBENCH = os.path.join(BUILD, "dlbench")
SEED, H, W = 7, 112, 144
# Per image: the mean difference (the GPU decode's bound too), and the share of pixels more than 8
# levels off (fine detail, where a DCT-scaled decode and a full one part most).
LIMITS = (2.0, 0.03)
# The synthetic sets carry per-pixel grain, which a 1/2-scale decode removes differently from a
# full decode and a triangle filter: up to 2.3 levels on average per image (measured).
SYNTHETIC_LIMITS = (2.5, 0.03)
M64 = (1 << 64) - 1


def mix64(z):
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def uniform(key, draw):
    return (mix64(key ^ mix64(draw)) >> 11) * 2.0 ** -53


def sample_key(seed, epoch, index):
    return mix64(mix64(mix64(seed) ^ epoch) ^ index)


def lround(x):
    return int(math.floor(x + 0.5)) if x >= 0 else -int(math.floor(-x + 0.5))


def random_resized(width, height, key):
    area = width * height
    lo, hi = math.log(3 / 4), math.log(4 / 3)
    for attempt in range(10):
        base = attempt * 4
        target = area * (0.08 + 0.92 * uniform(key, base))
        ratio = math.exp(lo + (hi - lo) * uniform(key, base + 1))
        w, h = lround(math.sqrt(target * ratio)), lround(math.sqrt(target / ratio))
        if 0 < w <= width and 0 < h <= height:
            y = min(int(uniform(key, base + 2) * (height - h + 1)), height - h)
            x = min(int(uniform(key, base + 3) * (width - w + 1)), width - w)
            return x, y, w, h
    raise AssertionError("these images never need the centre fallback")


def rectangle(crop, width, height, key):
    if crop == "resize":
        return 0, 0, width, height
    if crop == "center":
        scale = (min(W, H) / 0.875) / min(width, height)
        w, h = min(W / scale, width), min(H / scale, height)
        return (width - w) / 2, (height - h) / 2, w, h
    return random_resized(width, height, key)


def reference(image, crop, index):
    key = sample_key(SEED, 0, index)
    x, y, w, h = rectangle(crop, image.width, image.height, key)
    out = np.asarray(image.resize((W, H), Image.BILINEAR, box=(x, y, x + w, y + h), reducing_gap=None))
    return out[:, ::-1] if uniform(key, 1000) < 0.5 else out, (x, y, w, h)


def synthetic(tmp_path, quality, subsampling):
    if not os.path.exists(DLBENCH):
        pytest.skip("dlbench not built")
    env = dict(os.environ, DL_SYNTHETIC_DIR=str(tmp_path / "synthetic"))
    out = subprocess.run([DLBENCH, "--make-synthetic", "--synthetic", "24", "--quality", str(quality),
                          "--subsampling", str(subsampling)], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    pattern = out.stdout.split()[-1]
    images = []
    for shard in sorted(n for n in os.listdir(os.path.dirname(pattern)) if n.endswith(".tar")):
        with tarfile.open(os.path.join(os.path.dirname(pattern), shard)) as t:
            images += [t.extractfile(m).read() for m in t.getmembers() if m.name.endswith(".jpg")]
    return images


def add(tar, i, data):
    info = tarfile.TarInfo(f"{i:04d}." + ("png" if data[:4] == b"\x89PNG" else "jpg"))
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def check(tmp_path, blobs, crop, layout, limits, names):
    shard = tmp_path / f"{crop}-{layout}.tar"
    with tarfile.open(shard, "w") as t:
        for i, data in enumerate(blobs):
            add(t, i, data)
    with ringfeed.Loader(str(shard), batch_size=len(blobs), image_size=(H, W), crop=crop, flip=True, seed=SEED,
                         shuffle=False, workers=2, layout=layout, framework="numpy") as loader:
        got = next(loader)["image"]
    if layout == "NCHW":
        got = got.transpose(0, 2, 3, 1)
    flips, worst = 0, []
    for i, data in enumerate(blobs):
        image = Image.open(io.BytesIO(data)).convert("RGB")
        want, box = reference(image, crop, i)
        flips += uniform(sample_key(SEED, 0, i), 1000) < 0.5
        diff = np.abs(got[i].astype(int) - want.astype(int))
        mean_limit, max_share = limits
        worst.append((diff.mean(), (diff > 8).mean(), names[i], box))
        assert diff.mean() <= mean_limit and (diff > 8).mean() <= max_share, (names[i], crop, layout, box,
                                                                                 diff.mean(), (diff > 8).mean())
    assert 0 < flips < len(blobs) or len(blobs) < 4
    return max(worst)


@needs_testdata
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("crop", ["random_resized", "center", "resize"])
def test_shared_images_against_pil(tmp_path, crop, layout):
    blobs = [open(p, "rb").read() for p in PHOTOS] * 4  # four draws of each
    names = [os.path.basename(p) for p in PHOTOS] * 4
    worst = check(tmp_path, blobs, crop, layout, LIMITS, names)
    print(f"{crop} {layout}: worst image {worst[2]} mean {worst[0]:.3f}, {worst[1]:.4f} of pixels over 8 levels")


@pytest.mark.parametrize("coding", [(90, 420), (96, 444)])
@pytest.mark.parametrize("crop", ["random_resized", "center"])
def test_synthetic_sets_against_pil(tmp_path, crop, coding):
    blobs = synthetic(tmp_path, *coding)
    worst = check(tmp_path, blobs, crop, "NHWC", SYNTHETIC_LIMITS, [f"synthetic {i}" for i in range(len(blobs))])
    print(f"q{coding[0]} {coding[1]} {crop}: worst image {worst[2]} mean {worst[0]:.3f}")


@needs_testdata
def test_resize_against_torchvision(tmp_path):
    """torchvision's antialiased bilinear resize of the decoded image (crop=resize: the whole image)."""
    torch = pytest.importorskip("torch")
    F = pytest.importorskip("torchvision.transforms.functional")
    blobs = [open(p, "rb").read() for p in PHOTOS]
    shard = tmp_path / "tv.tar"
    with tarfile.open(shard, "w") as t:
        for i, data in enumerate(blobs):
            add(t, i, data)
    with ringfeed.Loader(str(shard), batch_size=len(blobs), image_size=(H, W), crop="resize", shuffle=False,
                         workers=2, layout="NCHW", framework="numpy") as loader:
        got = next(loader)["image"]
    for i, p in enumerate(PHOTOS):
        full = torch.from_numpy(np.asarray(Image.open(p).convert("RGB")).copy()).permute(2, 0, 1)
        want = F.resize(full, [H, W], interpolation=F.InterpolationMode.BILINEAR, antialias=True).numpy()
        diff = np.abs(got[i].astype(int) - want.astype(int))
        print(f"{os.path.basename(p)}: mean {diff.mean():.3f} max {diff.max()}")
        assert diff.mean() <= LIMITS[0] and (diff > 8).mean() <= LIMITS[1], (p, diff.mean(), (diff > 8).mean())
