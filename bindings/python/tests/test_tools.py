"""The command-line tools as a shell user meets them: several sources (a glob the shell expanded),
--version, every io mode in --help, nothing but JSON on stdout with --json, brace ranges and globs
in dlshard."""
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest

import ringfeed
from conftest import TESTDATA

WDS = os.path.join(TESTDATA, "webdataset", "WebDataset.jl-test-sample.tar")
BUILD = os.path.dirname(os.environ.get("DL_DLSHARD") or os.environ.get("RINGFEED_LIBRARY", ""))
DLBENCH, DLSHARD = os.path.join(BUILD, "dlbench"), os.path.join(BUILD, "dlshard")
needs_tools = pytest.mark.skipif(not (os.path.exists(DLBENCH) and os.path.exists(DLSHARD) and os.path.exists(WDS)),
                                 reason="tools not built or test data absent")
built = pytest.mark.skipif(not (os.path.exists(DLBENCH) and os.path.exists(DLSHARD)), reason="tools not built")
SMALL = ["--batch", "8", "--size", "32", "--crop", "resize", "--workers", "2"]


def run(*args, ok=True):
    out = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120)
    if ok:
        assert out.returncode == 0, out.stderr
    return out


@pytest.fixture
def two_shards(tmp_path):
    for i in range(2):
        shutil.copy(WDS, tmp_path / f"s-{i}.tar")
    return tmp_path


@needs_tools
def test_several_sources_read_as_one_list_and_json_alone_on_stdout(two_shards):
    a, b = two_shards / "s-0.tar", two_shards / "s-1.tar"
    one = json.loads(run(DLBENCH, a, *SMALL, "--json").stdout)
    both = run(DLBENCH, a, b, *SMALL, "--json", "--digest", "--keys").stdout
    got = json.loads(both)  # the whole of stdout is one object
    assert got["samples"] == 2 * one["samples"] and got["errors"] == 0
    assert len(got["batch_digests"]) == got["batches"] and len(got["keys"]) == got["batches"]
    assert sum(len(k) for k in got["keys"]) == got["samples"]
    listed = json.loads(run(DLBENCH, f"{a}::{b}", *SMALL, "--json", "--digest").stdout)
    assert listed["digest"] == got["digest"]
    text = run(DLBENCH, a, b, *SMALL, "--digest").stdout.splitlines()
    summary = next(i for i, line in enumerate(text) if " samples in " in line)
    assert text[summary - 1] == f"digest {got['digest']}"  # just before the summary lines


@needs_tools
def test_cpu_time_counts_the_workers_decoding(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    out = subprocess.run([DLBENCH, "--synthetic", "300", "--workers", "2", "--epochs", "2", "--json"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    # The workers' decoding is CPU time (its clock time, the figure beside it, runs over it only
    # while a worker waits for a CPU), and no more CPUs than the machine has were at work.
    assert got["cpu_s"] >= 0.3 * got["loader"]["decode_s"] > 0
    assert got["cpu_s"] <= got["wall_s"] * os.cpu_count() + 0.1
    text = subprocess.run([DLBENCH, "--synthetic", "300", "--workers", "2"], capture_output=True, text=True,
                          timeout=120, env=env).stdout
    assert "CPU time " in text and " ms a sample" in text


@needs_tools
def test_each_epochs_rate_and_steady_agree(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    out = subprocess.run([DLBENCH, "--synthetic", "96", "--workers", "2", "--batch", "16", "--size", "32",
                          "--epochs", "3", "--json"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    rates = got["epochs_samples_per_s"]
    assert len(rates) == 3 and all(r > 0 for r in rates)
    # The epochs' samples over their times, the first batch left out of both as steady leaves it out.
    per_epoch = got["samples"] // 3
    time = (per_epoch - 16) / rates[0] + per_epoch / rates[1] + per_epoch / rates[2]
    assert abs((got["samples"] - 16) / time - got["steady_samples_per_s"]) <= 0.02 * got["steady_samples_per_s"]
    text = subprocess.run([DLBENCH, "--synthetic", "96", "--workers", "2", "--batch", "16", "--size", "32",
                           "--epochs", "2"], capture_output=True, text=True, timeout=120, env=env).stdout
    assert "samples/s by epoch (the first after its first batch): " in text
    # Epochs of one batch: the first is all start-up (no rate), the next ones start where it ended.
    one = json.loads(subprocess.run([DLBENCH, "--synthetic", "16", "--workers", "2", "--batch", "16", "--size", "32",
                                     "--epochs", "4", "--json"], capture_output=True, text=True, timeout=120,
                                    env=env).stdout)
    rates = one["epochs_samples_per_s"]
    assert len(rates) == 4 and rates[0] == 0 and all(r > 0 for r in rates[1:])
    time = sum(16 / r for r in rates[1:])
    assert abs(48 / time - one["steady_samples_per_s"]) <= 0.02 * one["steady_samples_per_s"]


@needs_tools
def test_version_and_help():
    for tool, name in ((DLBENCH, "dlbench"), (DLSHARD, "dlshard")):
        assert run(tool, "--version").stdout.strip() == f"{name} (ringfeed) {ringfeed.version()}"
    help_text = run(DLBENCH, "--help").stdout
    for mode in ("auto", "uring", "pread", "mmap"):
        assert mode in help_text.split("--io")[1].splitlines()[0]


@needs_tools
def test_step_kernel_length_must_be_a_positive_number():
    for bad in ("0", "-1", "abc", "2ms"):
        out = run(DLBENCH, WDS, *SMALL, "--step-kernel-ms", bad, ok=False)
        assert out.returncode == 2 and f"--step-kernel-ms {bad}: a length in ms above 0" in out.stderr, out.stderr
    # A valid length without the consumer it shapes is refused too, not ignored.
    out = run(DLBENCH, WDS, *SMALL, "--step-kernel-ms", "1", ok=False)
    assert out.returncode == 2 and "--step-kernel-ms needs --step-ms" in out.stderr, out.stderr


@needs_tools
def test_counts_are_whole_numbers_and_the_synthetic_set_takes_no_source():
    for flag, bad, least in (("--stop-after", "-3", 0), ("--stop-after", "1.5", 0), ("--first-after", "-5", 0),
                             ("--first-after", "0.5", 0), ("--synthetic", "10abc", 1),
                             ("--synthetic", "0", 1), ("--quality", "9x", 1), ("--synthetic", "0x10", 1)):
        out = run(DLBENCH, *((WDS,) if flag in ("--stop-after", "--first-after") else ()), flag, bad,
                  "--make-synthetic", ok=False)
        assert out.returncode == 2 and f"{flag} {bad}: expected a whole number of at least {least}" in out.stderr
    for flags in (("--synthetic", "20"), ("--quality", "96"), ("--subsampling", "444"), ("--shared-tables",)):
        out = run(DLBENCH, WDS, *SMALL, *flags, ok=False)  # they would be ignored: refused instead
        assert out.returncode == 2 and "give them without a SOURCE" in out.stderr, out.stderr


@needs_tools
def test_first_after_takes_the_first_batch_that_late_and_the_same_batches():
    now = json.loads(run(DLBENCH, WDS, *SMALL, "--json", "--digest").stdout)
    late = json.loads(run(DLBENCH, WDS, *SMALL, "--json", "--digest", "--first-after", "600").stdout)
    assert now["first_batch_ms"] < 600 <= late["first_batch_ms"], (now["first_batch_ms"], late["first_batch_ms"])
    assert late["digest"] == now["digest"] and late["samples"] == now["samples"]


@needs_tools
def test_second_loader_reports_the_second_of_two_loaders_in_one_process(tmp_path):
    once = json.loads(run(DLBENCH, WDS, *SMALL, "--json", "--digest").stdout)
    second = json.loads(run(DLBENCH, WDS, *SMALL, "--json", "--digest", "--second-loader").stdout)
    assert second["digest"] == once["digest"] and second["samples"] == once["samples"]
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"not a tar" * 100)
    out = run(DLBENCH, bad, *SMALL, "--second-loader", ok=False)
    assert out.returncode == 1 and "the first loader: " in out.stderr and str(bad) in out.stderr, out.stderr


@needs_tools
def test_the_first_loader_runs_a_whole_epoch_and_says_where_it_failed(tmp_path):
    """A damaged image in an epoch's last batch fails the first loader (on_error=fail), named: so
    the first loader drew the whole epoch, as a training loop's first epoch does, not one batch."""
    late = tmp_path / "late.tar"
    with tarfile.open(WDS) as src, tarfile.open(late, "w") as t:
        members = [m for m in src.getmembers() if m.isfile()][:2 * 87]  # 87 samples, a .cls and a .png each
        for m in members:
            t.addfile(m, src.extractfile(m))
        for name, body in (("zz.cls", b"1\n"), ("zz.png", b"\x89PNG\r\n\x1a\n" + b"not a png" * 50)):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            t.addfile(info, io.BytesIO(body))
    flags = [*SMALL, "--option", "shuffle=0", "--option", "on_error=fail", "--epochs", "1"]
    out = run(DLBENCH, late, *flags, "--second-loader", ok=False)
    assert out.returncode == 1 and "the first loader: " in out.stderr and "zz.png" in out.stderr, out.stderr


def huffman_tables(jpeg):
    """The (class, id) of every Huffman table a JPEG's markers define before its scan."""
    tables, i = [], 2
    while i + 4 <= len(jpeg) and jpeg[i] == 0xFF and jpeg[i + 1] != 0xDA:
        length = int.from_bytes(jpeg[i + 2:i + 4], "big")
        j = i + 4
        while jpeg[i + 1] == 0xC4 and j < i + 2 + length:
            tables.append((jpeg[j] >> 4, jpeg[j] & 15))
            j += 17 + sum(jpeg[j + 1:j + 17])
        i += 2 + length
    return tables


@pytest.mark.skipif(not os.path.exists(DLBENCH), reason="dlbench not built")
def test_shared_tables_make_a_set_coded_with_one_set_of_huffman_tables(tmp_path):
    env = dict(os.environ, DL_SYNTHETIC_DIR=str(tmp_path))
    sets = {}
    for flags in ((), ("--shared-tables",)):
        out = subprocess.run([DLBENCH, "--make-synthetic", "--synthetic", "3", *flags], capture_output=True, text=True,
                             env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        with tarfile.open(out.stdout.split()[-1]) as t:
            sets[flags] = [huffman_tables(t.extractfile(m).read()) for m in t.getmembers() if m.name.endswith(".jpg")]
    assert len(sets[()]) == len(sets[("--shared-tables",)]) == 3
    assert all(sorted(t) == [(0, 0), (0, 1), (1, 0), (1, 1)] for t in sets[()])  # luma's and chroma's
    assert all(sorted(t) == [(0, 0), (1, 0)] for t in sets[("--shared-tables",)])  # one set for all


@needs_tools
def test_dlshard_flags_say_what_they_take(tmp_path):
    for flag, bad, said in (("--samples-per-shard", "10abc", "expected a whole number of at least 1"),
                            ("--samples-per-shard", "0", "expected a whole number of at least 1"),
                            ("--threads", "2x", "expected a whole number of at least 1"),
                            ("--align", "4096x", "expected a whole number of at least 1"),
                            ("--shard-size", "1Q", "expected a size above 0")):
        out = run(DLSHARD, "create", str(tmp_path / "o"), WDS, flag, bad, ok=False)
        assert out.returncode == 2 and f"dlshard: {flag} {bad}: {said}" in out.stderr, out.stderr
    out = run(DLSHARD, "create", str(tmp_path / "o"), WDS, "--shard-size", "1M", "--samples-per-shard", "5", ok=False)
    assert out.returncode == 2 and "not both" in out.stderr
    assert not list(tmp_path.iterdir())  # nothing written


@needs_tools
def test_dlshard_create_names_shards_an_earlier_longer_run_left(tmp_path):
    prefix = tmp_path / "o"
    first = run(DLSHARD, "create", prefix, WDS, "--samples-per-shard", "1")
    written = sorted(p.name for p in tmp_path.iterdir())
    assert len(written) >= 3 and "earlier run" not in first.stderr
    again = run(DLSHARD, "create", prefix, WDS, "--samples-per-shard", "1000")  # one shard now
    left = len(written) - 1
    assert (f"dlshard: {left} shards of an earlier run follow these, {prefix}-000001.rfs to "
            f"{prefix}-{left:06d}.rfs: a glob of {prefix}-*.rfs would read them too") in again.stderr, again.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == written  # named, not deleted


@needs_tools
def test_dlshard_ls_takes_its_flag_on_either_side():
    long = run(DLSHARD, "ls", WDS, "-v").stdout
    assert run(DLSHARD, "ls", "-v", WDS).stdout == long and len(long.splitlines()) > 1  # "-v: No such file"
    assert len(run(DLSHARD, "ls", WDS).stdout.splitlines()) < len(long.splitlines())
    for extra in (["-x", WDS], [WDS, "other.tar"], ["-v"]):  # a second shard was dropped in silence
        out = run(DLSHARD, "ls", *extra, ok=False)
        assert out.returncode == 2 and "usage" in out.stderr, extra


@needs_tools
def test_step_needs_a_positive_length_and_a_gpu():
    for bad in ("0", "-5", "abc", "5x", "inf", "0x10"):
        out = run(DLBENCH, WDS, *SMALL, "--step-ms", bad, ok=False)
        assert out.returncode == 2 and f"--step-ms {bad}: a length in ms above 0" in out.stderr, out.stderr
    # The consumer is a GPU's: on the CPU it would silently run no step at all.
    out = run(DLBENCH, WDS, *SMALL, "--step-ms", "5", "--device", "cpu", ok=False)
    assert out.returncode == 2 and "--step-ms runs a GPU consumer: it needs --device cuda:N (not cpu)" in out.stderr
    out = run(DLBENCH, WDS, *SMALL, "--step-ms", "5", ok=False)  # the default device is the CPU
    assert out.returncode == 2 and "needs --device cuda:N" in out.stderr, out.stderr


@needs_tools
def test_dlshard_takes_brace_ranges_and_globs(two_shards):
    out = run(DLSHARD, "index", f"{two_shards}/s-{{0..1}}.tar").stdout.splitlines()
    assert [line.split(":")[0] for line in out] == [str(two_shards / "s-0.tar"), str(two_shards / "s-1.tar")]
    out = run(DLSHARD, "verify", f"{two_shards}/s-*.tar").stdout
    assert "2 shards verified: ok" in out
    missing = run(DLSHARD, "index", f"{two_shards}/t-*.tar", ok=False)
    assert missing.returncode == 1 and "no file matches" in missing.stderr
    # A shard that is not there is named and counted apart from damaged records.
    out = run(DLSHARD, "verify", str(two_shards / "s-0.tar"), str(two_shards / "gone.tar"), ok=False)
    assert out.returncode == 1 and "gone.tar: No such file or directory" in out.stdout, out.stdout
    assert "1 shard verified: ok" in out.stdout and "1 shard could not be read" in out.stdout
    assert "bad record" not in out.stdout


@built
def test_dlshard_index_of_a_ringfeed_shard_says_it_carries_its_own(synthetic, tmp_path):
    run(DLSHARD, "create", str(tmp_path / "r"), synthetic)
    rfs = tmp_path / "r-000000.rfs"
    out = run(DLSHARD, "index", str(rfs), synthetic).stdout.splitlines()
    assert out[0] == f"{rfs}: 120 samples, in a ringfeed shard: its index is its own, nothing to build", out
    assert out[1].endswith(": 120 samples indexed"), out
    assert not os.path.exists(str(rfs) + ".rfidx")
    cut = tmp_path / "cut.rfs"
    cut.write_bytes(rfs.read_bytes()[:5000])
    out = run(DLSHARD, "index", str(cut), ok=False)
    assert out.returncode == 1 and f"{cut}: damaged ringfeed shard: trailer magic missing" in out.stderr, out.stderr


@needs_tools
def test_the_indexes_saved_beside_shards_are_left_out_of_a_folders_files(two_shards):
    run(DLSHARD, "index", f"{two_shards}/s-*.tar")
    assert (two_shards / "s-0.tar.rfidx").exists()
    per_shard = json.loads(run(DLBENCH, two_shards / "s-0.tar", *SMALL, "--json").stdout)["samples"]
    listed = sorted(str(p) for p in two_shards.iterdir())  # as the shell expands DIR/*
    assert len(listed) == 4
    for given in ([f"{two_shards}/*"], listed):
        out = run(DLSHARD, "verify", *given).stdout
        assert "2 shards verified: ok" in out, out
        both = run(DLBENCH, *given, *SMALL, "--json")
        assert json.loads(both.stdout)["samples"] == 2 * per_shard and "not a tar" not in both.stderr
    index = two_shards / "s-0.tar.rfidx"  # named alone: refused, naming its shard, never a pass
    said = f"{index} is the index saved beside shard {two_shards}/s-0.tar, not a shard"
    for tool in ([DLBENCH, index, *SMALL], [DLSHARD, "ls", index]):
        alone = run(*tool, ok=False)
        assert alone.returncode == 1 and said in alone.stderr, alone.stderr
    for command in ("verify", "index"):
        alone = run(DLSHARD, command, index, ok=False)
        assert alone.returncode == 1 and "no shard among the paths" in alone.stdout, alone.stdout


def raw_tar(path, n):
    """A tar of N samples of raw bytes with labels: what dlshard create keeps without an image codec."""
    with tarfile.open(path, "w") as t:
        for i in range(n):
            for ext, data in (("bin", bytes(range(256)) * 2), ("cls", f"{i}\n".encode())):
                info = tarfile.TarInfo(f"s{i}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))


@built
def test_dlshard_ls_fails_on_a_file_that_is_no_shard_or_a_damaged_one(tmp_path):
    good = tmp_path / "good.tar"
    raw_tar(good, 3)
    assert run(DLSHARD, "ls", good).stdout.startswith(f"{good}: tar, 3 samples")
    data = good.read_bytes()
    cut = tmp_path / "cut.tar"  # the third sample's first member cut short: listed to the damage, then failed
    cut.write_bytes(data[:4 * 1024 + 700])
    out = run(DLSHARD, "ls", "-v", cut, ok=False)
    assert out.returncode == 1 and out.stdout.startswith(f"{cut}: tar, 3 samples"), out
    assert out.stderr.count("\n") == 1, out.stderr  # said once, not also as a warning
    assert f"shard {cut}: member data runs past the end of the file at offset" in out.stderr, out.stderr
    for name, body, said in (("words.tar", b"hello\n" * 200, "not a tar archive (its first block is no tar header)"),
                             ("short.tar", b"hello\n", "trailing partial block at offset 0"),
                             ("zip.tar", b"PK\x03\x04" + bytes(1020), "a zip archive, not a tar")):
        bad = tmp_path / name
        bad.write_bytes(body)
        out = run(DLSHARD, "ls", bad, ok=False)  # was "tar, 0 samples" and status 0
        assert out.returncode == 1 and out.stdout == "" and f"shard {bad}: {said}" in out.stderr, out
    prefix = tmp_path / "made"
    run(DLSHARD, "create", prefix, good)
    rfs = tmp_path / "made-000000.rfs"
    assert run(DLSHARD, "ls", rfs).stdout.startswith(f"{rfs}: ringfeed shard v1, 3 records")
    rfs.write_bytes(rfs.read_bytes()[:5000])  # its index and trailer gone: damaged, not "no tar"
    out = run(DLSHARD, "ls", rfs, ok=False)
    assert out.returncode == 1 and f"{rfs}: damaged ringfeed shard: trailer magic missing" in out.stderr, out


@needs_tools
def test_thread_cpus_names_the_workers_and_passes_the_commands_output_and_exit(tmp_path):
    script = os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench", "thread_cpus.py")
    report = tmp_path / "cpus.json"
    out = subprocess.run([sys.executable, script, "--watch", "rf-worker-0", "--every-ms", "5", "--out", report, "--",
                          DLBENCH, WDS, *SMALL, "--epochs", "400", "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["samples"] == 400 * 90  # dlbench's own JSON, untouched
    r = json.loads(report.read_text())
    assert r["watch"] == "rf-worker-0" and 0 < r["runnable"] <= r["looks"]
    workers = {k: v for k, v in r["threads"].items() if k.startswith("rf-worker-")}
    assert set(workers) == {"rf-worker-0", "rf-worker-1"}
    assert all(v["cpu_ms"] > 0 and v["threads"] == 1 for v in workers.values())
    failed = subprocess.run([sys.executable, script, "--out", tmp_path / "x.json", "--", DLBENCH, "--workers", "0"],
                            capture_output=True, text=True, timeout=60)
    assert failed.returncode != 0 and (tmp_path / "x.json").exists()


@pytest.mark.parametrize("setting, said", [
    ({"ALTERNATE_ONLY": "1"}, "ALTERNATE_ONLY=1 needs ALTERNATE=N, the steps of a block"),
    ({"ALTERNATE": "25", "ALTERNATE_RUNS": "0"}, "ALTERNATE_RUNS=0: give a whole number of 1 or more"),
    ({"ALTERNATE": "x"}, "ALTERNATE=x: give a whole number of 1 or more"),
    ({"REPEAT": "2.5"}, "REPEAT=2.5: give a whole number of 1 or more"),
    ({"ORDER": "-1"}, "ORDER=-1: give a whole number of 0 or more"),
])
def test_train_comparison_refuses_a_count_it_cannot_run_before_running_anything(tmp_path, setting, said):
    """bench/train_fed_vs_held.sh runs on a GPU machine for many minutes: a count given wrong is said
    at once (its loops would otherwise end with a shell message and no run), and nothing is run."""
    script = os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench", "train_fed_vs_held.sh")
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items()
           if k not in ("ALTERNATE", "ALTERNATE_ONLY", "ALTERNATE_RUNS", "REPEAT", "ORDER")}
    r = subprocess.run(["sh", script, str(tmp_path / "none-*.tar"), str(out)], env={**env, **setting},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr == f"train_fed_vs_held: {said}\n", r
    assert list(out.iterdir()) == []  # no model run, no log
