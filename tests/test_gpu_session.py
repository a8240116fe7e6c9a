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
    assert "unknown step 'bogus' (install grid timeline op e2e nkvo profile gemma tests results)" in res.stderr
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


def _nsys_csvs(d: Path, cfg: str, S: int, steps: int, per_step: dict, api_per_step: dict, base: int):
    """Stats CSVs as nsys writes them (a notice line, quoted headers) for a run of `steps` decode
    steps: per_step kernels (name -> (ns, launches)) and API calls each step, plus `base` of a
    model load and fill that every run has."""
    which = "long" if steps > 4 else "short"
    kern = ['NOTICE: Existing SQLite export found: x.sqlite', '',
            '"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Name"']
    for name, (ns, n) in per_step.items():
        kern.append(f'1.0,{ns * steps + base},{n * steps + 3},1,1,1,1,0,"{name}"')
    (d / f"{cfg}_{S}_{which}_cuda_gpu_kern_sum.csv").write_text("\n".join(kern) + "\n")
    api = ['"Time (%)","Total Time (ns)","Num Calls","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Name"']
    for name, n in api_per_step.items():
        api.append(f'1.0,{1000 * n * steps},{n * steps + 7},1,1,1,1,0,"{name}"')
    (d / f"{cfg}_{S}_{which}_cuda_api_sum.csv").write_text("\n".join(api) + "\n")
    mem = ['"Time (%)","Total Time (ns)","Count","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Operation"',
           f'100.0,{500 * steps},{2 * steps},1,1,1,1,0,"[CUDA memcpy Host-to-Device]"']
    (d / f"{cfg}_{S}_{which}_cuda_gpu_mem_time_sum.csv").write_text("\n".join(mem) + "\n")


def test_timeline_reduces_nsys_stats_to_a_step(tmp_path):
    """bench/gpu_timeline.py --reduce: per step = (long run - short run) / extra steps, per layer
    by the layers; SparQ's kernels grouped, what it adds over dense named, and CUDA-graph capture
    told from the API counts (graph launches, no direct ones) against a step launched directly."""
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_timeline

    n_layer = 8
    dense = {"void flash_attn_ext_f16<128>(float*)": (8 * 50_000, 8), "mul_mat_vec_q<8>(...)": (8 * 90_000, 56),
             "k_set_rows<half>(...)": (8 * 2_000, 16)}
    sparq = {"void k_sparq_score<1, __half, 8>(sparq_cu_args)": (8 * 30_000, 8),
             "void k_sparq_select<false>(sparq_cu_args)": (8 * 10_000, 8),
             "void k_sparq_attend_part<1, __half, __half>(sparq_cu_args)": (8 * 5_000, 8),
             "mul_mat_vec_q<8>(...)": (8 * 90_000, 56), "k_set_rows<half>(...)": (8 * 4_000, 24),
             "k_bin_bcast<op_add>(...)": (8 * 1_500, 24)}
    for steps in (4, 20):
        _nsys_csvs(tmp_path, "dense_fa1", 4096, steps, dense, {"cudaGraphLaunch_v10000": 1}, 7_000_000)
        _nsys_csvs(tmp_path, "sparq", 4096, steps, sparq, {"cudaLaunchKernel_v7000": 128, "cudaStreamSynchronize": 8}, 9_000_000)
    res = gpu_timeline.reduce_dir(tmp_path, n_layer, 16)
    d, s = res["dense_fa1@4096"], res["sparq@4096"]
    assert abs(d["gpu_us_per_step"] - 8 * (50 + 90 + 2)) < 1e-6
    assert abs(s["sparq_op_launches_per_layer"] - 3) < 1e-9 and abs(s["launches_per_layer"] - 16) < 1e-9
    assert abs(s["groups"]["sparq op"]["us"] - 8 * 45) < 1e-6
    assert d["captured"] and not s["captured"] and s["syncs_per_step"] == 8
    md = gpu_timeline.markdown({"tag": "t", "n_short": 4, "n_long": 20}, res, n_layer)
    assert "| sparq | 4096 |" in md and "k_bin_bcast<op_add>" in md and "What sparq adds" in md
    assert "`k_sparq_score<1, __half, 8>`" in md  # names without the parameter list
    # the command-line entry point on the same folder
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_timeline.py"), "--reduce", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "captured" in out.stdout, out.stderr
