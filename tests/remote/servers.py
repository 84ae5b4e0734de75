"""Real servers for the remote-source tests, started on 127.0.0.1 with free ports and stopped after:
nginx over HTTP and HTTPS (a throw-away CA made with openssl), a fault-injecting proxy written
for the tests (latency, a share of 503s, resets mid-body, truncated bodies, stalls), s3rver, and a
lean latency proxy for benchmarks; and dlbench run against them."""
import asyncio
import hashlib
import json
import os
import random
import shutil
import socket
import socketserver
import subprocess
import sys
import threading
import time

# The proxy serves many connections from threads: switch between them often, not every 5 ms.
sys.setswitchinterval(0.0002)


BUILD = os.path.dirname(os.environ.get("DL_DLSHARD") or os.environ.get("RINGFEED_LIBRARY", ""))
DLBENCH = os.path.join(BUILD, "dlbench")
SHARDS = os.environ.get("DL_TEST_SHARDS", "")


def dlbench_command(source, *args):
    return [DLBENCH, source, "--json", "--digest", *args]


def dlbench(source, *args, env=None, ok=True, aws_env=True):
    """dlbench's JSON for SOURCE (quiet, ENV added; without AWS_ variables of the caller's unless
    AWS_ENV); with ok=False the finished process instead, whatever its exit status."""
    e = {k: v for k, v in os.environ.items() if aws_env or not k.startswith("AWS_")}
    e["DL_LOG_LEVEL"] = "1"  # ENV may ask for more
    e.update(env or {})
    out = subprocess.run(dlbench_command(source, *args), capture_output=True, text=True, timeout=300, env=e)
    if not ok:
        return out
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise RuntimeError(f"nothing listens on port {port}")


def make_ca(work):
    """A CA and a certificate for 127.0.0.1 signed by it: (ca.pem, cert.pem, key.pem)."""
    os.makedirs(work, exist_ok=True)
    ca_key, ca, key, csr, cert = (os.path.join(work, n) for n in ("ca.key", "ca.pem", "srv.key", "srv.csr", "srv.pem"))
    ext = os.path.join(work, "san.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run = lambda *a: subprocess.run(a, check=True, capture_output=True)  # noqa: E731
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca, "-days", "2",
        "-subj", "/CN=ringfeed test CA")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1")
    run("openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert,
        "-days", "2", "-extfile", ext)
    return ca, cert, key


class Nginx:
    """nginx serving ROOT on a free port, over HTTP, or HTTPS with CERT and KEY; with REDIRECT =
    (CODE, TARGET) it serves nothing and answers every request with CODE and a Location on TARGET
    (on itself when TARGET is None), as Hugging Face's resolve URLs and presigned links do; with IPV6
    it listens on [::1] as well."""

    def __init__(self, root, work, cert=None, key=None, redirect=None, ipv6=False):
        if not shutil.which("nginx") and not os.path.exists("/usr/sbin/nginx"):
            raise RuntimeError("nginx is not installed")
        self.port = free_port()
        self.root = root
        os.makedirs(work, exist_ok=True)
        tls = f"ssl http2; ssl_certificate {cert}; ssl_certificate_key {key};" if cert else ";"
        self.url = f"{'https' if cert else 'http'}://127.0.0.1:{self.port}"
        serve = f"root {root};"
        six = f"listen [::1]:{self.port}{' ssl http2' if cert else ''};" if ipv6 else ""
        if redirect:
            serve = f"location / {{ return {redirect[0]} {redirect[1] or self.url}$request_uri; }}"
        conf = os.path.join(work, "nginx.conf")
        with open(conf, "w") as f:
            f.write(f"""daemon off; worker_processes 1; pid {work}/nginx.pid; error_log {work}/error.log;
events {{ worker_connections 256; }}
http {{
  log_format ranges '$request $status range=$http_range';
  access_log {work}/access.log ranges;
  client_body_temp_path {work}/body; proxy_temp_path {work}/proxy; fastcgi_temp_path {work}/fcgi;
  uwsgi_temp_path {work}/uwsgi; scgi_temp_path {work}/scgi;
  keepalive_requests 100000;
  server {{ listen 127.0.0.1:{self.port} {tls} {six} {serve} }}
}}
""")
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        self.proc = subprocess.Popen([binary, "-c", conf, "-e", f"{work}/error.log"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        wait_listening(self.port)
        self.access_log = os.path.join(work, "access.log")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


class FaultProxy:
    """A reverse proxy to an HTTP upstream that misbehaves on purpose. Per request, in order:
    stall (hold the request STALL_S seconds before answering), a 503 with probability P503, a
    reset after half the body with probability PRESET, a body cut short with probability PSHORT,
    and LATENCY_S added before each answer. REWRITE (request bytes -> request bytes) changes what
    goes upstream. Counts what it did in .counts."""

    def __init__(self, upstream_port, seed=0, latency_s=0.0, p503=0.0, preset=0.0, pshort=0.0, stall_s=0.0,
                 after=0, check=None, rewrite=None):
        self.upstream = upstream_port
        self.rng = random.Random(seed)
        self.latency_s, self.p503, self.preset, self.pshort = latency_s, p503, preset, pshort
        self.stall_s, self.after = stall_s, after  # the first AFTER requests are served well
        self.check = check  # request bytes -> None (forward it) or the answer to send instead
        self.rewrite = rewrite
        self.counts = {"requests": 0, "503": 0, "reset": 0, "short": 0, "stall": 0}
        self.lock = threading.Lock()
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                try:
                    proxy._serve(self.request)
                except (ConnectionResetError, BrokenPipeError):
                    pass  # a loader that closes mid-request (stopping, or done): nothing to serve

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _read_request(self, conn):
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
            if name.strip().lower() == b"expect" and value.strip().lower() == b"100-continue" and not body:
                conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        while len(body) < length:  # an upload's body (no chunked encoding: uploads say their size)
            chunk = conn.recv(1 << 20)
            if not chunk:
                return None
            body += chunk
        return head + b"\r\n\r\n" + body

    def _upstream(self, request):
        with socket.create_connection(("127.0.0.1", self.upstream)) as up:
            # One request per upstream connection, so the answer ends where the connection does.
            head, _, body = request.partition(b"\r\n\r\n")
            lines = [ln for ln in head.split(b"\r\n") if not ln.lower().startswith((b"connection:", b"expect:"))]
            up.sendall(b"\r\n".join(lines) + b"\r\nConnection: close\r\n\r\n" + body)
            out = b""
            while True:
                chunk = up.recv(1 << 20)
                if not chunk:
                    return out
                out += chunk

    def _serve(self, conn):
        while True:
            request = self._read_request(conn)
            if request is None:
                return
            with self.lock:
                self.counts["requests"] += 1
                n = self.counts["requests"]
                r503, rreset, rshort = self.rng.random(), self.rng.random(), self.rng.random()
                if n <= self.after:
                    r503 = rreset = rshort = 1.0
            if self.stall_s and n > self.after:
                with self.lock:
                    self.counts["stall"] += 1
                time.sleep(self.stall_s)
            if self.latency_s:
                time.sleep(self.latency_s)
            closing = b"\r\nconnection: close" in request.lower()
            refusal = self.check(request) if self.check else None
            if refusal is not None:
                conn.sendall(refusal)
                if closing:
                    return
                continue
            if r503 < self.p503:
                with self.lock:
                    self.counts["503"] += 1
                conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
                continue
            answer = self._upstream(self.rewrite(request) if self.rewrite else request)
            head, _, body = answer.partition(b"\r\n\r\n")
            head = b"\r\n".join(ln for ln in head.split(b"\r\n") if not ln.lower().startswith(b"connection:"))
            if rreset < self.preset and len(body) > 1:
                with self.lock:
                    self.counts["reset"] += 1
                conn.sendall(head + b"\r\n\r\n" + body[: len(body) // 2])
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                return  # closed with RST
            if rshort < self.pshort and len(body) > 1:
                with self.lock:
                    self.counts["short"] += 1
                conn.sendall(head + b"\r\nConnection: close\r\n\r\n" + body[: len(body) // 2])
                return  # the Content-Length promised more
            conn.sendall(head + b"\r\n\r\n" + body)
            if closing:
                return

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


class S3rver:
    """s3rver (npm, installed by scripts/install-deps.sh test into build-npm) with one bucket."""

    def __init__(self, work, bucket):
        root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
        self.binary = os.path.join(root, "build-npm", "node_modules", ".bin", "s3rver")
        if not os.path.exists(self.binary) or not shutil.which("node"):
            raise RuntimeError("s3rver is not installed (scripts/install-deps.sh test)")
        os.makedirs(work, exist_ok=True)
        self.port = free_port()
        # s3rver makes its continuation tokens with DES, which OpenSSL 3 (Node 17 on) keeps in its
        # legacy provider: without it every truncated listing is an InternalError.
        node = shutil.which("node")
        legacy = subprocess.run([node, "--openssl-legacy-provider", "-e", "0"], capture_output=True).returncode == 0
        # Buckets answer as BUCKET.s3.localhost too (virtual-hosted addressing; *.localhost is loopback).
        self.proc = subprocess.Popen([node, *(["--openssl-legacy-provider"] if legacy else []), self.binary, "-d", work, "-a", "127.0.0.1", "-p", str(self.port), "--silent",
                                      "--service-endpoint", "localhost", "--configure-bucket", bucket],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_listening(self.port)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


def sigv4_checker(key_id, secret, region, seen):
    """A check for FaultProxy: every request must carry a SigV4 signature that AWS's own signer
    (botocore) computes the same for KEY_ID and SECRET; otherwise S3's 403 SignatureDoesNotMatch.
    SEEN counts the requests checked, those refused, and those that ask for a version (If-Match,
    signed like the rest) or do not."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    auth = S3SigV4Auth(Credentials(key_id, secret), "s3", region)

    def refuse(code):
        body = f"<?xml version=\"1.0\"?><Error><Code>{code}</Code><Message>refused by the test</Message></Error>"
        return (f"HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}\r\n\r\n"
                + body).encode()

    def check(request):
        head, _, body = request.partition(b"\r\n\r\n")
        head = head.decode("latin-1").split("\r\n")
        method, target, _ = head[0].split(" ", 2)
        headers = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        seen["checked"] += 1
        authorization = headers.get("authorization", "")
        if not authorization.startswith("AWS4-HMAC-SHA256 "):
            seen["refused"] += 1
            return refuse("AccessDenied")
        fields = dict(part.strip().split("=", 1) for part in authorization[len("AWS4-HMAC-SHA256 "):].split(","))
        signed = fields["SignedHeaders"].split(";")
        req = AWSRequest(method=method, url=f"http://{headers['host']}{target}",
                         headers={name: headers[name] for name in signed})
        req.context["timestamp"] = headers["x-amz-date"]
        canonical = auth.canonical_request(req)
        expected = auth.signature(auth.string_to_sign(req, canonical), req)
        if fields.get("Signature") != expected or fields["Credential"].split("/")[0] != key_id:
            seen["refused"] += 1
            return refuse("SignatureDoesNotMatch")
        # As S3: the payload hash the signature covers is the body's, or UNSIGNED-PAYLOAD.
        claimed = headers.get("x-amz-content-sha256")
        if claimed != "UNSIGNED-PAYLOAD" and claimed != hashlib.sha256(body).hexdigest():
            seen["refused"] += 1
            return refuse("XAmzContentSHA256Mismatch")
        if method == "PUT":
            seen["uploads"] = seen.get("uploads", 0) + 1
        ask = "if_match" if "if-match" in signed else "no_if_match"
        seen[ask] = seen.get(ask, 0) + 1
        return None

    return check


class LatencyProxy:
    """A TCP pass-through to 127.0.0.1:UPSTREAM that holds what a client sends for DELAY_S before
    forwarding it, so each request on a kept-alive connection costs one added round trip, as over
    a network with that latency. Bytes pass unparsed, in order, on one asyncio loop in its own
    thread: the proxy adds little time of its own (unlike FaultProxy, which buffers answers)."""

    def __init__(self, upstream_port, delay_s):
        self.upstream, self.delay = upstream_port, delay_s
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def serve():
            asyncio.set_event_loop(self.loop)
            self.server = self.loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0))
            self.port = self.server.sockets[0].getsockname()[1]
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        ready.wait(10)
        self.url = f"http://127.0.0.1:{self.port}"

    async def _client(self, reader, writer):
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            writer.close()
            return
        queue = asyncio.Queue()

        async def take():  # the client's bytes, stamped with when they may go on
            while data := await reader.read(1 << 16):
                queue.put_nowait((self.loop.time() + self.delay, data))
            queue.put_nowait((0, b""))

        async def send_on():
            while True:
                due, data = await queue.get()
                if not data:
                    break
                wait = due - self.loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                up_writer.write(data)
            up_writer.close()

        async def answer():
            while data := await up_reader.read(1 << 20):
                writer.write(data)
                await writer.drain()
            writer.close()

        try:
            await asyncio.gather(take(), send_on(), answer())
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
            up_writer.close()

    def stop(self):
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def seconds_to_close(source, env, wait_s, **options):
    """Opens a Loader over SOURCE in a fresh Python (the binding from this tree), lets its reads
    stall for WAIT_S, then times close(): the seconds it took. Needs RINGFEED_LIBRARY."""
    binding = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings", "python")
    code = f"""
import sys, time
sys.path.insert(0, {binding!r})
import ringfeed
loader = ringfeed.Loader({source!r}, batch_size=8, image_size=32, framework="numpy", **{options!r})
time.sleep({wait_s!r})
t0 = time.perf_counter()
loader.close()
print(f"closed {{time.perf_counter() - t0:.3f}}")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, **env))
    words = out.stdout.split()
    assert words and words[0] == "closed", out.stdout + out.stderr
    return float(words[1])
