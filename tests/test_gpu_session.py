"""scripts/gpu_session.sh, the steps a borrowed GPU machine runs (docs/cuda.md): the parts that need
no GPU, checked here: the step names, the clear error without the wheels, and Gemma's parts joined
only when all of them are there and match their checksums."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_session.sh"


def run(tmp_path, *steps, **env):
    e = dict(os.environ, OUT=str(tmp_path / "out"), SPARQ_SITE=str(tmp_path / "site"),
             LLAMA_SPARQ_MODEL_DIR=str(tmp_path / "models"), **env)
    return subprocess.run(["bash", str(SCRIPT), *steps], capture_output=True, text=True, env=e, timeout=120)


def test_unknown_step_is_refused(tmp_path):
    res = run(tmp_path, "install", "bogus")
    assert res.returncode == 2
    assert "unknown step 'bogus' (install grid op e2e nkvo profile gemma tests results)" in res.stderr
    assert "install:" not in res.stdout  # refused before any step runs


def test_no_step_prints_the_usage(tmp_path):
    res = run(tmp_path)
    assert res.returncode == 2 and "Steps, in the order" in res.stdout


def test_a_step_without_the_wheels_says_how_to_make_them(tmp_path):
    res = run(tmp_path, "grid", GPU_WHEEL_DIR=str(tmp_path / "nowheels"), PATH="/usr/bin:/bin")
    assert res.returncode == 1
    assert "no wheels in" in res.stdout and "make gpu-wheel" in res.stdout
    assert (tmp_path / "out" / "gpu-session" / "session.log").is_file()


def _parts(tmp_path, n=3):
    data = np.random.default_rng(0).integers(0, 256, size=300_001, dtype=np.uint8).tobytes()
    d = tmp_path / "parts"
    d.mkdir()
    per = -(-len(data) // n)
    sums = []
    for i in range(n):
        chunk = data[i * per:(i + 1) * per]
        (d / f"part-{i:02d}").write_bytes(chunk)
        sums.append(f"{hashlib.sha256(chunk).hexdigest()}  part-{i:02d}")
    (d / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    (d / "FILE").write_text("model.gguf\n")
    return d, data


def test_gemma_parts_joined_once_all_are_there(tmp_path):
    d, data = _parts(tmp_path)
    last = d / "part-02"
    kept = last.read_bytes()
    last.unlink()
    res = run(tmp_path, "gemma", GPU_GEMMA_DIR=str(d))
    assert res.returncode == 0 and "2 of 3 parts here" in res.stdout, res.stdout + res.stderr
    assert not (tmp_path / "models" / "model.gguf").exists()
    last.write_bytes(kept)
    res = run(tmp_path, "gemma", GPU_GEMMA_DIR=str(d))
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "models" / "model.gguf").read_bytes() == data


def test_a_damaged_part_is_not_joined(tmp_path):
    d, _ = _parts(tmp_path)
    b = bytearray((d / "part-01").read_bytes())
    b[7] ^= 1
    (d / "part-01").write_bytes(bytes(b))
    res = run(tmp_path, "gemma", GPU_GEMMA_DIR=str(d))
    assert res.returncode == 1 and "a part differs from SHA256SUMS" in res.stdout, res.stdout + res.stderr
    assert not (tmp_path / "models" / "model.gguf").exists()
