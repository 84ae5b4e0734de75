"""The binding on a GPU with PyTorch: tensors on cuda:N equal the CPU batches, float conversion,
and the consumer's stream ordering. Skipped where torch has no CUDA device."""

import io
import json
import os
import subprocess
import sys
import tarfile
import time

import pytest

import ringfeed

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
Image = pytest.importorskip("PIL.Image")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpu") / "s.tar"
    rng = np.random.default_rng(0)
    with tarfile.open(path, "w") as t:
        for i in range(70):
            h, w = 120 + i % 50, 160 + i % 70
            base = rng.integers(0, 255, (h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
            img = Image.fromarray(base).resize((w, h), Image.BILINEAR)
            buf = io.BytesIO()
            img.save(buf, format="JPEG", quality=90)
            for name, data in ((f"{i:04d}.jpg", buf.getvalue()), (f"{i:04d}.cls", str(i % 7).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return str(path)


def test_cuda_tensors_equal_cpu_batches(shard):
    kw = dict(batch_size=16, image_size=64, seed=1, flip=True, workers=4, decode="cpu")
    cpu = [{k: (v.clone() if hasattr(v, "clone") else v) for k, v in b.items()}
           for b in ringfeed.Loader(shard, device="cpu", **kw)]
    n = 0
    for b, ref in zip(ringfeed.Loader(shard, device="cuda:0", **kw), cpu):
        assert b["image"].device.type == "cuda" and b["label"].device.type == "cuda"
        assert torch.equal(b["image"].cpu(), ref["image"])
        assert torch.equal(b["label"].cpu(), ref["label"])
        assert b["key"] == ref["key"]
        n += 1
    assert n == len(cpu) == 5


def test_the_loaders_threads_carry_their_names(shard):
    """top -H, gdb and /proc show which thread is the copy thread and which the workers."""
    def names():
        out = set()
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    out.add(f.read().strip())
            except OSError:
                pass  # ended meanwhile
        return out

    with ringfeed.Loader(shard, device="cuda:0", batch_size=16, image_size=64, workers=2) as loader:
        next(iter(loader))
        seen = names()
    assert {"rf-copy-0", "rf-worker-0", "rf-worker-1"} <= seen and "rf-worker-2" not in seen, seen


def test_float_batches_of_the_cpu_equal_the_gpus(shard):
    """The workers' normalisation (device=cpu) and the GPU's kernel give the same values: float32
    exactly (both multiply, then add, each rounded), bfloat16 and float16 to within one unit of
    their last place."""
    kw = dict(batch_size=16, image_size=48, seed=4, flip=True, workers=4, decode="cpu", epochs=1)
    for dtype, layout in (("float32", "NHWC"), ("bfloat16", "NCHW"), ("float16", "NHWC"), ("bfloat16", "channels_last")):
        cpu = [b["image"].clone() for b in ringfeed.Loader(shard, device="cpu", dtype=dtype, layout=layout, **kw)]
        gpu = [b["image"].cpu() for b in ringfeed.Loader(shard, device="cuda", dtype=dtype, layout=layout, **kw)]
        assert len(cpu) == len(gpu) == 5
        for c, g in zip(cpu, gpu):
            assert c.dtype == g.dtype and c.shape == g.shape and c.stride() == g.stride()
            if dtype == "float32":
                assert torch.equal(c, g), (dtype, (c - g).abs().max())
                continue
            ulp = torch.finfo(c.dtype).eps * torch.maximum(c.float().abs(), g.float().abs()).clamp(min=1)
            assert ((c.float() - g.float()).abs() <= ulp).all(), (dtype, (c.float() - g.float()).abs().max())


def test_batch_transform_runs_on_the_gpu_batch(shard):
    v2 = pytest.importorskip("torchvision.transforms.v2")
    jitter = v2.ColorJitter(brightness=0.5)
    devices = []

    def augment(batch):
        devices.append(batch["image"].device.type)
        batch["image"] = jitter(batch["image"])

    kw = dict(batch_size=16, image_size=48, workers=4, epochs=1, dtype="float32", layout="NCHW")
    with ringfeed.Loader(shard, device="cuda", batch_transform=augment, **kw) as loader:
        shapes = [b["image"].shape for b in loader]
    assert devices == ["cuda"] * 5 and shapes[0] == (16, 3, 48, 48)


def test_cuda_normalized_bfloat16_nchw(shard):
    kw = dict(batch_size=32, image_size=32, seed=2, workers=4, decode="cpu")
    ref = next(ringfeed.Loader(shard, device="cpu", **kw))["image"].double()
    b = next(ringfeed.Loader(shard, device="cuda", dtype="bfloat16", layout="NCHW", **kw))
    img = b["image"]
    assert img.dtype == torch.bfloat16 and img.shape == (32, 3, 32, 32)
    mean = torch.tensor([0.485, 0.456, 0.406], dtype=torch.float64)
    std = torch.tensor([0.229, 0.224, 0.225], dtype=torch.float64)
    want = ((ref / 255 - mean) / std).permute(0, 3, 1, 2)
    got = img.double().cpu()
    rel = (got - want).norm() / want.norm()
    assert rel < 8e-3



def test_dali_scale_mean_std_and_torch_dtypes(shard):
    """A DALI user's normalisation (0..255 scale) and torch.float16 as the dtype give what
    torchvision's 0..1 scale and "float16" give, not pixels divided by 255 twice."""
    kw = dict(batch_size=32, image_size=32, seed=2, workers=4, decode="cpu", device="cuda")
    ours = next(ringfeed.Loader(shard, dtype="float16", **kw))["image"]
    dali = next(ringfeed.Loader(shard, dtype=torch.float16, mean=[0.485 * 255, 0.456 * 255, 0.406 * 255],
                                std=[0.229 * 255, 0.224 * 255, 0.225 * 255], **kw))["image"]
    assert dali.dtype == torch.float16 and torch.allclose(dali.float(), ours.float(), atol=2e-3)
    unit = next(ringfeed.Loader(shard, dtype=np.float32, mean=(0, 0, 0), std=(255, 255, 255), **kw))["image"]
    assert unit.dtype == torch.float32 and 0 <= float(unit.min()) and float(unit.max()) <= 1
    assert float(unit.max()) > 0.5

def test_consumer_stream_work_sees_each_batch(shard):
    s = torch.cuda.Stream()
    sums, want = [], []
    kw = dict(batch_size=8, image_size=48, seed=3, workers=4, epochs=2, decode="cpu")
    for b in ringfeed.Loader(shard, device="cpu", **kw):
        want.append(int(b["image"].long().sum()))
    with torch.cuda.stream(s):
        for b in ringfeed.Loader(shard, device="cuda:0", device_slots=2, **kw):
            torch.cuda._sleep(2_000_000)  # a long step queued before the sum
            sums.append(b["image"].long().sum())
    torch.cuda.synchronize()
    assert [int(x) for x in sums] == want


def test_labels_kept_past_their_slots_come_from_the_current_stream(shard):
    """The labels are the loop's own tensors, which the library fills on the current stream (not
    the default one here): kept over an epoch of nine batches in two slots, each still holds its
    batch's."""
    kw = dict(batch_size=8, image_size=32, seed=5, workers=4, epochs=1, decode="cpu")
    want = [b["label"].clone() for b in ringfeed.Loader(shard, device="cpu", **kw)]
    s = torch.cuda.Stream()
    kept = []
    with torch.cuda.stream(s):
        for b in ringfeed.Loader(shard, device="cuda:0", device_slots=2, **kw):
            assert b["label"].device == torch.device("cuda", 0) and b["label"].dtype == torch.int64
            kept.append(b["label"])
            torch.cuda._sleep(2_000_000)  # a long step: the next batches' copies queue behind it
    torch.cuda.synchronize()
    assert len(kept) == len(want) == 9
    assert all(torch.equal(k.cpu(), w) for k, w in zip(kept, want))


def test_gpu_decode_close_to_cpu(shard):
    """decode="gpu": nvJPEG and the crop kernel give the CPU path's crops within 2 levels."""
    kw = dict(batch_size=16, image_size=64, seed=4, flip=True, workers=4)
    try:
        gpu_loader = ringfeed.Loader(shard, device="cuda:0", decode="gpu", **kw)
    except ringfeed.Error as e:
        assert e.name == "DL_ENODEVICE"
        pytest.skip(f"no nvJPEG: {e.message}")
    cpu = [b["image"].clone() for b in ringfeed.Loader(shard, device="cpu", **kw)]
    worst = 0.0
    for b, ref in zip(gpu_loader, cpu):
        diff = (b["image"].cpu().int() - ref.int()).abs().double().mean(dim=(1, 2, 3))
        worst = max(worst, float(diff.max()))
    stats = gpu_loader.stats()
    assert stats["decode_backend"] == "gpu" and stats["gpu_decoded"] > 0
    assert worst <= 2.0


def test_set_epoch_reopens_with_the_gpu_decoders_kept(shard):
    """set_epoch reopens the loader: nvJPEG's decoders, kept at its close, decode from the first
    batch of the new epoch instead of the CPU alone while nvJPEG starts again."""
    kw = dict(batch_size=12, image_size=64, seed=2, workers=3, device="cuda:0")  # a shape of its own
    loader = ringfeed.Loader(shard, **kw)
    next(iter(loader))  # a batch of epoch 0, dropped
    for _ in range(100):  # decode=auto: nvJPEG starts in the background
        s = loader.stats()
        if s["decode_backend"] == "hybrid" or "no GPU decoder" in s["decode_reason"]:
            break
        time.sleep(0.05)
    if s["decode_backend"] != "hybrid":
        pytest.skip(f"no nvJPEG: {s['decode_reason']}")
    loader.set_epoch(1)
    batch = next(iter(loader))
    s = loader.stats()
    assert s["decode_backend"] == "hybrid", s["decode_reason"]
    assert "kept from a loader closed earlier in this process" in s["decode_reason"]
    assert batch["epoch"] == 1 and s["first_batch_ms"] < 800, s["first_batch_ms"]
    loader.close()


def test_workers_auto_leaves_a_cpu_to_the_gpu_decoder(shard, monkeypatch):
    """The copy thread feeding nvJPEG gets a CPU of its own; decode="cpu" keeps every CPU for workers."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    cpus = len(os.sched_getaffinity(0))
    kw = dict(batch_size=16, image_size=64, device="cuda:0")
    with ringfeed.Loader(shard, decode="cpu", **kw) as loader:
        assert loader.stats()["workers"] == cpus
    try:
        loader = ringfeed.Loader(shard, decode="hybrid", **kw)
    except ringfeed.Error as e:
        assert e.name == "DL_ENODEVICE"
        pytest.skip(f"no nvJPEG: {e.message}")
    with loader:
        s = loader.stats()
    assert s["workers"] == max(1, cpus - 1), s["workers_reason"]
    if cpus > 1:
        assert s["workers_reason"] == (f"workers=auto: {cpus - 1}, the CPUs this process may use, "
                                       "less one for the thread feeding the GPU's JPEG decoder")


def test_cuda_work_queues_in_stats(shard):
    """Loaded before CUDA started (this test process imports ringfeed first), the library asked for
    32 hardware queues unless the user set CUDA_DEVICE_MAX_CONNECTIONS; the stats say which."""
    with ringfeed.Loader(shard, batch_size=16, image_size=64, device="cuda:0", decode="cpu") as loader:
        s = loader.stats()
    user = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")  # Python's copy: as it was before the library loaded
    if user:
        assert s["cuda_queues"] == int(user) and "as set before ringfeed" in s["cuda_queues_reason"]
    else:
        assert s["cuda_queues"] == 32 and "ringfeed asked for 32" in s["cuda_queues_reason"]


def run_after_torch_started_cuda(shard, env_queues=None):
    """Opens a hybrid-decoding loader in a new process where PyTorch started CUDA before ringfeed was
    loaded; returns its stats' queue fields and its log. Skips where nvJPEG does not load."""
    code = (
        "import json, sys, torch\n"
        "torch.zeros(1, device='cuda')\n"
        f"sys.path.insert(0, {os.path.abspath(os.path.join(os.path.dirname(__file__), '..'))!r})\n"
        "import ringfeed\n"
        f"with ringfeed.Loader({shard!r}, batch_size=16, image_size=64, device='cuda:0',\n"
        "                     decode='hybrid') as loader:\n"
        "    next(loader)\n"
        "    s = loader.stats()\n"
        "print(json.dumps({k: s[k] for k in ('cuda_queues', 'cuda_queues_reason', 'decode_backend')}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    if env_queues is not None:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = env_queues
    env["DL_LOG_LEVEL"] = "2"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    if out.returncode != 0 and "DL_ENODEVICE" in out.stderr:
        pytest.skip(f"no nvJPEG: {out.stderr.strip().splitlines()[-1]}")
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout.splitlines()[-1])
    assert s["decode_backend"] == "hybrid"
    return s, out.stderr


def test_cuda_started_before_ringfeed_is_named(shard):
    """PyTorch starting CUDA before ringfeed is loaded leaves CUDA's 8 queues, shared with the model: the
    stats say so, and with JPEG decoding on the GPU a warning names the fix."""
    s, log = run_after_torch_started_cuda(shard)
    assert s["cuda_queues"] == 8 and "CUDA was loaded in this process before ringfeed" in s["cuda_queues_reason"]
    assert "set CUDA_DEVICE_MAX_CONNECTIONS=32" in log, log


def test_cuda_queues_set_to_nonsense_is_named_not_echoed(shard):
    """A CUDA_DEVICE_MAX_CONNECTIONS that is not a number of queues is reported as such; its text,
    quote and backslash included, stays out of the stats' JSON (which must still parse)."""
    s, log = run_after_torch_started_cuda(shard, env_queues='many"\\')
    assert s["cuda_queues"] == 8
    assert "not to a whole number from 1 to 32" in s["cuda_queues_reason"], s["cuda_queues_reason"]
    assert "many" not in s["cuda_queues_reason"]
