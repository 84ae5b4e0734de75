#!/usr/bin/env python3
"""Fetches the third-party test corpora (PngSuite, libjpeg-turbo's and Pillow's test images, fuzz
JPEGs, WebDataset and MDS shards, zstd's golden frames) from their public origins at the pinned
commits, checks every file against the SHA-256 the manifest gives, and puts them in DEST
(default: $XDG_CACHE_HOME/ringfeed/testdata, else ~/.cache/ringfeed/testdata), where `make test`
finds them. Only the standard library; run again, it fetches only what is missing or wrong.

    python3 scripts/fetch-testdata.py [DEST] [--manifest M] [--origins O]

The manifest (tests/testdata/MANIFEST.tsv) lists each file: its path, size and SHA-256. The
origins (tests/testdata/ORIGINS.tsv) say where each corpus comes from: a repository at a commit
and the paths in it whose files are taken, by their SHA-256, as the manifest names them.
DL_TESTDATA_ORIGIN (default https://github.com) is where repositories are fetched from:
ORIGIN/REPO/archive/COMMIT.tar.gz for a repository, ORIGIN/REPO/raw/COMMIT/PATH for one file.
Exit status 0 when every file is there and right; 1 with each missing or wrong one named."""
import argparse
import hashlib
import os
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "testdata")
COMPLETE = ".complete"  # written once every file of the manifest is there and right


def default_dest():
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "ringfeed", "testdata")


def read_tsv(path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                yield line.rstrip("\n").split("\t")


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(url, into):
    """URL's body into the file INTO (through a temporary file: a broken transfer leaves none)."""
    tmp = into + ".part"
    try:
        with urllib.request.urlopen(url, timeout=60) as r, open(tmp, "wb") as out:
            while True:
                chunk = r.read(1 << 20)
                if not chunk:
                    break
                out.write(chunk)
        os.replace(tmp, into)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def place(dest, path, data):
    target = os.path.join(dest, path)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target + ".part", "wb") as f:
        f.write(data)
    os.replace(target + ".part", target)


def wanted_by_corpus(manifest, dest):
    """Per corpus, the SHA-256s of its files not yet in DEST as the manifest has them, each with
    the paths it goes to."""
    wanted = {}
    for path, _size, sha in manifest:
        target = os.path.join(dest, path)
        if os.path.isfile(target) and sha256_of(target) == sha:
            continue
        wanted.setdefault(path.split("/", 1)[0], {}).setdefault(sha, []).append(path)
    return wanted


def under(name, paths):
    return "*" in paths or any(name == p or name.startswith(p.rstrip("/") + "/") for p in paths)


def take_archive(archive, paths, want, dest, got):
    """Every file of ARCHIVE (a repository's tarball, one top folder) under PATHS that WANT names."""
    with tarfile.open(archive) as tar:
        for member in tar:
            if not member.isfile():
                continue
            name = member.name.split("/", 1)[1] if "/" in member.name else member.name
            if not under(name, paths):
                continue
            data = tar.extractfile(member).read()
            sha = hashlib.sha256(data).hexdigest()
            for path in want.get(sha, []):
                if path not in got:
                    place(dest, path, data)
                    got.add(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dest", nargs="?", default=os.environ.get("DL_TESTDATA_DIR") or default_dest())
    ap.add_argument("--manifest", default=os.path.join(DATA, "MANIFEST.tsv"))
    ap.add_argument("--origins", default=os.path.join(DATA, "ORIGINS.tsv"))
    args = ap.parse_args()
    origin = os.environ.get("DL_TESTDATA_ORIGIN", "https://github.com").rstrip("/")
    dest = os.path.abspath(args.dest)
    manifest = [row[:3] for row in read_tsv(args.manifest) if row[0] != "path"]
    os.makedirs(dest, exist_ok=True)
    if os.path.exists(os.path.join(dest, COMPLETE)):
        os.unlink(os.path.join(dest, COMPLETE))
    wanted = wanted_by_corpus(manifest, dest)
    archives = os.path.join(dest, ".archives")
    os.makedirs(archives, exist_ok=True)
    got, failed = set(), []
    origins = list(read_tsv(args.origins))
    # Files the collection's own makers wrote (no origin has them; no test reads them).
    unsourced = {f"{row[0]}/{p}" for row in origins if row[1] == "-" for p in row[3].split()}
    for row in origins:
        corpus, repo, commit, paths = row[0], row[1], row[2], row[3].split()
        want = wanted.get(corpus)
        if not want or repo == "-":
            continue
        one_file = len(commit) == 40 and len(paths) == 1 and "*" not in paths
        try:
            if one_file:  # one file at its own commit
                url = f"{origin}/{repo}/raw/{commit}/{paths[0]}"
                with urllib.request.urlopen(url, timeout=60) as r:
                    data = r.read()
                for path in want.get(hashlib.sha256(data).hexdigest(), []):
                    place(dest, path, data)
                    got.add(path)
                continue
            archive = os.path.join(archives, f"{repo.replace('/', '_')}-{commit}.tar.gz")
            if not os.path.exists(archive):
                url = f"{origin}/{repo}/archive/{commit}.tar.gz"
                print(f"fetch-testdata: {corpus}: {url}", file=sys.stderr)
                fetch(url, archive)
            take_archive(archive, paths, want, dest, got)
        except (OSError, urllib.error.URLError, tarfile.TarError) as e:
            failed.append(f"{corpus}: {repo}@{commit}: {e}")
    missing = [(path, sha) for path, _size, sha in manifest if path not in unsourced and
               (not os.path.isfile(os.path.join(dest, path)) or sha256_of(os.path.join(dest, path)) != sha)]
    for line in failed:
        print(f"fetch-testdata: could not fetch {line}", file=sys.stderr)
    by_corpus = {}
    for path, _ in missing:
        by_corpus.setdefault(path.split("/", 1)[0], []).append(path)
    for corpus, paths in sorted(by_corpus.items()):
        shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
        print(f"fetch-testdata: {corpus}: {len(paths)} file(s) missing or not as the manifest has them: {shown}",
              file=sys.stderr)
    needed = len(manifest) - len(unsourced)
    print(f"fetch-testdata: {needed - len(missing)} of {needed} files in {dest} as the manifest has them")
    if missing:
        return 1
    with open(os.path.join(dest, COMPLETE), "w") as f:
        f.write(f"{needed} files\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
