"""The README's examples, as a reader copies them: its Python loop (90 epochs with set_epoch) and
its C program run as written, on dlbench's synthetic set in place of the shards they name; and
docs/formats.md's shard written from Python."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import BUILD

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SHARDS = "train-{000000..000146}.tar"  # what the examples read; the synthetic set stands in


def blocks(language, page="README.md"):
    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    found = re.findall(rf"```{language}\n(.*?)```", text, re.S)
    assert found, f"no {language} example in {page}"
    return found


def test_the_python_example_trains_ninety_epochs(synthetic, tmp_path):
    pytest.importorskip("torch")
    (code,) = blocks("python")
    assert SHARDS in code and "range(90)" in code
    script = tmp_path / "example.py"
    script.write_text(code.replace(SHARDS, synthetic) +
                      "\nassert epoch == 89 and batch['epoch'] == 89 and loss.item() == loss.item()\nprint('trained')\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "bindings", "python"))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "trained", out.stdout + out.stderr


def test_the_c_example_reads_an_epoch(synthetic, tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    library = os.path.join(BUILD, "libringfeed.so")
    if not cc or not os.path.exists(library):
        pytest.skip("no C compiler, or the library is not built")
    (code,) = blocks("c")
    source = tmp_path / "example.c"
    source.write_text(code)
    binary = tmp_path / "example"
    build = subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-I", os.path.join(ROOT, "include"), str(source),
                            "-o", str(binary), "-L", BUILD, "-lringfeed", f"-Wl,-rpath,{BUILD}"],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    out = subprocess.run([str(binary), synthetic], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout == "120 samples\n", out.stdout + out.stderr
    missing = subprocess.run([str(binary), str(tmp_path / "none.tar")], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "none.tar" in missing.stderr


def test_the_writer_example_writes_a_shard_the_loader_reads_with_its_classes(tmp_path):
    pytest.importorskip("PIL")
    (code,) = blocks("python", "docs/formats.md")
    shard = str(tmp_path / "train-000000.rfs")
    assert '"train-000000.rfs"' in code
    dataset = ("from PIL import Image\n"
               "class Folder(list):\n"
               "    classes = ['ant', 'bee']\n"
               "dataset = Folder((Image.new('RGB', (40 + i, 30), (20 * i, 100, 200)), i % 2) for i in range(6))\n")
    check = ("\nbatch = next(iter(loader))\n"
             "assert loader.classes == ['ant', 'bee']\n"
             "assert sorted(int(y) for y in batch['label']) == [0, 0, 0, 1, 1, 1]\n"
             "assert tuple(batch['image'].shape) == (6, 224, 224, 3)\nprint('read')\n")
    script = tmp_path / "writer.py"
    script.write_text(dataset + code.replace('"train-000000.rfs"', repr(shard)) + check)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "bindings", "python"))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "read", out.stdout + out.stderr
