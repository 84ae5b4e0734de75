"""Shards on the Hugging Face Hub: hf:// URLs and the Hub's own resolve URLs, read with the token
huggingface_hub would use, against a stand-in for the Hub (nginx behind a proxy that answers 401
without the token) and for its file storage on another host, reached by a redirect."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servers import BUILD, DLBENCH, SHARDS, FaultProxy, Nginx, dlbench  # noqa: E402

TAR, RFS = "format-tar-pax.tar", "rfs/packed-{000000..000001}.rfs"
pytestmark = pytest.mark.skipif(not (os.path.exists(DLBENCH) and os.path.exists(os.path.join(SHARDS, TAR))),
                                reason="dlbench or the test shards are not built")
SMALL = ["--batch", "8", "--size", "32", "--crop", "resize", "--workers", "2"]
TOKEN = "hf_test-token-0123"
UNAUTHORIZED = b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n"


class Seen:
    """A proxy check: what came with a token, and (with NEED) a 401 for what came without."""

    def __init__(self, need=None):
        self.need, self.with_token, self.without = need, 0, 0

    def __call__(self, request):
        auth = [ln for ln in request.split(b"\r\n") if ln.lower().startswith(b"authorization:")]
        self.with_token += bool(auth)
        self.without += not auth
        if self.need and auth != [b"Authorization: Bearer " + self.need.encode()]:
            return UNAUTHORIZED
        return None


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A folder laid out as the Hub serves a dataset repository, at two revisions (outside pytest's
    folders, private to their user, which nginx's workers could not read)."""
    work = tmp_path_factory.mktemp("hub")
    root = tempfile.mkdtemp(prefix="ringfeed-hub-")
    os.chmod(root, 0o755)
    for revision in ("main", "v1.0"):
        folder = os.path.join(root, "datasets", "org", "name", "resolve", revision)
        os.makedirs(folder)
        os.symlink(os.path.join(SHARDS, TAR), os.path.join(folder, TAR))
        os.symlink(os.path.join(SHARDS, "rfs"), os.path.join(folder, "rfs"))
    files = Nginx(root, str(work / "files"))
    local = {shard: dlbench(os.path.join(SHARDS, shard), *SMALL) for shard in (TAR, RFS)}
    yield {"work": work, "files": files, "local": local}
    files.stop()
    shutil.rmtree(root)


def hub_env(hub_url, work, token=TOKEN, **more):
    env = {"HF_ENDPOINT": hub_url, "HF_TOKEN": token, "HUGGING_FACE_HUB_TOKEN": "", "HF_TOKEN_PATH": "",
           "HF_HOME": str(work / "no-hf-home"), "XDG_CACHE_HOME": str(work / f"cache-{os.urandom(4).hex()}")}
    env.update(more)
    return env


def run(source, hub_url, work, token=TOKEN, ok=True, **more):
    return dlbench(source, *SMALL, env=hub_env(hub_url, work, token, **more), ok=ok)


def same(remote, local):
    assert remote["batch_digests"] == local["batch_digests"] and remote["errors"] == local["errors"]


def test_hf_urls_and_resolve_urls_read_with_the_token(hub):
    seen = Seen(need=TOKEN)
    proxy = FaultProxy(hub["files"].port, check=seen)
    work, local = hub["work"], hub["local"]
    try:
        same(run(f"hf://datasets/org/name/{TAR}", proxy.url, work), local[TAR])
        same(run(f"hf://datasets/org/name@v1.0/{RFS}", proxy.url, work), local[RFS])
        same(run(f"{proxy.url}/datasets/org/name/resolve/main/{TAR}", proxy.url, work), local[TAR])
        cached = dlbench(f"hf://datasets/org/name@v1.0/{RFS}", *SMALL, "--option", f"cache_dir={work / 'shards'}",
                         env=hub_env(proxy.url, work))
        same(cached, local[RFS])
        assert cached["loader"]["cache_fetches"] > 0
        # The token where huggingface-cli login leaves it, or where HF_TOKEN_PATH says.
        home = work / "hf-home"
        home.mkdir(exist_ok=True)
        (home / "token").write_text(TOKEN + "\n")
        same(run(f"hf://datasets/org/name/{TAR}", proxy.url, work, token="", HF_HOME=str(home)), local[TAR])
        same(run(f"hf://datasets/org/name/{TAR}", proxy.url, work, token="", HF_TOKEN_PATH=str(home / "token")),
             local[TAR])
    finally:
        proxy.stop()
    assert seen.with_token > 5 and seen.without == 0


def test_an_mds_dataset_on_the_hub(hub, tmp_path):
    """An MDS dataset in a dataset repository, read through hf://.../index.json with the token."""
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "testdata", "mds",
                          "naive_MDSdataset")
    if not os.path.isdir(folder):
        pytest.skip("the shared test data is not there")
    target = os.path.join(hub["files"].root, "datasets", "org", "name", "resolve", "main", "mds")
    shutil.copytree(folder, target)
    for dirpath, dirs, files in os.walk(target):
        os.chmod(dirpath, 0o755)
        for name in files:
            os.chmod(os.path.join(dirpath, name), 0o644)
    seen = Seen(need=TOKEN)
    proxy = FaultProxy(hub["files"].port, check=seen)
    try:
        local = dlbench(folder, "--batch", "2")
        remote = dlbench("hf://datasets/org/name/mds/index.json", "--batch", "2", env=hub_env(proxy.url, hub["work"]))
    finally:
        proxy.stop()
    assert remote["samples"] == local["samples"] == 5 and remote["batch_digests"] == local["batch_digests"]
    assert seen.with_token > 0 and seen.without == 0


def test_the_token_goes_to_the_hub_only(hub):
    """Not to another server, nor to the Hub's file storage on another host a redirect names."""
    work = hub["work"]
    storage_seen, other_seen = Seen(), Seen()
    storage = FaultProxy(hub["files"].port, check=storage_seen)
    other = FaultProxy(hub["files"].port, check=other_seen)
    redirector = Nginx(None, str(work / "redirector"), redirect=(302, f"http://localhost:{storage.port}"))
    hub_seen = Seen(need=TOKEN)
    front = FaultProxy(redirector.port, check=hub_seen)
    try:
        same(run(f"hf://datasets/org/name/{TAR}", front.url, work), hub["local"][TAR])
        same(run(f"{other.url}/datasets/org/name/resolve/main/{TAR}", front.url, work), hub["local"][TAR])
    finally:
        for server in (front, redirector, storage, other):
            server.stop()
    assert hub_seen.with_token > 0 and hub_seen.without == 0
    assert storage_seen.without > 0 and storage_seen.with_token == 0
    assert other_seen.without > 0 and other_seen.with_token == 0


def test_a_refused_token_or_none_says_what_to_do(hub):
    proxy = FaultProxy(hub["files"].port, check=Seen(need=TOKEN))
    work = hub["work"]
    source = f"hf://datasets/org/name/{TAR}"
    try:
        none = run(source, proxy.url, work, token="", ok=False)
        wrong = run(source, proxy.url, work, token="hf_wrong-secret", ok=False)
    finally:
        proxy.stop()
    assert none.returncode == 1 and f"{source}: HTTP 401" in none.stderr and "set HF_TOKEN" in none.stderr, \
        none.stderr[-600:]
    assert wrong.returncode == 1 and "the Hub refused the token" in wrong.stderr, wrong.stderr[-600:]
    assert "hf_wrong-secret" not in wrong.stderr + wrong.stdout


@pytest.mark.parametrize("url", ["hf://datasets/org", "hf://datasets/org/name", "hf://datasets/org/",
                                 "hf:///name/x.tar"])
def test_a_malformed_hf_url_is_named(hub, url):
    out = run(url, "http://127.0.0.1:9", hub["work"], ok=False)
    assert out.returncode == 1 and url in out.stderr and "hf://datasets/ORG/NAME" in out.stderr, out.stderr[-600:]


class TreeApi(Seen):
    """The Hub's tree API for the folder of shards: pages of PER entries linked by Link headers,
    entries as the Hub writes them (nested objects, folders, escapes); the rest goes on."""

    def __init__(self, need, per=2, host="127.0.0.1"):
        super().__init__(need)
        self.per, self.asked, self.host = per, [], host

    def __call__(self, request):
        refusal = super().__call__(request)
        target = request.split(b" ")[1].decode()
        if not target.startswith("/api/") or refusal:
            return refusal
        path, _, query = target.partition("?")
        self.asked.append(path)
        folder = path.split("/tree/", 1)[1].partition("/")[2].replace("%2F", "/")
        names = sorted(os.listdir(os.path.join(SHARDS, folder))) if folder else [TAR, "README.md"]
        entries = [{"type": "directory", "oid": "0" * 40, "path": f"{folder}/sub".lstrip("/")},
                   {"type": "file", "oid": "1" * 40, "size": 7, "path": f"{folder}/caf\u00e9 \"q\".txt".lstrip("/")}]
        entries += [{"type": "file", "oid": "2" * 40, "size": 1, "path": f"{folder}/{n}".lstrip("/"),
                     "lfs": {"oid": "sha256:" + "3" * 64, "size": 1, "pointerSize": 134}} for n in names]
        at = int(query.partition("cursor=")[2] or 0)
        body = json.dumps(entries[at:at + self.per], indent=1).encode()
        link = f'Link: <http://{self.host}:{self.port}{path}?cursor={at + self.per}>; rel="next"\r\n' \
            if at + self.per < len(entries) else ""
        return (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{link}Content-Length: {len(body)}\r\n\r\n"
                .encode() + body)


def test_globs_list_the_repository_through_the_tree_api(hub):
    api = TreeApi(need=TOKEN)
    proxy = FaultProxy(hub["files"].port, check=api)
    api.port = proxy.port
    work = hub["work"]
    local = dlbench(os.path.join(SHARDS, "rfs/packed-00000[01].rfs"), *SMALL)
    try:
        listed = run("hf://datasets/org/name@v1.0/rfs/packed-00000[01].rfs", proxy.url, work)
        root = run("hf://datasets/org/name/*.tar", proxy.url, work)
        none = run("hf://datasets/org/name/rfs/*.zip", proxy.url, work, ok=False)
        deep = run("hf://datasets/org/*/rfs/*.rfs", proxy.url, work, ok=False)
        verify = subprocess.run([os.path.join(BUILD, "dlshard"), "verify", "hf://datasets/org/name/rfs/packed-*.rfs"],
                                env={**os.environ, **hub_env(proxy.url, work)}, capture_output=True, text=True)
    finally:
        proxy.stop()
    same(listed, local)
    same(root, hub["local"][TAR])
    assert api.asked.count("/api/datasets/org/name/tree/v1.0/rfs") > 3  # every page of the folder
    assert "/api/datasets/org/name/tree/main" in api.asked and api.without == 0
    assert none.returncode == 1 and "hf://datasets/org/name/rfs/*.zip: no file matches" in none.stderr, none.stderr
    assert deep.returncode == 1 and "wildcards go in the file name only" in deep.stderr, deep.stderr
    # A next page on another host is not asked for: the token would go with the request.
    astray = TreeApi(need=TOKEN, host="localhost")
    proxy = FaultProxy(hub["files"].port, check=astray)
    astray.port = proxy.port
    try:
        out = run("hf://datasets/org/name/rfs/*.rfs", proxy.url, work, ok=False)
    finally:
        proxy.stop()
    assert out.returncode == 1 and "next page is on another host" in out.stderr and len(astray.asked) == 1
    # dlshard lists the same way: the same records found bad as in the local copies
    mine = subprocess.run([os.path.join(BUILD, "dlshard"), "verify", os.path.join(SHARDS, "rfs/packed-*.rfs")],
                          capture_output=True, text=True)
    said = lambda out: (out.stdout + out.stderr).strip().splitlines()[-2:]  # noqa: E731
    assert verify.returncode == mine.returncode and said(verify) == said(mine), verify.stderr[-600:]


class LoopingTreeApi(TreeApi):
    """The tree API with a fault: each page's Link names the page itself as the next one."""

    def __call__(self, request):
        answer = super().__call__(request)
        target = request.split(b" ")[1].decode()
        if not target.startswith("/api/") or not answer:
            return answer
        head, _, body = answer.partition(b"\r\n\r\n")
        head = b"\r\n".join(ln for ln in head.split(b"\r\n") if not ln.startswith(b"Link:"))
        link = f'Link: <http://127.0.0.1:{self.port}{target}>; rel="next"'.encode()
        return head + b"\r\n" + link + b"\r\n\r\n" + body


def test_a_listing_that_links_to_itself_is_refused(hub):
    api = LoopingTreeApi(need=TOKEN)
    proxy = FaultProxy(hub["files"].port, check=api)
    api.port = proxy.port
    try:
        out = run("hf://datasets/org/name/rfs/*.rfs", proxy.url, hub["work"], ok=False)
    finally:
        proxy.stop()
    assert out.returncode == 1 and "page 1 links to itself as the next page" in out.stderr, out.stderr
    assert len(api.asked) == 1
