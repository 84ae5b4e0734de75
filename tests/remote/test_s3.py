"""Shards on an S3-compatible server (s3rver), every request's SigV4 signature checked by AWS's own
signer (botocore) in a proxy in front of it: the same stream as local disk, globs through
ListObjectsV2, credentials from the variables and from profile files, and S3's own errors."""
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servers import BUILD, DLBENCH, SHARDS, FaultProxy, S3rver, dlbench, free_port, sigv4_checker  # noqa: E402
OBJECTS = ["sweep-gnu.tar", "format-tar-gnu.tar", "rfs/packed-000000.rfs", "rfs/packed-000001.rfs"]
KEY, SECRET, REGION = "S3RVER", "S3RVER", "eu-test-1"
SMALL = ["--batch", "8", "--size", "32", "--crop", "resize"]


def _ready():
    try:
        import botocore  # noqa: F401
    except ImportError:
        return False
    return os.path.exists(DLBENCH) and os.path.exists(os.path.join(SHARDS, OBJECTS[0]))


pytestmark = pytest.mark.skipif(not _ready(), reason="dlbench, the test shards or botocore are missing")


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    work = tmp_path_factory.mktemp("s3")
    try:
        server = S3rver(str(work / "data"), "shards")
    except RuntimeError as e:
        pytest.skip(str(e))
    import botocore.session
    client = botocore.session.get_session().create_client(
        "s3", endpoint_url=server.url, aws_access_key_id=KEY, aws_secret_access_key=SECRET, region_name=REGION)
    for name in OBJECTS:
        with open(os.path.join(SHARDS, name), "rb") as f:
            client.put_object(Bucket="shards", Key=name, Body=f.read())
    seen = {"checked": 0, "refused": 0}
    proxy = FaultProxy(server.port, check=sigv4_checker(KEY, SECRET, REGION, seen))
    env = {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": REGION,
           "AWS_ENDPOINT_URL": proxy.url, "XDG_CACHE_HOME": str(work / "cache"), "AWS_PROFILE": "",
           "AWS_SHARED_CREDENTIALS_FILE": str(work / "none"), "AWS_CONFIG_FILE": str(work / "none")}
    yield {"env": env, "seen": seen, "work": work, "port": server.port}
    proxy.stop()
    server.stop()


def bench(source, env, *args, ok=True):
    return dlbench(source, *SMALL, *args, env=env, ok=ok, aws_env=False)


def put_copies(env, keys, shard="format-tar-gnu.tar"):
    """Puts the test shard SHARD under each of KEYS in the bucket, through the endpoint ENV names."""
    import botocore.session
    client = botocore.session.get_session().create_client(
        "s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id=KEY, aws_secret_access_key=SECRET,
        region_name=REGION)
    with open(os.path.join(SHARDS, shard), "rb") as f:
        data = f.read()
    for key in keys:
        client.put_object(Bucket="shards", Key=key, Body=data)


@pytest.mark.parametrize("shard,workers", [("sweep-gnu.tar", 1), ("rfs/packed-{000000..000001}.rfs", 1),
                                           ("rfs/packed-{000000..000001}.rfs", 8)])
def test_s3_stream_equals_local_and_every_signature_checks(s3, shard, workers):
    before = dict(s3["seen"])
    local = bench(os.path.join(SHARDS, shard), {}, "--workers", str(workers))
    remote = bench(f"s3://shards/{shard}", s3["env"], "--workers", str(workers))
    assert remote["batch_digests"] == local["batch_digests"] and remote["errors"] == local["errors"]
    assert s3["seen"]["checked"] - before["checked"] >= remote["loader"]["requests"]
    assert s3["seen"]["refused"] == before["refused"]
    # Every request after an object's probe asks for the version probed (a shard replaced meanwhile
    # is refused): only the probes do not.
    asked = s3["seen"].get("if_match", 0) - before.get("if_match", 0)
    unasked = s3["seen"].get("no_if_match", 0) - before.get("no_if_match", 0)
    assert asked > 0 and unasked == (2 if "{" in shard else 1), (asked, unasked)


def test_whole_shards_into_the_cache_and_block_shuffle(s3, tmp_path):
    before = dict(s3["seen"])
    opts = ["--workers", "4", "--option", "shuffle_block=1", "--epochs", "2"]
    local = bench(os.path.join(SHARDS, "rfs/packed-{000000..000001}.rfs"), {}, *opts)
    cache = ["--option", f"cache_dir={tmp_path}"]
    cold = bench("s3://shards/rfs/packed-{000000..000001}.rfs", s3["env"], *opts, *cache)
    warm = bench("s3://shards/rfs/packed-{000000..000001}.rfs", s3["env"], *opts, *cache)
    assert cold["batch_digests"] == local["batch_digests"] == warm["batch_digests"]
    assert cold["loader"]["cache_fetches"] == 2 and warm["loader"]["requests"] == 0
    assert s3["seen"]["refused"] == before["refused"] and s3["seen"]["checked"] > before["checked"]


def test_a_gzipped_tar_in_a_bucket_is_the_local_stream(s3, tmp_path):
    """A .tar.gz key is downloaded whole (signed, of the version probed) and read from its
    uncompressed copy: the plain tar's batches."""
    import gzip
    import botocore.session
    client = botocore.session.get_session().create_client(
        "s3", endpoint_url=f"http://127.0.0.1:{s3['port']}", aws_access_key_id=KEY, aws_secret_access_key=SECRET,
        region_name=REGION)
    with open(os.path.join(SHARDS, "sweep-gnu.tar"), "rb") as f:
        client.put_object(Bucket="shards", Key="packed/sweep.tar.gz", Body=gzip.compress(f.read()))
    before = dict(s3["seen"])
    local = bench(os.path.join(SHARDS, "sweep-gnu.tar"), {})
    remote = bench("s3://shards/packed/sweep.tar.gz", dict(s3["env"], XDG_CACHE_HOME=str(tmp_path)))
    assert remote["batch_digests"] == local["batch_digests"] and remote["loader"]["requests"] == 0
    assert s3["seen"]["refused"] == before["refused"] and s3["seen"]["checked"] - before["checked"] == 2
    # The download asks for the version probed.
    assert s3["seen"].get("if_match", 0) - before.get("if_match", 0) == 1


def dlshard(*args, env, ok=True):
    e = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    e.update(env)
    out = subprocess.run([os.path.join(BUILD, "dlshard"), *args], capture_output=True, text=True, timeout=300, env=e)
    assert out.returncode == 0 or not ok, out.stdout[-2000:] + out.stderr[-2000:]
    return out


def test_dlshard_uploads_what_it_makes_and_reads_remote_shards(s3, tmp_path):
    before = dict(s3["seen"])
    made = dlshard("create", "s3://shards/made/syn", os.path.join(SHARDS, "sweep-gnu.tar"), "--samples-per-shard",
                   "150", env=s3["env"])
    assert "s3://shards/made/syn-000000.rfs" in made.stdout
    local = dlshard("create", str(tmp_path / "syn"), os.path.join(SHARDS, "sweep-gnu.tar"), "--samples-per-shard",
                    "150", env={})
    count = len(list(tmp_path.glob("syn-*.rfs")))
    assert s3["seen"].get("uploads", 0) - before.get("uploads", 0) == count > 1
    assert s3["seen"]["refused"] == before["refused"]
    # The same shards as made locally: the loader streams the same, verify finds the same.
    remote = bench("s3://shards/made/syn-*.rfs", s3["env"])
    assert remote["batch_digests"] == bench(str(tmp_path / "syn-*.rfs"), {})["batch_digests"]
    v_remote = dlshard("verify", "s3://shards/made/syn-*.rfs", env=s3["env"], ok=False)
    v_local = dlshard("verify", str(tmp_path / "syn-*.rfs"), env={}, ok=False)
    assert v_remote.returncode == v_local.returncode
    assert v_remote.stdout.splitlines()[-2:] == v_local.stdout.splitlines()[-2:]
    listed = dlshard("ls", "s3://shards/made/syn-000000.rfs", env=s3["env"])
    same = dlshard("ls", str(tmp_path / "syn-000000.rfs"), env={})
    assert listed.stdout.split(".rfs:", 1)[1] == same.stdout.split(".rfs:", 1)[1]
    missing = dlshard("ls", "s3://shards/made/none.rfs", env=s3["env"], ok=False)
    assert missing.returncode == 1 and "NoSuchKey" in missing.stderr
    indexed = dlshard("index", "s3://shards/*.tar", env=dict(s3["env"], XDG_CACHE_HOME=str(tmp_path)))
    assert indexed.stdout.splitlines() == ["s3://shards/format-tar-gnu.tar: 2 samples indexed",
                                           "s3://shards/sweep-gnu.tar: 1319 samples indexed"], indexed.stdout


def test_an_mds_dataset_in_a_bucket_is_the_local_stream(s3, tmp_path):
    """An MDS dataset whose merged index lists shards in subfolders, read through s3://.../index.json
    with every request signed."""
    import botocore.session
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "testdata", "mds",
                          "naive_MDSdataset")
    if not os.path.isdir(folder):
        pytest.skip("the shared test data is not there")
    before = dict(s3["seen"])
    client = botocore.session.get_session().create_client(
        "s3", endpoint_url=f"http://127.0.0.1:{s3['port']}", aws_access_key_id=KEY, aws_secret_access_key=SECRET,
        region_name=REGION)
    for dirpath, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                client.put_object(Bucket="shards", Key="mds/" + os.path.relpath(path, folder), Body=f.read())
    local = bench(folder, {}, "--batch", "2")
    env = dict(s3["env"], XDG_CACHE_HOME=str(tmp_path))
    for source in ("s3://shards/mds/index.json", "s3://shards/mds/"):
        remote = bench(source, env, "--batch", "2")
        assert remote["samples"] == local["samples"] == 5 and remote["batch_digests"] == local["batch_digests"]
    assert s3["seen"]["refused"] == before["refused"] and s3["seen"]["checked"] > before["checked"]
    # A folder without index.json is no MDS dataset: what to give instead.
    out = bench("s3://shards/rfs/", env, ok=False)
    assert out.returncode == 1 and "s3://shards/rfs/index.json: HTTP 404" in out.stderr
    assert "s3://shards/rfs/*.tar" in out.stderr


def test_virtual_hosted_addressing(s3):
    before = dict(s3["seen"])
    local = bench(os.path.join(SHARDS, "format-tar-gnu.tar"), {})
    env = dict(s3["env"])
    hosts = []

    def note_host(request):  # the Host each request names: the bucket's, not a path
        head = request.partition(b"\r\n\r\n")[0].decode("latin-1").lower()
        hosts.append(head.split("\r\nhost: ", 1)[1].split("\r\n", 1)[0].split(":")[0])
        return None

    port = int(env["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
    proxy = FaultProxy(port, check=note_host)
    try:
        env["AWS_ENDPOINT_URL"] = proxy.url.replace("127.0.0.1", "s3.localhost")  # *.localhost is loopback
        virtual = bench("s3://shards/format-tar-gnu.tar", env, "--option", "s3_addressing=virtual",
                        "--option", "retries=0")
    finally:
        proxy.stop()
    assert virtual["batch_digests"] == local["batch_digests"]
    assert hosts and set(hosts) == {"shards.s3.localhost"}, hosts
    assert s3["seen"]["refused"] == before["refused"]


def test_keys_with_spaces_and_signs_are_signed_as_s3_expects(s3):
    # SigV4 signs the key's URI-encoded path: each byte but A-Z a-z 0-9 - . _ ~ (and "/") as %XX, a
    # space as %20 and "+" as %2B. Every request here passes AWS's own signer in the proxy.
    env = s3["env"]
    local = bench(os.path.join(SHARDS, "format-tar-gnu.tar"), {})
    before = dict(s3["seen"])
    keys = ["odd keys/a b+c.tar", "odd keys/x=y&z;w.tar", "odd keys/t~é,(1)!.tar"]
    put_copies(env, keys)
    for key in keys:
        got = bench(f"s3://shards/{key}", env)
        assert got["batch_digests"] == local["batch_digests"], key
    listed = bench("s3://shards/odd keys/*.tar", env)
    assert listed["samples"] == 3 * local["samples"]
    assert s3["seen"]["refused"] == before["refused"] and s3["seen"]["checked"] > before["checked"]


def test_a_glob_lists_the_bucket(s3):
    listed = bench("s3://shards/rfs/packed-*.rfs", s3["env"])
    braced = bench("s3://shards/rfs/packed-{000000..000001}.rfs", s3["env"])
    assert listed["batch_digests"] == braced["batch_digests"]
    out = bench("s3://shards/rfs/nothing-*.rfs", s3["env"], ok=False)
    assert out.returncode == 1 and "no object matches" in out.stderr


def test_a_glob_follows_every_page_of_the_listing(s3, tmp_path):
    # Listings come 1,000 keys a page; a proxy asks s3rver for pages of 2, so that a glob over 10
    # keys follows four continuation tokens. Unsigned (a public bucket): the proxy changes the query.
    env = s3["env"]
    # "&" comes back as "&amp;" in the listing's XML
    put_copies(env, [f"pages/{p}-{i}.tar" for p in "ab" for i in range(4)] + ["pages/x&y.tar", "pages/z.txt"])
    lists = []

    def small_pages(request):
        line, _, rest = request.partition(b"\r\n")
        if b"list-type=2" in line:
            lists.append(line)
            line = line.replace(b"list-type=2", b"list-type=2&max-keys=2")
        return line + b"\r\n" + rest
    proxy = FaultProxy(s3["port"], rewrite=small_pages)
    public = {k: v for k, v in env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    public["AWS_ENDPOINT_URL"] = proxy.url
    try:
        listed = bench("s3://shards/pages/*.tar", public)
    finally:
        proxy.stop()
    one = bench("s3://shards/pages/a-0.tar", env)
    assert len(lists) == 5 and b"continuation-token=" in lists[-1]
    assert listed["samples"] == 9 * one["samples"] and listed["errors"] == 9 * one["errors"]


def test_a_listing_that_never_ends_is_refused(s3):
    # A server whose every page is "truncated" with the same continuation token would be listed for
    # ever: the second page with the token of the first ends it, naming the listing.
    lists = []

    def endless(request):
        line = request.partition(b"\r\n")[0]
        if b"list-type=2" not in line:
            return None
        lists.append(line)
        body = (b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>shards</Name>'
                b"<Contents><Key>rfs/packed-000000.rfs</Key></Contents><IsTruncated>true</IsTruncated>"
                b"<NextContinuationToken>again&amp;again</NextContinuationToken></ListBucketResult>")
        return b"HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    proxy = FaultProxy(s3["port"], check=endless)
    try:
        out = bench("s3://shards/rfs/packed-*.rfs", {**s3["env"], "AWS_ENDPOINT_URL": proxy.url}, ok=False)
    finally:
        proxy.stop()
    assert out.returncode == 1, out.stderr
    assert "listing s3://shards/rfs/packed-*.rfs: page 2 gives the same continuation token" in out.stderr, out.stderr
    assert len(lists) == 2 and b"continuation-token=again%26again" in lists[-1], lists


def test_credentials_and_region_from_profile_files(s3):
    work = s3["work"]
    (work / "credentials").write_text(f"[default]\naws_access_key_id = nobody\naws_secret_access_key = x\n\n"
                                      f"[train]\naws_access_key_id = {KEY}\naws_secret_access_key = {SECRET}\n")
    (work / "config").write_text(f"[profile train]\nregion = {REGION}\n")
    env = {k: v for k, v in s3["env"].items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")}
    env.update(AWS_PROFILE="train", AWS_SHARED_CREDENTIALS_FILE=str(work / "credentials"),
               AWS_CONFIG_FILE=str(work / "config"))
    assert bench("s3://shards/format-tar-gnu.tar", env)["samples"] == 2
    env["AWS_PROFILE"] = "missing"
    out = bench("s3://shards/format-tar-gnu.tar", env, ok=False)
    assert "AWS_PROFILE=missing" in out.stderr


def test_a_session_token_is_sent_and_signed(s3):
    signing_port = int(s3["env"]["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
    signed = []

    def check(request):  # in front of the signing proxy, which checks the signature itself
        head = request.partition(b"\r\n\r\n")[0].decode("latin-1").lower()
        signed.append("x-amz-security-token: session-123" in head and "x-amz-security-token" in
                      head.split("signedheaders=")[1].split(",")[0])
        return None

    before = dict(s3["seen"])
    proxy = FaultProxy(signing_port, check=check)
    try:
        env = dict(s3["env"], AWS_SESSION_TOKEN="session-123", AWS_ENDPOINT_URL=proxy.url)
        assert bench("s3://shards/format-tar-gnu.tar", env)["samples"] == 2
    finally:
        proxy.stop()
    assert signed and all(signed) and s3["seen"]["refused"] == before["refused"]


def test_clear_errors_without_secrets(s3):
    out = bench("s3://shards/sweep-gnu.tar", dict(s3["env"], AWS_SECRET_ACCESS_KEY="wrong-secret"), "--option",
                "retries=0", ok=False)
    assert "EACCES" in out.stderr and "s3://shards/sweep-gnu.tar: HTTP 403 (SignatureDoesNotMatch)" in out.stderr
    assert "wrong-secret" not in out.stderr and SECRET not in out.stderr.replace("S3RVER", "")
    out = bench("s3://no-such-bucket/x.tar", s3["env"], ok=False)
    assert "HTTP 404 (NoSuchBucket)" in out.stderr
    out = bench("s3://shards/no-such-key.tar", s3["env"], ok=False)
    assert "ENOENT" in out.stderr and "HTTP 404 (NoSuchKey)" in out.stderr
    env = dict(s3["env"], AWS_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}")
    out = bench("s3://shards/sweep-gnu.tar", env, "--option", "retries=1", "--option", "timeout_ms=500", ok=False)
    assert "DL_EREMOTE" in out.stderr and "s3://shards/sweep-gnu.tar" in out.stderr
