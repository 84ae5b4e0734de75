"""The shard cache (cache_dir=, cache_limit=) over nginx: the same stream as local disk, cold and
warm (then no sample is requested), with the global and the block shuffle; a folder that stays
within its limit; two processes sharing it that download each shard once and see whole shards
only; a download cut off by a killed process that is never used; and the GPU check's verdicts on a
shard over HTTP, kept by its URL and version."""
import fcntl
import glob
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servers import DLBENCH, SHARDS, FaultProxy, Nginx, dlbench, dlbench_command, seconds_to_close  # noqa: E402

TAR, RFS = "sweep-gnu.tar", "rfs/packed-{000000..000006}.rfs"
pytestmark = pytest.mark.skipif(not (os.path.exists(DLBENCH) and os.path.exists(os.path.join(SHARDS, TAR))),
                                reason="dlbench or the test shards are not built")
SMALL = ["--batch", "8", "--size", "32", "--crop", "resize", "--epochs", "2"]


def command(source, *args):
    return dlbench_command(source, *SMALL, *args)


def bench(source, *args, env=None):
    return dlbench(source, *SMALL, *args, env=env)


def entries(folder):
    return sorted(n for n in os.listdir(folder) if not n.startswith("."))


def same_bytes(a, b):
    def digest(path):
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    return digest(a) == digest(b)


def original_of(entry):
    """The shard a cache entry copies (entries are VERSION-BASENAME)."""
    base = entry.split("-", 1)[1]
    return os.path.join(SHARDS, base) if base.endswith(".tar") else os.path.join(SHARDS, "rfs", base)


@pytest.fixture(scope="module")
def nginx(tmp_path_factory):
    server = Nginx(SHARDS, str(tmp_path_factory.mktemp("nginx")))
    yield server
    server.stop()


@pytest.mark.parametrize("shard", [TAR, RFS])
@pytest.mark.parametrize("block", [0, 2])
def test_cold_and_warm_cache_give_the_local_stream(nginx, tmp_path, shard, block):
    env = {"XDG_CACHE_HOME": str(tmp_path / "index")}
    opts = ["--workers", "4", "--option", f"shuffle_block={block}"]
    cache = ["--option", f'cache_dir="{tmp_path / "my cache"}"']  # a path with a space, quoted
    local = bench(os.path.join(SHARDS, shard), *opts)
    cold = bench(f"{nginx.url}/{shard}", *opts, *cache, env=env)
    warm = bench(f"{nginx.url}/{shard}", *opts, *cache, env=env)
    for run in (cold, warm):
        assert run["batch_digests"] == local["batch_digests"] and run["errors"] == local["errors"]
    files = len(glob.glob(os.path.join(SHARDS, shard.replace("{000000..000006}", "*"))))
    assert cold["loader"]["cache_fetches"] == files  # a tar downloaded whole to index it counts too
    assert warm["loader"]["requests"] == 0  # not even for a shard coming back into the look-ahead
    assert warm["loader"]["cache_fetches"] == 0
    assert warm["loader"]["cache_hits"] >= warm["samples"] - 4  # all but members of no bytes
    names = entries(tmp_path / "my cache")
    assert len(names) == files and all(same_bytes(tmp_path / "my cache" / n, original_of(n)) for n in names)


def test_the_cache_stays_within_its_limit(nginx, tmp_path):
    folder = tmp_path / "cache"
    limit = 8 << 20  # the largest shard (14 MB) never fits: its samples stay ranged GETs
    opts = ["--workers", "4", "--option", "shuffle_block=2"]
    local = bench(os.path.join(SHARDS, RFS), *opts)
    peak, done = [0], threading.Event()

    def watch():
        # Summed under the folder's lock, which the cache holds while it evicts and reserves: without
        # it, a sum could count an entry just before its eviction and its successor just after.
        while not done.is_set():
            try:
                with open(folder / ".lock", "a") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    peak[0] = max(peak[0], sum(os.path.getsize(folder / n) for n in os.listdir(folder)))
            except FileNotFoundError:
                pass
            time.sleep(0.002)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        run = bench(f"{nginx.url}/{RFS}", *opts, "--option", f"cache_dir={folder}", "--option",
                    f"cache_limit={limit}", env={"XDG_CACHE_HOME": str(tmp_path / "index")})
    finally:
        done.set()
        watcher.join()
    assert run["batch_digests"] == local["batch_digests"]
    assert 0 < peak[0] <= limit
    assert run["loader"]["cache_hits"] > 0 and run["loader"]["requests"] > 0
    assert run["loader"]["cache_fetches"] > len(entries(folder))  # evicted and fetched again


def whole_gets(log, name):
    with open(log) as f:
        return [ln for ln in f if f"/{name} " in ln and ln.rstrip().endswith(("range=", "range=-"))]


def test_two_processes_share_the_cache_and_each_shard_is_fetched_once(nginx, tmp_path):
    folder, env = tmp_path / "cache", dict(os.environ, DL_LOG_LEVEL="1", XDG_CACHE_HOME=str(tmp_path / "index"))
    opts = ["--workers", "2", "--option", "shuffle_block=2", "--world-size", "2"]
    before = {n: len(whole_gets(nginx.access_log, n)) for n in os.listdir(os.path.join(SHARDS, "rfs"))}
    ranks = [subprocess.Popen(command(f"{nginx.url}/{RFS}", *opts, "--rank", str(r), "--option",
                                      f"cache_dir={folder}"), stdout=subprocess.PIPE, text=True, env=env)
             for r in range(2)]
    outs = [json.loads(p.communicate(timeout=300)[0]) for p in ranks]
    assert all(p.returncode == 0 for p in ranks)
    for r in range(2):
        local = bench(os.path.join(SHARDS, RFS), *opts, "--rank", str(r))
        assert outs[r]["batch_digests"] == local["batch_digests"]
    names = entries(folder)
    assert len(names) == 7 and not [n for n in names if n.endswith(".part")]
    assert all(same_bytes(folder / n, original_of(n)) for n in names)
    for n in names:
        base = n.split("-", 1)[1]
        assert len(whole_gets(nginx.access_log, base)) - before[base] == 1, base
    assert sum(o["loader"]["cache_fetches"] for o in outs) == 7


def test_a_download_cut_off_is_never_used(nginx, tmp_path):
    folder = tmp_path / "cache"
    shard = "rfs/packed-000001.rfs"
    # The probe and the index pass; then the proxy holds every answer: the download stalls.
    proxy = FaultProxy(nginx.port, stall_s=60, after=2)
    try:
        env = dict(os.environ, DL_LOG_LEVEL="1", XDG_CACHE_HOME=str(tmp_path / "index"))
        p = subprocess.Popen(command(f"{proxy.url}/{shard}", "--workers", "2", "--option", f"cache_dir={folder}"),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        deadline = time.time() + 30
        while not glob.glob(str(folder / "*.part")) and time.time() < deadline:
            time.sleep(0.01)
        parts = glob.glob(str(folder / "*.part"))
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert parts and not [n for n in entries(folder) if not n.endswith(".part")]
        proxy.stall_s = 0
        local = bench(os.path.join(SHARDS, shard), "--workers", "2")
        again = bench(f"{proxy.url}/{shard}", "--workers", "2", "--option", f"cache_dir={folder}",
                      env={"XDG_CACHE_HOME": str(tmp_path / "index")})
    finally:
        proxy.stop()
    assert again["batch_digests"] == local["batch_digests"]
    names = entries(folder)
    assert len(names) == 1 and not names[0].endswith(".part") and same_bytes(folder / names[0], original_of(names[0]))


def test_cache_options_are_checked(tmp_path):
    out = subprocess.run(command(os.path.join(SHARDS, TAR), "--option", f"cache_dir={tmp_path}"),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "cache_dir" in out.stderr and "local disk" in out.stderr
    out = subprocess.run(command("http://127.0.0.1:9/x.tar", "--option", "cache_limit=1G"), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1 and "cache_limit needs cache_dir" in out.stderr


def test_a_nested_cache_dir_is_made_and_a_shard_over_the_limit_is_said(nginx, tmp_path):
    """cache_dir's missing parents are made, as mkdir -p does; a shard larger than cache_limit is
    read in place all run long, the same stream, and the run says so once."""
    folder = tmp_path / "a" / "b" / "cache"
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "index"), DL_LOG_LEVEL="2")
    local = bench(os.path.join(SHARDS, TAR))
    out = subprocess.run(command(f"{nginx.url}/{TAR}", "--option", f"cache_dir={folder}", "--option",
                                 "cache_limit=1M"), capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and json.loads(out.stdout)["batch_digests"] == local["batch_digests"], out.stderr
    said = [line for line in out.stderr.splitlines() if "never cached" in line]
    assert said == [f"ringfeed warning: shard cache {folder}: 1 shard larger than its 1 MB ({nginx.url}/{TAR}, "
                    f"{os.path.getsize(os.path.join(SHARDS, TAR)) / 1e6:.0f} MB) is read in place with ranged GETs, "
                    "never cached: raise cache_limit"], out.stderr[-1500:]
    assert folder.is_dir() and not entries(folder)


@pytest.mark.binding
def test_close_does_not_wait_for_a_stalled_download(nginx, tmp_path):
    if not os.environ.get("RINGFEED_LIBRARY"):
        pytest.skip("the Python binding needs RINGFEED_LIBRARY")
    folder = tmp_path / "cache"
    proxy = FaultProxy(nginx.port, stall_s=20, after=2)  # the probe and the index; then nothing comes
    try:  # the whole-shard download and the ranged reads in flight, stalled
        took = seconds_to_close(proxy.url + "/rfs/packed-000001.rfs", {"XDG_CACHE_HOME": str(tmp_path / "index")},
                                0.5, workers=2, cache_dir=str(folder))
    finally:
        proxy.stop()
    assert took < 0.5 and proxy.counts["stall"] > 0
    assert entries(folder) == []  # the abandoned download was removed


def test_gpu_check_verdicts_of_a_url_are_kept_by_its_version(tmp_path):
    """The GPU check's verdicts on a shard over HTTP are named by its URL and version (size and
    ETag), as its cached index is: a second open reads no scan; the shard changed on the server,
    they are read again. The C test does the opens (the verdicts are internal) against nginx."""
    binary = os.path.join(os.path.dirname(DLBENCH), "tests", "test_check_cache")
    if not os.path.exists(binary):
        pytest.skip("test_check_cache is not built")
    served = tempfile.mkdtemp(prefix="rf-served-")  # not under tmp_path, which nginx's workers may not read
    os.chmod(served, 0o755)
    server = Nginx(served, str(tmp_path / "nginx"))
    try:
        out = subprocess.run([binary, server.url, served], capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, DL_LOG_LEVEL="1"))
    finally:
        server.stop()
        shutil.rmtree(served)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    assert "a shard over HTTP: a second open keeps every verdict" in out.stdout, out.stdout
    assert "a compressed shard over HTTP, read from a local copy: a second open keeps" in out.stdout, out.stdout
