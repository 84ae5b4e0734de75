"""Shards over HTTP and HTTPS, from nginx and through a fault-injecting proxy: the same stream as
from local disk, a cached index, resume across local and remote copies, clear errors, retries, and
a close that does not wait for a stalled server."""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servers import (BUILD, DLBENCH, SHARDS, FaultProxy, Nginx, dlbench, free_port, make_ca,  # noqa: E402
                     seconds_to_close)

TAR, RFS = "sweep-gnu.tar", "rfs/packed-{000000..000006}.rfs"
pytestmark = pytest.mark.skipif(not (os.path.exists(DLBENCH) and os.path.exists(os.path.join(SHARDS, TAR))),
                                reason="dlbench or the test shards are not built")
SMALL = ["--batch", "8", "--size", "32", "--crop", "resize"]


def bench(source, *args, env=None, ok=True):
    return dlbench(source, *SMALL, *args, env=env, ok=ok)


def serve_one_object(data, answer, etag=None):
    """A server of DATA on 127.0.0.1: each GET goes first to ANSWER(handler), which may answer it
    and return True; else it gets DATA, or the byte range it asks for, with ETAG if given."""
    import http.server
    import re
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            if answer(self):
                return
            m = re.match(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            first = int(m.group(1)) if m else 0
            last = min(int(m.group(2)) if m and m.group(2) else len(data) - 1, len(data) - 1)
            self.send_response(206 if m else 200)
            if etag:
                self.send_header("ETag", etag)
            self.send_header("Content-Length", str(last - first + 1))
            if m:
                self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
            self.end_headers()
            self.wfile.write(data[first:last + 1])

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    work = tmp_path_factory.mktemp("http")
    ca, cert, key = make_ca(str(work / "ca"))
    http = Nginx(SHARDS, str(work / "http"))
    https = Nginx(SHARDS, str(work / "https"), cert, key)
    cache = str(work / "cache")
    yield {"http": http, "https": https, "ca": ca, "env": {"XDG_CACHE_HOME": cache}}
    http.stop()
    https.stop()


@pytest.mark.parametrize("shard", [TAR, RFS])
@pytest.mark.parametrize("scheme", ["http", "https"])
@pytest.mark.parametrize("workers", [1, 8])
def test_remote_stream_equals_local(servers, shard, scheme, workers):
    local = bench(os.path.join(SHARDS, shard), "--workers", str(workers))
    remote = bench(f"{servers[scheme].url}/{shard}", "--workers", str(workers), "--option",
                   f"ca_file={servers['ca']}", env=servers["env"])
    assert remote["digest"] == local["digest"] and remote["batch_digests"] == local["batch_digests"]
    assert remote["errors"] == local["errors"] and remote["samples"] == local["samples"]
    assert remote["io_backend"] == "http" and remote["loader"]["requests"] > 0


@pytest.mark.parametrize("shard", [TAR, RFS])
def test_neighbouring_samples_share_a_request(servers, shard):
    opts = ["--workers", "2", "--option", "shuffle=0"]
    local = bench(os.path.join(SHARDS, shard), *opts)
    remote = bench(f"{servers['http'].url}/{shard}", *opts, env=servers["env"])
    assert remote["batch_digests"] == local["batch_digests"] and remote["errors"] == local["errors"]
    assert remote["loader"]["requests"] * 4 < remote["samples"], remote["loader"]["requests"]
    shuffled = bench(f"{servers['http'].url}/{shard}", "--workers", "2", env=servers["env"])
    assert shuffled["loader"]["requests"] > remote["loader"]["requests"]


def test_dlshard_reads_shards_over_http(servers):
    def dlshard(*args):
        return subprocess.run([os.path.join(BUILD, "dlshard"), *args], capture_output=True, text=True, timeout=300)
    url = servers["http"].url
    for shard in (TAR, "rfs/packed-{000000..000001}.rfs"):
        remote, local = dlshard("verify", f"{url}/{shard}"), dlshard("verify", os.path.join(SHARDS, shard))
        assert remote.returncode == local.returncode and remote.stdout.splitlines()[-2:] == local.stdout.splitlines()[-2:]
    listed = dlshard("ls", f"{url}/format-tar-gnu.tar")
    assert listed.returncode == 0 and "tar, 2 samples" in listed.stdout
    listed = dlshard("ls", f"{url}/rfs/packed-000002.rfs")
    assert listed.returncode == 0 and "ringfeed shard" in listed.stdout
    refused = dlshard("verify", f"{url}/rfs/packed-*.rfs")
    assert refused.returncode == 1 and "cannot be listed" in refused.stderr
    refused = dlshard("create", f"{url}/out", os.path.join(SHARDS, TAR))
    assert refused.returncode == 2 and "s3://" in refused.stderr


def requests_for(log, name):
    with open(log) as f:
        return [line for line in f if f"/{name} " in line]


def test_a_tar_index_is_built_once_then_cached(servers, tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "fresh-cache")}
    log = servers["http"].access_log
    before = len(requests_for(log, "format-tar-gnu.tar"))
    bench(f"{servers['http'].url}/format-tar-gnu.tar", env=env)
    first = requests_for(log, "format-tar-gnu.tar")[before:]
    bench(f"{servers['http'].url}/format-tar-gnu.tar", env=env)
    second = requests_for(log, "format-tar-gnu.tar")[before + len(first):]
    whole = [line for line in first if "range=-" in line or line.rstrip().endswith("range=")]
    assert len(whole) == 1, first  # one download builds the index
    assert not [line for line in second if line.rstrip().endswith("range=")], second  # the cache serves it


def test_a_token_saved_on_local_shards_resumes_on_the_remote_copy(servers):
    local_head = bench(os.path.join(SHARDS, TAR), "--stop-after", "40")
    token = local_head["state"]
    local_rest = bench(os.path.join(SHARDS, TAR), "--resume", token)
    remote_rest = bench(f"{servers['http'].url}/{TAR}", "--resume", token, env=servers["env"])
    assert remote_rest["batch_digests"] == local_rest["batch_digests"]


def test_clear_errors(servers, tmp_path):
    url = servers["http"].url
    out = bench(f"{url}/no-such-shard.tar", ok=False)
    assert out.returncode == 1 and "ENOENT" in out.stderr and f"{url}/no-such-shard.tar: HTTP 404" in out.stderr
    port = free_port()
    out = bench(f"http://127.0.0.1:{port}/x.tar", "--option", "retries=1", "--option", "timeout_ms=500", ok=False)
    assert "DL_EREMOTE" in out.stderr and f"127.0.0.1:{port}/x.tar" in out.stderr and "connect" in out.stderr.lower()
    out = bench(f"{servers['https'].url}/{TAR}", "--option", "retries=0", ok=False)  # a CA this host does not know
    assert "DL_EREMOTE" in out.stderr and "certificate" in out.stderr.lower()
    # Remote and local shards in one source: refused, whatever the order (a remote shard first, then
    # a local one, freed memory it never had: an abort).
    local, remote = os.path.join(SHARDS, "format-tar-gnu.tar"), f"{url}/format-tar-pax.tar"
    for source in (f"{local}::{remote}", f"{remote}::{local}", f"{local}::{remote}::{local}::{remote}"):
        out = bench(source, ok=False, env=servers["env"])
        assert out.returncode == 1 and "remote and local shards in one loader" in out.stderr, out.stderr[-600:]
    secret = url.replace("http://", "http://alice:s3cret-pw@")
    out = bench(f"{secret}/no-such-shard.tar", ok=False)
    assert out.returncode == 1 and "s3cret-pw" not in out.stderr and "alice" not in out.stderr


@pytest.mark.parametrize("code", [302, 307])
def test_a_shard_behind_a_redirect_reads_as_the_shard(servers, code, tmp_path):
    local = bench(os.path.join(SHARDS, TAR), "--workers", "2")
    hop = Nginx(None, str(tmp_path / "hop"), redirect=(code, servers["http"].url))
    loop = Nginx(None, str(tmp_path / "loop"), redirect=(302, None))
    try:
        remote = bench(f"{hop.url}/{TAR}", "--workers", "2", env={"XDG_CACHE_HOME": str(tmp_path)})
        out = bench(f"{loop.url}/{TAR}", "--option", "retries=0", ok=False)
        redirected = requests_for(hop.access_log, TAR)
    finally:
        hop.stop()
        loop.stop()
    assert remote["batch_digests"] == local["batch_digests"] and remote["errors"] == local["errors"]
    assert len(redirected) >= remote["loader"]["requests"] > 0 and all(f" {code} " in r for r in redirected)
    assert out.returncode == 1 and f"{loop.url}/{TAR}" in out.stderr and "redirect" in out.stderr.lower(), out.stderr


def test_ipv6_hosts_lists_and_presigned_queries(tmp_path):
    """"::" joins sources, and "[" starts a pattern: an IPv6 host (http://[::1]:8080/) was cut in
    two and refused as a listing. A query string (a presigned link's) stays the server's."""
    import socket
    try:
        socket.socket(socket.AF_INET6).bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback")
    server = Nginx(SHARDS, str(tmp_path / "six"), ipv6=True)
    try:
        six = server.url.replace("127.0.0.1", "[::1]")
        parts = "rfs/packed-{000000..000001}.rfs"
        local = bench(os.path.join(SHARDS, parts) + "::" + os.path.join(SHARDS, TAR))
        remote = bench(f"{six}/{parts}::{six}/{TAR}?X-Amz-Expires=3600&X-Amz-Signature=ab%2Fc",
                       env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    finally:
        server.stop()
    assert remote["batch_digests"] == local["batch_digests"] and remote["errors"] == local["errors"]


def test_a_proxy_answering_another_range_is_refused(servers, tmp_path):
    """A cache or proxy that answers 206 with other bytes than asked (here 512 further on) gave
    them as the asked ones: for a tar shard, images that failed to decode, or wrong pixels."""
    import re

    def shifted(request):
        def later(m):
            first, last = int(m.group(1)), int(m.group(2))
            return b"bytes=%d-%d" % (first + 512, last + 512) if first > 0 else m.group(0)
        return re.sub(rb"bytes=(\d+)-(\d+)", later, request)

    env = {"XDG_CACHE_HOME": str(tmp_path)}
    bench(f"{servers['http'].url}/{TAR}", env=env)  # the index, cached: what follows reads samples only
    proxy = FaultProxy(servers["http"].port, rewrite=shifted)
    try:
        out = bench(f"{proxy.url}/{TAR}", "--option", "retries=0", env=env, ok=False)
    finally:
        proxy.stop()
    assert out.returncode == 1 and f"{proxy.url}/{TAR}: HTTP 206 with the bytes from" in out.stderr, out.stderr[-600:]


def test_an_etag_too_long_to_keep_is_not_asked_for(tmp_path):
    """An ETag longer than the loader keeps went out cut short in If-Match: a server that checks it
    (as S3 and nginx do) answered 412 to every read, "it changed on the server"."""
    shard = "format-tar-pax.tar"
    with open(os.path.join(SHARDS, shard), "rb") as f:
        data = f.read()
    etag = '"' + "0123456789abcdef" * 12 + '"'
    seen = {"if_match": 0, "refused": 0}

    def check_version(handler):
        asked = handler.headers.get("If-Match")
        seen["if_match"] += asked is not None
        if asked is None or asked == etag:
            return False
        seen["refused"] += 1
        handler.send_response(412)
        handler.send_header("Content-Length", "0")
        handler.end_headers()
        return True
    server = serve_one_object(data, check_version, etag)
    try:
        local = bench(os.path.join(SHARDS, shard))
        remote = bench(f"http://127.0.0.1:{server.server_address[1]}/{shard}",
                       env={"XDG_CACHE_HOME": str(tmp_path)})
    finally:
        server.shutdown()
    assert remote["batch_digests"] == local["batch_digests"] and remote["errors"] == local["errors"]
    assert seen["refused"] == 0


def test_a_body_longer_than_the_object_is_cut_off(tmp_path):
    """A tar is downloaded whole to be indexed. A server whose answer runs on past the size it gave
    (here the shard, then zeros without end) had every byte written to the scratch file until the
    disk was full; the download now stops at the object's size, is retried as a short one is, and
    then fails naming what came."""
    shard = "format-tar-pax.tar"
    with open(os.path.join(SHARDS, shard), "rb") as f:
        data = f.read()
    sent = {"extra": 0, "whole": 0}

    def whole_and_more(handler):
        if "Range" in handler.headers:
            return False  # the probe: as asked
        handler.send_response(200)  # the whole object, and then more
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        sent["whole"] += 1
        try:
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            zeros = bytes(1 << 20)
            for _ in range(256):
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(zeros), zeros))
                sent["extra"] += len(zeros)
            handler.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        return True
    server = serve_one_object(data, whole_and_more)
    url = f"http://127.0.0.1:{server.server_address[1]}/{shard}"
    try:
        out = bench(url, "--option", "retries=2", env={"XDG_CACHE_HOME": str(tmp_path)}, ok=False)
    finally:
        server.shutdown()
    assert out.returncode == 1, out.stderr
    assert f"{url}: more than the {len(data)} bytes expected came (HTTP 200) (after retries)" in out.stderr, out.stderr
    assert sent["whole"] == 3 and sent["extra"] < 64 << 20  # each time the client hung up, not the server


def test_a_server_that_ignores_ranges_is_named_at_once_without_credentials(servers):
    """python -m http.server and some others answer a Range request with the whole object (200):
    the loader reads samples by range, so it says so, at once and in plain words, and neither that
    message nor the warnings of damaged samples carry a password given in the URL."""
    shard = TAR  # larger than the probe's first bytes
    with open(os.path.join(SHARDS, shard), "rb") as f:
        data = f.read()
    asked = []

    def whole(handler):
        asked.append(handler.headers.get("Range"))
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
        return True
    server = serve_one_object(data, whole)
    url = f"http://alice:s3cret-pw@127.0.0.1:{server.server_address[1]}/{shard}"
    try:
        out = bench(url, ok=False)
        probed = list(asked)
        # Shards smaller than the probe's first bytes come whole then: their samples fail one by
        # one, and the run stops as for a server that is down rather than deliver zeros.
        with open(os.path.join(SHARDS, "format-tar-pax.tar"), "rb") as f:
            data = f.read()
        small = bench(url.replace(shard, "small-{1..40}.tar"), ok=False)
    finally:
        server.shutdown()
    assert out.returncode == 1 and "the server does not serve byte ranges" in out.stderr, out.stderr
    assert f"127.0.0.1:{server.server_address[1]}/{shard}" in out.stderr and "after retries" not in out.stderr
    assert probed == ["bytes=0-65535"] and "s3cret-pw" not in out.stderr and "alice" not in out.stderr
    assert small.returncode == 1 and "does not serve byte ranges" in small.stderr, small.stderr[-800:]
    assert "the server is down" in small.stderr and "s3cret-pw" not in small.stderr
    # Per-sample warnings name the shard as well: sweep-gnu.tar holds damaged samples.
    secret = servers["http"].url.replace("http://", "http://alice:s3cret-pw@")
    warned = subprocess.run([DLBENCH, f"{secret}/{TAR}", *SMALL], capture_output=True, text=True,
                            env=dict(os.environ, DL_LOG_LEVEL="2", **servers["env"]), timeout=300)
    assert warned.returncode == 0 and f"{servers['http'].url}/{TAR} member" in warned.stderr, warned.stderr[-800:]
    assert "s3cret-pw" not in warned.stderr and "alice" not in warned.stderr


@pytest.mark.binding
def test_the_binding_keeps_a_password_in_a_url_out_of_repr_and_errors(servers):
    if not os.environ.get("RINGFEED_LIBRARY"):
        pytest.skip("the Python binding needs RINGFEED_LIBRARY")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings", "python"))
    import ringfeed
    secret = servers["http"].url.replace("http://", "http://alice:s3cret-pw@")
    loader = ringfeed.Loader(f"{secret}/format-tar-ustar.tar", batch_size=1, image_size=8, framework="dlpack")
    shown = repr(loader)
    loader.close()
    assert f"{servers['http'].url}/format-tar-ustar.tar" in shown and "s3cret-pw" not in shown, shown
    with pytest.raises(ringfeed.Error) as e:
        ringfeed.Loader(f"{secret}/none.tar", retries=0)
    assert "HTTP 404" in str(e.value) and "s3cret-pw" not in str(e.value) and "alice" not in str(e.value)


@pytest.mark.binding
def test_a_remote_ringfeed_shard_gives_its_class_names(tmp_path):
    """The class table lies before the index: read with it, also where the two pass the 256 KiB
    that one ranged read of a shard's end takes."""
    if not os.environ.get("RINGFEED_LIBRARY"):
        pytest.skip("the Python binding needs RINGFEED_LIBRARY")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings", "python"))
    import ringfeed
    for count in (3, 40000):  # 3 names, and 40,000 of 13 bytes: a table of 520 KB
        names = [f"class-{c:05d}" for c in range(count)]
        path = tmp_path / f"named-{count}.rfs"
        with ringfeed.Writer(str(path), classes=names) as w:
            for i in range(5):
                w.add(str(i), label=i % count)
        server = serve_one_object(path.read_bytes(), lambda handler: False)
        url = f"http://127.0.0.1:{server.server_address[1]}/{path.name}"
        try:
            with ringfeed.Loader(url, batch_size=5, framework="dlpack") as loader:
                assert loader.classes == names
            listed = subprocess.run([os.path.join(BUILD, "dlshard"), "ls", url], capture_output=True, text=True,
                                    timeout=60)
        finally:
            server.shutdown()
        shown = " ".join(names) if count <= 4 else f"{names[0]} {names[1]} {names[2]} ... {names[-1]}"
        assert listed.returncode == 0 and f"  classes {count}: {shown}\n" in listed.stdout, listed.stdout


def test_dlshard_index_caches_a_remote_tar_index_for_the_loader(servers, tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "fresh-cache"))
    log, url = servers["http"].access_log, f"{servers['http'].url}/format-tar-ustar.tar"
    before = len(requests_for(log, "format-tar-ustar.tar"))
    out = subprocess.run([os.path.join(BUILD, "dlshard"), "index", url], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0 and out.stdout == f"{url}: 1 samples indexed\n", (out.stdout, out.stderr)
    indexed = requests_for(log, "format-tar-ustar.tar")[before:]
    bench(url, env={"XDG_CACHE_HOME": env["XDG_CACHE_HOME"]})
    loaded = requests_for(log, "format-tar-ustar.tar")[before + len(indexed):]
    whole = lambda lines: [line for line in lines if line.rstrip().endswith(("range=", "range=-"))]  # noqa: E731
    assert len(whole(indexed)) == 1 and not whole(loaded), (indexed, loaded)


def test_faults_are_retried_to_the_same_stream(servers):
    shard = "rfs/packed-{000000..000001}.rfs"  # a few hundred requests: enough of each fault
    local = bench(os.path.join(SHARDS, shard), "--workers", "4")
    proxy = FaultProxy(servers["http"].port, seed=7, latency_s=0.001, p503=0.15, preset=0.05, pshort=0.05)
    try:
        remote = bench(f"{proxy.url}/{shard}", "--workers", "4", "--option", "retries=8", env=servers["env"])
    finally:
        proxy.stop()
    assert remote["batch_digests"] == local["batch_digests"] and remote["errors"] == local["errors"]
    assert remote["loader"]["retries"] > 0
    assert proxy.counts["503"] > 0 and proxy.counts["reset"] > 0 and proxy.counts["short"] > 0


def test_a_slow_server_makes_reading_the_bottleneck(servers):
    # 40 ms a request, one request at a time: the worker waits far longer than it decodes.
    proxy = FaultProxy(servers["http"].port, latency_s=0.04)
    try:
        run = bench(f"{proxy.url}/{RFS}", "--workers", "1", "--option", "io_depth=1", "--stop-after", "6",
                    env=servers["env"])
    finally:
        proxy.stop()
    loader = run["loader"]
    assert loader["bottleneck"] == "read", loader["bottleneck_why"]
    assert loader["worker_read_frac"] > 0.5 and loader["worker_read_frac"] > 4 * loader["worker_decode_frac"]


def test_what_still_fails_after_retries_is_a_counted_error(servers, tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    # The probe and the index download pass; every sample read then gets 503.
    proxy = FaultProxy(servers["http"].port, p503=1.0, after=2)
    try:
        out = bench(f"{proxy.url}/format-tar-gnu.tar", "--option", "retries=1", env=env)
    finally:
        proxy.stop()
    # Each request (one or more neighbouring samples) was tried twice.
    assert out["errors"] == out["samples"] and out["loader"]["requests"] == 2 * out["loader"]["retries"] > 0
    proxy = FaultProxy(servers["http"].port, p503=1.0)
    try:
        failed = bench(f"{proxy.url}/format-tar-gnu.tar", "--option", "retries=2", env=env, ok=False)
    finally:
        proxy.stop()
    assert failed.returncode == 1 and "HTTP 503 (after retries)" in failed.stderr


def test_a_server_that_goes_down_stops_the_run(servers, tmp_path):
    # Seven shards open (their probes and indexes pass), then every request gets 503. Each sample
    # alone would be a counted error, but a run of zeros is no training: once 32 requests in a row
    # have failed after their retries the run stops with the server's reason (it used to go on,
    # 130 s at the default retries, and end with exit 0).
    proxy = FaultProxy(servers["http"].port, p503=1.0, after=20)
    try:
        out = bench(f"{proxy.url}/{RFS}", "--workers", "2", "--option", "retries=1",
                    env={"XDG_CACHE_HOME": str(tmp_path / "cache")}, ok=False)
    finally:
        proxy.stop()
    assert out.returncode == 1 and "HTTP 503 (after retries)" in out.stderr, out.stderr[-2000:]
    assert "requests in a row failed: the server is down" in out.stderr
    assert proxy.counts["503"] < 400, proxy.counts


@pytest.mark.binding
def test_close_does_not_wait_for_a_stalled_server(servers, tmp_path):
    lib = os.environ.get("RINGFEED_LIBRARY")
    if not lib:
        pytest.skip("the Python binding needs RINGFEED_LIBRARY")
    proxy = FaultProxy(servers["http"].port, stall_s=20, after=2)
    try:  # reads in flight, stalled
        took = seconds_to_close(proxy.url + "/" + TAR, {"XDG_CACHE_HOME": str(tmp_path / "cache")}, 0.3, workers=4)
    finally:
        proxy.stop()
    assert took < 0.5 and proxy.counts["stall"] > 0


def tensor_tar(path, base, samples, rows=lambda i: 4):
    """A tar shard of SAMPLES samples, each an int32 .npy member x of ROWS(i) times BASE + i and a
    label BASE + i: two files made with different BASE have the same layout, byte for byte."""
    import io
    import tarfile
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as t:
        for i in range(samples):
            header = f"{{'descr': '<i4', 'fortran_order': False, 'shape': ({rows(i)},), }}".encode().ljust(117)
            x = b"\x93NUMPY\x01\x00v\x00" + header + b"\n" + (base + i).to_bytes(4, "little") * rows(i)
            for name, data in ((f"{i:06d}.x.npy", x), (f"{i:06d}.cls", str(base + i).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))


@pytest.fixture
def own_server(tmp_path):
    """nginx over a folder of the test's own: outside pytest's (private to its user, where nginx's
    workers, run as another user under root, could not read)."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="ringfeed-http-"))
    root.chmod(0o755)
    server = Nginx(str(root), str(tmp_path / "nginx"))
    yield root, server
    server.stop()
    shutil.rmtree(root)


def test_a_url_written_with_spaces_or_letters_beyond_ascii_is_encoded_as_browsers_do(own_server, tmp_path):
    # "http://host/a b.tar" was refused by libcurl ("URL using bad/illegal format"); requests and
    # browsers send it as a%20b.tar. A URL already encoded, or with a "+", is sent as it is.
    root, server = own_server
    for name in ("a b.tar", "é.tar", "x+y.tar"):
        shutil.copy(os.path.join(SHARDS, TAR), root / name)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    local = bench(os.path.join(SHARDS, TAR), env=env)
    for name in ("a b.tar", "a%20b.tar", "é.tar", "%C3%A9.tar", "x+y.tar"):
        got = bench(f"{server.url}/{name}", env=env)
        assert got["batch_digests"] == local["batch_digests"], name
    assert bench(f"{server.url}/{{a b,é}}.tar", env=env)["samples"] == 2 * local["samples"]


def test_a_compressed_remote_tar_reads_as_its_local_copy(own_server, tmp_path):
    """WebDataset's .tar.gz over HTTP (and zstd, bzip2): downloaded whole and decompressed at open,
    the plain tar's batches; with cache_dir the uncompressed copy is kept, so a later open downloads
    nothing; damaged data keeps the members before it, named by URL."""
    import bz2
    import gzip
    root, server = own_server
    tar = pathlib.Path(SHARDS, TAR).read_bytes()
    (root / "a.tar.gz").write_bytes(gzip.compress(tar))
    (root / "a.tar.bz2").write_bytes(bz2.compress(tar))
    (root / "a.tar.zst").write_bytes(subprocess.run(["zstd", "-q", "-c"], input=tar, capture_output=True,
                                                    check=True).stdout)
    (root / "cut.tar.gz").write_bytes(gzip.compress(tar)[:len(tar) // 3])
    shutil.copy(os.path.join(SHARDS, TAR), root / "plain.tar")
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    local = bench(os.path.join(SHARDS, TAR), env=env)
    for name in ("a.tar.gz", "a.tar.bz2", "a.tar.zst"):
        got = bench(f"{server.url}/{name}", "--workers", "2", env=env)
        assert got["batch_digests"] == local["batch_digests"], name

    def downloads(lines):  # GETs without a Range: the whole object
        return [line for line in lines if "range=-" in line or line.rstrip().endswith("range=")]
    cache = ["--option", f"cache_dir={tmp_path / 'cache'}"]
    opens = []
    for _ in range(2):
        before = len(requests_for(server.access_log, "a.tar.gz"))
        assert bench(f"{server.url}/a.tar.gz", *cache, env=env)["batch_digests"] == local["batch_digests"]
        opens.append(requests_for(server.access_log, "a.tar.gz")[before:])
    assert len(downloads(opens[0])) == 1 and not downloads(opens[1]), opens
    kept = [f for f in (tmp_path / "cache").rglob("*") if f.is_file() and f.stat().st_size == len(tar)]
    assert len(kept) == 1 and kept[0].read_bytes() == tar

    cut = f"{server.url}/cut.tar.gz"
    out = bench(cut, "--epochs", "1", env=dict(env, DL_LOG_LEVEL="2"), ok=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert 0 < json.loads(out.stdout)["samples"] < local["samples"]
    assert f"shard {cut}: its gz data ends early (truncated?); keeping the members before it" in out.stderr
    out = bench(cut, "--option", "on_error=fail", env=env, ok=False)
    assert out.returncode == 1 and "DL_ECORRUPT" in out.stderr
    assert f"shard {cut}: its gz data ends early" in out.stderr

    # dlshard lists and verifies it as it does the plain tar.
    for command in ("ls", "verify"):
        remote, plain = (subprocess.run([os.path.join(BUILD, "dlshard"), command, source], capture_output=True,
                                        text=True, timeout=300, env=dict(os.environ, **env))
                         for source in (f"{server.url}/a.tar.gz", os.path.join(SHARDS, TAR)))
        assert remote.returncode == plain.returncode, remote.stderr
        assert remote.stdout.splitlines()[-1].split(": ")[-1] == plain.stdout.splitlines()[-1].split(": ")[-1]

    # The copy is read as a local shard: beside local shards it is one; beside ranged ones, named.
    both = bench(f"{server.url}/a.tar.gz::{os.path.join(SHARDS, TAR)}", "--epochs", "1", env=env)
    assert both["samples"] == 2 * local["samples"]
    out = bench(f"{server.url}/a.tar.gz::{server.url}/plain.tar", env=env, ok=False)
    assert out.returncode == 1
    assert "compressed remote shards (read from local copies) and uncompressed" in out.stderr


@pytest.mark.parametrize("status", [500, 412])
def test_a_compressed_remote_tar_whose_download_fails_fails_the_open_by_its_url(tmp_path, status):
    """The whole download behind a remote .tar.gz's copy failing (a server error, retried; or the
    object changed since its probe, 412 to the If-Match): the open fails naming the URL and the
    status."""
    import gzip
    data = gzip.compress(pathlib.Path(SHARDS, TAR).read_bytes())
    asked = {"whole": 0, "if_match": []}

    def failing_download(handler):
        if "Range" in handler.headers:
            return False  # the probe: as asked
        asked["whole"] += 1
        asked["if_match"].append(handler.headers.get("If-Match"))
        handler.send_response(status)
        handler.send_header("Content-Length", "0")
        handler.end_headers()
        return True
    server = serve_one_object(data, failing_download, etag='"v1"')
    url = f"http://127.0.0.1:{server.server_address[1]}/a.tar.gz"
    try:
        out = bench(url, "--option", "retries=2", env={"XDG_CACHE_HOME": str(tmp_path)}, ok=False)
    finally:
        server.shutdown()
    assert out.returncode == 1, out.stderr
    assert f"{url}: HTTP {status}" in out.stderr, out.stderr
    if status == 412:
        assert "changed on the server since it was opened" in out.stderr, out.stderr
    assert asked["if_match"] and set(asked["if_match"]) == {'"v1"'}  # the version probed, every time
    assert asked["whole"] == (3 if status == 500 else 1)  # a server error is retried, a changed object not


def test_npy_members_of_a_remote_tar_equal_local(own_server, tmp_path):
    root, server = own_server
    tensor_tar(root / "t.tar", 0, 40)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    local = bench(str(root / "t.tar"), "--workers", "2", env=env)
    remote = bench(f"{server.url}/t.tar", "--workers", "2", env=env)
    assert remote["digest"] == local["digest"] and remote["errors"] == local["errors"] == 0
    assert remote["samples"] == 40 and remote["loader"]["requests"] > 0


def test_pad_reads_the_headers_of_remote_samples_together(own_server, tmp_path):
    # pad=1 sizes a field by its longest sample: every sample's .npy header is read at open. One
    # request after another would cost a round trip per sample; neighbours share requests instead.
    root, server = own_server
    tensor_tar(root / "t.tar", 0, 400, rows=lambda i: 1 + i * 7 % 13)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    opts = ["--workers", "2", "--option", "pad=1", "--option", "shuffle=0"]
    local = bench(str(root / "t.tar"), *opts, env=env)
    remote = bench(f"{server.url}/t.tar", *opts, env=env)
    assert remote["digest"] == local["digest"] and remote["errors"] == local["errors"] == 0
    # The batches' own reads take about one request per batch of 8; the headers about one per 32.
    sent = len(requests_for(server.access_log, "t.tar"))
    assert remote["samples"] == 400 and sent < 100, sent


@pytest.mark.parametrize("pad", ["0", "1"])
def test_a_server_failing_while_the_schema_is_read_fails_the_open_at_once(own_server, tmp_path, pad):
    # A failing server is not a bad sample: the open does not try the next sample's header, and
    # the next, each with its retries (a million samples would take days).
    root, server = own_server
    tensor_tar(root / "t.tar", 0, 200)
    proxy = FaultProxy(server.port, p503=1.0, after=2)  # the probe and the index's download pass
    try:
        out = bench(f"{proxy.url}/t.tar", "--option", "retries=1", "--option", f"pad={pad}",
                    env={"XDG_CACHE_HOME": str(tmp_path / "cache")}, ok=False)
    finally:
        proxy.stop()
    assert out.returncode == 1 and f"{proxy.url}/t.tar: HTTP 503 (after retries)" in out.stderr, out.stderr
    assert proxy.counts["503"] <= 2 * 64, proxy.counts  # a window of headers at most, each tried twice


@pytest.mark.binding
def test_a_shard_replaced_on_the_server_is_refused_not_mixed(own_server, tmp_path):
    # The index (and the labels in it) is of the version opened; reading the new version at its
    # offsets would pair old labels with new tensors. Each read carries If-Match: 412 instead.
    lib = os.environ.get("RINGFEED_LIBRARY")
    if not lib:
        pytest.skip("the Python binding needs RINGFEED_LIBRARY")
    pytest.importorskip("numpy")
    root, server = own_server
    tensor_tar(root / "t.tar", 0, 400)
    tensor_tar(tmp_path / "new.tar", 1000, 400)
    os.utime(tmp_path / "new.tar", (1e9, 1e9))  # another mtime: nginx's ETag is mtime and size
    binding = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings", "python")
    code = f"""
import json, os, sys
sys.path.insert(0, {binding!r})
import ringfeed
loader = ringfeed.Loader({server.url + '/t.tar'!r}, batch_size=8, workers=1, prefetch=2, shuffle=False,
                         epochs=1, framework="numpy")
pairs = []
for b in loader:
    pairs += [(int(x[0]), int(y)) for x, y in zip(b["x"], b["label"])]
    if len(pairs) == 8:  # the first batch taken: the rest is read after the change
        os.replace({str(tmp_path / 'new.tar')!r}, {str(root / 't.tar')!r})
print(json.dumps({{"pairs": pairs, "errors": loader.stats()["errors"]}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), DL_LOG_LEVEL="2"))
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    pairs = result["pairs"]
    assert len(pairs) == 400 and [y for _, y in pairs] == list(range(400))
    # Every sample is the version opened, or refused and zeroed; none holds the new version's data.
    assert all(x == y or x == 0 for x, y in pairs), [p for p in pairs if p[0] != p[1] and p[0]][:5]
    refused = sum(1 for x, y in pairs if x != y)
    assert result["errors"] == refused > 300  # all but the batches read before the change
    assert f"{server.url}/t.tar: HTTP 412 (it changed on the server since it was opened)" in out.stderr


def test_a_host_that_is_not_there_is_named_and_for_s3_the_endpoint_in_use(tmp_path):
    """No server answers: the message names the host asked for, and for s3:// (whose URL names
    no host) the endpoint in use and how to set another."""
    quick = ["--option", "retries=0", "--option", "timeout_ms=5000"]
    out = dlbench("http://shards.example.invalid/a.tar", *quick, ok=False)
    assert out.returncode == 1 and "(host shards.example.invalid)" in out.stderr, out.stderr
    out = dlbench("s3://bucket/a.tar", *quick, ok=False, aws_env=False,
                  env={"AWS_ENDPOINT_URL": "http://store.example.invalid:9000", "AWS_ACCESS_KEY_ID": "k",
                       "AWS_SECRET_ACCESS_KEY": "s", "HOME": str(tmp_path)})
    assert out.returncode == 1, out.stderr
    assert "host store.example.invalid, the S3 endpoint http://store.example.invalid:9000" in out.stderr, out.stderr
    assert "AWS_ENDPOINT_URL" in out.stderr
