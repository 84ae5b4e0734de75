"""MosaicML Streaming (MDS) datasets on a web server: read through the URL of their index.json (or
of its folder), the same stream as from the local copy; each shard's sample table built from one
download, then kept in the index cache; clear errors for what is missing or not read."""
import io
import json
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servers import DLBENCH, SHARDS, Nginx, dlbench  # noqa: E402

TESTDATA = pathlib.Path(__file__).resolve().parents[3] / "shared" / "testdata" / "mds"
pytestmark = pytest.mark.skipif(not (os.path.exists(DLBENCH) and os.path.exists(os.path.join(SHARDS, "sweep-gnu.tar"))),
                                reason="dlbench or the test shards are not built")
SMALL = ["--batch", "8", "--size", "32", "--crop", "resize", "--workers", "2"]


def write_jpeg_mds(folder, samples=200, per_shard=64):
    """The first SAMPLES JPEGs of the test shard sweep-gnu.tar with their labels, as MDSWriter lays
    out an MDS dataset of columns image (jpeg) and label (int)."""
    with tarfile.open(os.path.join(SHARDS, "sweep-gnu.tar")) as t:
        members = {os.path.basename(m.name): t.extractfile(m).read() for m in t.getmembers() if m.isfile()}
    keys = sorted(n[:-4] for n in members if n.endswith(".jpg"))[:samples]
    rows = [(members[k + ".jpg"], int(members[k + ".cls"])) for k in keys]
    os.makedirs(folder)
    shards = []
    for s in range(0, len(rows), per_shard):
        body = [struct.pack("<I", len(jpg)) + jpg + struct.pack("<q", label) for jpg, label in rows[s:s + per_shard]]
        conf = {"column_encodings": ["jpeg", "int"], "column_names": ["image", "label"], "column_sizes": [None, 8],
                "compression": None, "format": "mds", "hashes": [], "samples": len(body), "size_limit": 1 << 26,
                "version": 2, "zip_data": None}
        settings = json.dumps(conf, sort_keys=True).encode()
        at = [4 + 4 * (len(body) + 1) + len(settings)]
        for b in body:
            at.append(at[-1] + len(b))
        data = struct.pack(f"<I{len(at)}I", len(body), *at) + settings + b"".join(body)
        base = f"shard.{s // per_shard:05d}.mds"
        (pathlib.Path(folder) / base).write_bytes(data)
        shards.append(dict(conf, raw_data={"basename": base, "bytes": len(data), "hashes": {}}))
    (pathlib.Path(folder) / "index.json").write_text(json.dumps({"shards": shards, "version": 2}))
    return len(rows)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """nginx over a folder outside pytest's own (private to its user, where nginx's workers, run as
    another user under root, could not read) holding the datasets."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="ringfeed-mds-"))
    root.chmod(0o755)
    images = write_jpeg_mds(str(root / "images"))
    if TESTDATA.is_dir():
        shutil.copytree(TESTDATA, root / "third-party")
    for d in [root, *root.rglob("*")]:
        d.chmod(0o755 if d.is_dir() else 0o644)
    server = Nginx(str(root), str(tmp_path_factory.mktemp("nginx")))
    yield root, server, images
    server.stop()
    shutil.rmtree(root)


def zstd_d(path):
    return subprocess.run(["zstd", "-dc", str(path)], check=True, capture_output=True).stdout


def whole_gets(log, name):
    with open(log) as f:
        return [line for line in f if f"/{name} " in line and line.rstrip().endswith(("range=", "range=-"))]


def test_an_mds_dataset_over_http_is_the_local_stream(served, tmp_path):
    root, server, images = served
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    local = dlbench(str(root / "images"), *SMALL, "--flip", env=env)
    assert local["samples"] == images
    for url in (f"{server.url}/images/index.json", f"{server.url}/images/"):
        for _ in range(2):  # the second from the index cache
            remote = dlbench(url, *SMALL, "--flip", env=env)
            assert remote["batch_digests"] == local["batch_digests"] and remote["errors"] == local["errors"]
            assert remote["io_backend"] == "http" and remote["loader"]["requests"] > 0
    # Each shard was downloaded whole once, to read its samples' column sizes; later opens found
    # its sample table in the index cache.
    assert len(whole_gets(server.access_log, "images/shard.00000.mds")) == 1
    token = dlbench(str(root / "images"), *SMALL, "--stop-after", "2", env=env)["state"]
    rest = dlbench(str(root / "images"), *SMALL, "--resume", token, env=env)
    assert dlbench(f"{server.url}/images/", *SMALL, "--resume", token, env=env)["batch_digests"] == rest["batch_digests"]


@pytest.mark.skipif(not TESTDATA.is_dir(), reason="the shared test data is not there")
@pytest.mark.parametrize("name", ["naive_MDSdataset", "joining-sample_dataset/pet", "joining-sample_dataset/x"])
def test_third_party_datasets_over_http(served, tmp_path, name):
    """Text and number columns, and a merged index whose shards sit in subfolders."""
    root, server, _ = served
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    local = dlbench(str(TESTDATA / name), "--batch", "4", env=env)
    for _ in range(2):
        remote = dlbench(f"{server.url}/third-party/{name}/index.json", "--batch", "4", env=env)
        assert remote["samples"] == local["samples"] > 0 and remote["batch_digests"] == local["batch_digests"]
    shard = json.loads((TESTDATA / name / "index.json").read_text())["shards"][0]["raw_data"]["basename"]
    # Tensor columns too: the second open took the sample table from the index cache.
    assert len(whole_gets(server.access_log, f"third-party/{name}/{shard}")) == 1


def test_with_a_shard_cache_every_shard_is_fetched_once(served, tmp_path):
    root, server, _ = served
    env = {"XDG_CACHE_HOME": str(tmp_path / "index")}
    cache = ["--option", f"cache_dir={tmp_path / 'shards'}"]
    local = dlbench(str(root / "images"), *SMALL, env=env)
    cold = dlbench(f"{server.url}/images/", *SMALL, *cache, env=env)
    warm = dlbench(f"{server.url}/images/", *SMALL, *cache, env=env)
    assert cold["batch_digests"] == warm["batch_digests"] == local["batch_digests"]
    assert cold["loader"]["cache_fetches"] == len(list((root / "images").glob("*.mds")))
    assert warm["loader"]["requests"] == 0 and warm["loader"]["cache_fetches"] == 0


def test_shard_names_that_are_not_url_safe_are_requested_as_named(served, tmp_path):
    """A basename holding a space, '?' or '#' is a name to percent-encode, not a query or a fragment."""
    root, server, _ = served
    odd = root / "odd"
    shutil.copytree(root / "images", odd)
    index = json.loads((odd / "index.json").read_text())
    for i, shard in enumerate(index["shards"]):
        name = f"part {i}?#%.mds"
        (odd / shard["raw_data"]["basename"]).rename(odd / name)
        shard["raw_data"]["basename"] = name
    (odd / "index.json").write_text(json.dumps(index))
    for p in odd.iterdir():
        p.chmod(0o644)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    local = dlbench(str(root / "images"), *SMALL, env=env)
    remote = dlbench(f"{server.url}/odd/", *SMALL, env=env)
    assert remote["batch_digests"] == local["batch_digests"] and remote["errors"] == local["errors"]


def test_what_is_missing_or_not_read_is_named(served, tmp_path):
    root, server, _ = served
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    out = dlbench(f"{server.url}/none/", *SMALL, env=env, ok=False)
    assert out.returncode == 1 and f"{server.url}/none/index.json: HTTP 404" in out.stderr
    assert f"a folder is read as an MDS dataset: give tar or ringfeed shards" in out.stderr
    broken = root / "broken"
    shutil.copytree(root / "images", broken)
    (broken / "shard.00001.mds").unlink()
    out = dlbench(f"{server.url}/broken/index.json", *SMALL, env=env, ok=False)
    assert out.returncode == 1 and f"{server.url}/broken/shard.00001.mds: HTTP 404" in out.stderr
    out = dlbench(f"{server.url}/images/shard.00000.mds", *SMALL, env=env, ok=False)
    assert out.returncode == 1 and "read through its dataset's index.json" in out.stderr


@pytest.mark.skipif(not TESTDATA.is_dir(), reason="the shared test data is not there")
def test_zstd_compressed_shards_over_http(served, tmp_path):
    """Compressed shards (Streaming's compression='zstd') are fetched whole and decompressed at
    open: the same stream as the local compressed copy, read from the temporary copy."""
    root, server, _ = served
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    local = dlbench(str(TESTDATA / "my-copy-arxiv"), "--batch", "16", "--option", "pad=1", env=env)
    remote = dlbench(f"{server.url}/third-party/my-copy-arxiv/", "--batch", "16", "--option", "pad=1", env=env)
    assert remote["samples"] == local["samples"] == 173 and remote["batch_digests"] == local["batch_digests"]
    assert remote["io_backend"] != "http" and len(whole_gets(server.access_log, "my-copy-arxiv/shard.00000.mds.zstd")) == 1
    # With a shard cache, the uncompressed copy is made once and kept there: later opens (other
    # processes) download nothing more, and read the same stream from it.
    zst = "my-copy-arxiv/shard.00000.mds.zstd"
    before = len(whole_gets(server.access_log, zst))
    for _ in range(3):
        cached = dlbench(f"{server.url}/third-party/my-copy-arxiv/", "--batch", "16", "--option", "pad=1", "--option",
                         f"cache_dir={tmp_path / 'shards'}", env=env)
        assert cached["batch_digests"] == local["batch_digests"]
    assert len(whole_gets(server.access_log, zst)) == before + 1
    kept = [p for p in (tmp_path / "shards").iterdir() if p.name.endswith("-shard.00000.mds")]
    assert len(kept) == 1 and kept[0].stat().st_size == 1419310
    assert kept[0].read_bytes() == zstd_d(TESTDATA / "my-copy-arxiv" / "shard.00000.mds.zstd")
    # cache_limit below the copy's size: a temporary copy as before, said at info level.
    small = dlbench(f"{server.url}/third-party/my-copy-arxiv/", "--batch", "16", "--option", "pad=1", "--option",
                    f"cache_dir={tmp_path / 'small'}", "--option", "cache_limit=1M", env=env)
    assert small["batch_digests"] == local["batch_digests"] and not list((tmp_path / "small").glob("*.mds"))
