"""make testdata's fetcher (scripts/fetch-testdata.py) against a real HTTP server standing in for
GitHub: repositories' archives at commits and single files, a manifest of SHA-256s. What it
fetches is exactly what the manifest says; a file that differs, a repository that is not there or
a corpus it cannot complete is named, and nothing wrong is kept."""
import hashlib
import http.server
import io
import os
import subprocess
import sys
import tarfile
import threading

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FETCH = os.path.join(ROOT, "scripts", "fetch-testdata.py")


def archive(files, top):
    """A repository's tarball as GitHub makes it: every file below one top folder."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def origin(tmp_path):
    """An HTTP server on 127.0.0.1 serving ORIGIN/REPO/archive/COMMIT.tar.gz and
    ORIGIN/REPO/raw/COMMIT/PATH from a dict the test fills."""
    served = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = served.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", served
    server.shutdown()
    server.server_close()


def corpus_files():
    """Two corpora: one from a repository's folder, one file from an older commit."""
    images = {f"tests/images/{i}.png": f"png {i}".encode() * (i + 1) for i in range(5)}
    images["LICENSE"] = b"license text"
    images["src/other.c"] = b"not wanted"
    old = b"an older file"
    return images, old


def write_tables(tmp_path, images, old):
    manifest = ["path\tbytes\tsha256"]
    for name, data in images.items():
        if name.startswith("tests/images/"):
            manifest.append(f"pics/{name.split('/')[-1]}\t{len(data)}\t{hashlib.sha256(data).hexdigest()}")
    manifest.append(f"pics/LICENSE.pics\t{len(images['LICENSE'])}\t{hashlib.sha256(images['LICENSE']).hexdigest()}")
    manifest.append(f"pics/history/old.bin\t{len(old)}\t{hashlib.sha256(old).hexdigest()}")
    manifest.append(f"pics/NOTES.txt\t5\t{hashlib.sha256(b'notes').hexdigest()}")
    commit = "a" * 40
    origins = ["# corpus\trepository\tcommit\tpaths", "pics\tsomeone/pics\t0123456789ab\ttests/images LICENSE",
               f"pics\tsomeone/pics\t{commit}\thistory/old.bin", "pics\t-\t-\tNOTES.txt"]
    (tmp_path / "MANIFEST.tsv").write_text("\n".join(manifest) + "\n")
    (tmp_path / "ORIGINS.tsv").write_text("\n".join(origins) + "\n")
    return commit


def run_fetch(tmp_path, base, dest):
    env = dict(os.environ, DL_TESTDATA_ORIGIN=base)
    return subprocess.run([sys.executable, FETCH, str(dest), "--manifest", str(tmp_path / "MANIFEST.tsv"),
                           "--origins", str(tmp_path / "ORIGINS.tsv")], capture_output=True, text=True, env=env,
                          timeout=120)


def test_fetches_each_corpus_by_its_hashes_and_names_what_is_missing(tmp_path, origin):
    base, served = origin
    images, old = corpus_files()
    commit = write_tables(tmp_path, images, old)
    served["/someone/pics/archive/0123456789ab.tar.gz"] = archive(images, "pics-0123456789ab")
    dest = tmp_path / "dest"
    # The single file's commit is not served yet: the fetch says so, and marks nothing complete.
    out = run_fetch(tmp_path, base, dest)
    assert out.returncode == 1, out.stderr
    assert "pics: 1 file(s) missing" in out.stderr and "pics/history/old.bin" in out.stderr
    assert "someone/pics@" + commit in out.stderr and "404" in out.stderr
    assert not (dest / ".complete").exists()
    for i in range(5):
        assert (dest / "pics" / f"{i}.png").read_bytes() == images[f"tests/images/{i}.png"]
    assert (dest / "pics" / "LICENSE.pics").read_bytes() == b"license text"  # renamed, found by its hash
    assert not (dest / "pics" / "other.c").exists() and not (dest / "pics" / "src").exists()
    served[f"/someone/pics/raw/{commit}/history/old.bin"] = old
    out = run_fetch(tmp_path, base, dest)
    assert out.returncode == 0, out.stderr
    assert "7 of 7 files" in out.stdout and (dest / ".complete").exists()
    assert (dest / "pics" / "history" / "old.bin").read_bytes() == old


def test_a_file_that_differs_is_not_kept_and_is_named(tmp_path, origin):
    base, served = origin
    images, old = corpus_files()
    commit = write_tables(tmp_path, images, old)
    damaged = dict(images)
    damaged["tests/images/3.png"] = b"not the file the manifest names"
    served["/someone/pics/archive/0123456789ab.tar.gz"] = archive(damaged, "pics-0123456789ab")
    served[f"/someone/pics/raw/{commit}/history/old.bin"] = old
    dest = tmp_path / "dest"
    out = run_fetch(tmp_path, base, dest)
    assert out.returncode == 1 and "pics/3.png" in out.stderr and "6 of 7 files" in out.stdout
    assert not (dest / "pics" / "3.png").exists() and not (dest / ".complete").exists()
    # A file already there but changed since is fetched again.
    served["/someone/pics/archive/0123456789ab.tar.gz"] = archive(images, "pics-0123456789ab")
    os.unlink(dest / ".archives" / "someone_pics-0123456789ab.tar.gz")
    (dest / "pics" / "1.png").write_bytes(b"changed")
    out = run_fetch(tmp_path, base, dest)
    assert out.returncode == 0, out.stderr
    assert (dest / "pics" / "1.png").read_bytes() == images["tests/images/1.png"]


def test_the_repository_manifest_names_every_shared_corpus_file():
    """The manifest kept in the repository, and every corpus it names has an origin."""
    manifest = os.path.join(ROOT, "tests", "testdata", "MANIFEST.tsv")
    origins = os.path.join(ROOT, "tests", "testdata", "ORIGINS.tsv")
    corpora = {line.split("\t", 1)[0].split("/", 1)[0] for line in open(manifest) if not line.startswith("path")}
    sourced = {line.split("\t", 1)[0] for line in open(origins) if line.strip() and not line.startswith("#")}
    assert corpora and corpora <= sourced, corpora - sourced
