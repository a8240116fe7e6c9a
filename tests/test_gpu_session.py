"""scripts/gpu_session.sh, the steps a borrowed GPU machine runs (docs/cuda.md): the parts that need
no GPU, checked here: the step names, the clear error without the wheels, and Gemma's parts joined
only when all of them are there and match their checksums."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_session.sh"
sys.path.insert(0, str(ROOT / "bench"))  # the sweep's and the profilers' modules


def run(tmp_path, *steps, **env):
    e = dict(os.environ, OUT=str(tmp_path / "out"), SPARQ_SITE=str(tmp_path / "site"),
             LLAMA_SPARQ_MODEL_DIR=str(tmp_path / "models"), **env)
    return subprocess.run(["bash", str(SCRIPT), *steps], capture_output=True, text=True, env=e, timeout=120)


def test_unknown_step_is_refused(tmp_path):
    res = run(tmp_path, "install", "bogus")
    assert res.returncode == 2
    assert "unknown step 'bogus' (install grid timeline op e2e ab calib nkvo profile lines gemma tests results)" in res.stderr
    assert "install:" not in res.stdout  # refused before any step runs


def test_a_malformed_ab_setting_is_refused_before_any_step(tmp_path):
    res = run(tmp_path, "install", "ab", AB_ENVS="LLAMA_SPARQ_CUDA_SELECT_HIST=atomic;ATTEND_ITEMS=16")
    assert res.returncode == 2
    assert "AB_ENVS: 'ATTEND_ITEMS=16' is not LLAMA_SPARQ_CUDA_<NAME>=<value>" in res.stderr
    assert "install:" not in res.stdout


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
    """bench/gpu.py timeline --reduce: per step = (long run - short run) / extra steps, per layer
    by the layers; SparQ's kernels grouped, what it adds over dense named, and CUDA-graph capture
    told from the API counts (graph launches, no direct ones) against a step launched directly."""
    import gpu

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
    res = gpu.timeline_reduce_dir(tmp_path, n_layer, 16)
    d, s = res["dense_fa1@4096"], res["sparq@4096"]
    assert abs(d["gpu_us_per_step"] - 8 * (50 + 90 + 2)) < 1e-6
    assert abs(s["sparq_op_launches_per_layer"] - 3) < 1e-9 and abs(s["launches_per_layer"] - 16) < 1e-9
    assert abs(s["groups"]["sparq op"]["us"] - 8 * 45) < 1e-6
    assert d["captured"] and not s["captured"] and s["syncs_per_step"] == 8
    md = gpu.timeline_markdown({"tag": "t", "n_short": 4, "n_long": 20}, res, n_layer)
    assert "| sparq | 4096 |" in md and "k_bin_bcast<op_add>" in md and "What sparq adds" in md
    assert "`k_sparq_score<1, __half, 8>`" in md  # names without the parameter list
    # the command-line entry point on the same folder
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "timeline", "--reduce", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "captured" in out.stdout, out.stderr


def test_timeline_idle_time_from_the_tracer_and_llama_bench(tmp_path):
    """With the CUPTI tracer's busy files and llama-bench's JSON: the step's wall time against the
    GPU's busy time (long run less short run, per extra step), the difference being idle time."""
    import json

    import gpu

    kern = {"void k_sparq_score<1, __half, 8>(sparq_cu_args)": (8 * 30_000, 8)}
    for steps in (4, 20):
        _nsys_csvs(tmp_path, "sparq", 65536, steps, kern, {"cudaGraphLaunch": 1}, 5_000_000)
        which = "long" if steps > 4 else "short"
        # busy: 300 us per step plus a fixed 5 ms
        (tmp_path / f"sparq_65536_{which}_busy.csv").write_text(f"busy_ns,span_ns,intervals\n{300_000 * steps + 5_000_000},1,1\n")
    (tmp_path / "sparq_65536_long_bench.json").write_text(json.dumps([{"n_prompt": 0, "n_gen": 20, "avg_ns": 20 * 450_000}]))
    r = gpu.timeline_reduce_dir(tmp_path, 8, 16)["sparq@65536"]
    assert abs(r["busy_us_per_step"] - 300) < 1e-6 and abs(r["wall_us_per_step"] - 450) < 1e-6
    assert abs(r["idle_us_per_step"] - 150) < 1e-6 and r["captured"]
    md = gpu.timeline_markdown({"tag": "t", "n_short": 4, "n_long": 20, "tracer": "CUPTI"}, {"sparq@65536": r}, 8)
    assert "| sparq | 65536 | 450.0 | 300.0 | 150.0 |" in md
    # without the tracer's files (nsys): no figure made up
    (tmp_path / "sparq_65536_short_busy.csv").unlink()
    r = gpu.timeline_reduce_dir(tmp_path, 8, 16)["sparq@65536"]
    assert r["busy_us_per_step"] is None and r["idle_us_per_step"] is None


def test_cupti_tracer_builds_and_says_why_it_records_nothing_without_a_gpu(tmp_path):
    """make gpu-tracer builds the CUPTI tracer; loaded the way the CUDA driver loads it
    (InitializeInjection) on a machine without a GPU, it says what failed and writes no summary
    (a table of zeros would read as 'no kernels ran')."""
    import shutil

    if not Path("/usr/local/cuda/include/cupti.h").is_file():
        import pytest

        pytest.skip("no CUDA toolkit with CUPTI here")
    out = tmp_path / "w"
    res = subprocess.run(["make", "-s", "-C", str(ROOT), "gpu-tracer", f"GPU_WHEEL_DIR={out}"], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    lib = out / "libsparq_cupti_trace.so"
    assert lib.is_file() and list(out.glob("libcupti.so*"))
    cc = shutil.which("cc") or shutil.which("gcc")
    src = tmp_path / "load.c"
    src.write_text('#include <dlfcn.h>\n#include <stdio.h>\nint main(int c, char **v) {\n'
                   '  void *h = dlopen(v[1], RTLD_NOW); if (!h) { puts(dlerror()); return 1; }\n'
                   '  int (*f)(void) = (int (*)(void)) dlsym(h, "InitializeInjection"); return f ? !f() : 2; }\n')
    exe = tmp_path / "load"
    subprocess.run([cc, str(src), "-o", str(exe), "-ldl"], check=True, timeout=120)
    run = subprocess.run([str(exe), str(lib)], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, SPARQ_TRACE_PREFIX=str(tmp_path / "trace")))
    assert run.returncode == 0, run.stdout + run.stderr
    if "cuptiActivityEnable failed" in run.stderr:  # no GPU here
        assert not list(tmp_path.glob("trace_*.csv"))


def test_session_deadline_skips_steps_and_results_are_packed(tmp_path):
    """SESSION_SECONDS (or SESSION_END): a step with under 20 s of it left is skipped (said, not run), and GPU_PACK=1
    leaves one archive under $OUT with the logs and results in it."""
    import tarfile

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    res = run(tmp_path, "install", GPU_WHEEL_DIR=str(wheels), SESSION_SECONDS="0", GPU_PACK="1")
    # no wheels: install says so before any logged command; nothing else ran
    assert res.returncode != 0 and "no wheels" in res.stdout
    (wheels / "x.whl").write_text("")
    res = run(tmp_path, "install", GPU_WHEEL_DIR=str(wheels), SESSION_SECONDS="0", GPU_PACK="1")
    import re

    assert re.search(r"install: skipped, -?\d+s of the session left", res.stdout), res.stdout
    out = tmp_path / "out"
    # each run packed its own archive; the second did not replace the first
    assert sorted(p.name for p in out.iterdir()) == ["gpu-session-2.tar.gz", "gpu-session.tar.gz"]
    with tarfile.open(out / "gpu-session-2.tar.gz") as t:
        names = t.getnames()
    assert "gpu-session/session.log" in names and "results" in names
    with tarfile.open(out / "gpu-session.tar.gz") as t:
        first = t.extractfile("gpu-session/session.log").read().decode()
    assert "no wheels" in first and "skipped" not in first


def test_packed_wheels_are_unpacked_by_install(tmp_path):
    """make gpu-wheel's archive (scripts/gpu_wheel_pack.py: the wheels re-stored without compression,
    then xz) is what a call carries; install unpacks it where the wheel folder holds no wheel, and the
    wheel comes out with the same members, stored."""
    import tarfile
    import zipfile

    src = tmp_path / "built"
    src.mkdir()
    payload = np.random.default_rng(0).integers(0, 4, size=3 << 20, dtype=np.uint8).tobytes()
    with zipfile.ZipFile(src / "x-0.1-py3-none-any.whl", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("x/lib.so", payload)
        z.writestr("x/__init__.py", "")
    (src / "COMMIT").write_text("abc\n")
    packed = tmp_path / "carry" / "wheel.tar.xz"
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_wheel_pack.py"), "--wheels", str(src),
                          "--out", str(packed)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    with tarfile.open(packed) as t:
        assert sorted(t.getnames()) == ["COMMIT", "x-0.1-py3-none-any.whl"]
    wheels = tmp_path / "wheels"
    res = run(tmp_path, "install", GPU_WHEEL_DIR=str(wheels), GPU_WHEEL_XZ=str(packed), PATH="/usr/bin:/bin")
    assert f"install: unpacked {packed}" in res.stdout, res.stdout
    with zipfile.ZipFile(wheels / "x-0.1-py3-none-any.whl") as z:
        assert z.read("x/lib.so") == payload
        assert all(i.compress_type == zipfile.ZIP_STORED for i in z.infolist())
    assert (wheels / "COMMIT").read_text() == "abc\n"
    # without the archive, the error names both ways to carry the wheels
    res = run(tmp_path, "install", GPU_WHEEL_DIR=str(tmp_path / "none"), PATH="/usr/bin:/bin")
    assert "no wheels in" in res.stdout and "make gpu-wheel" in res.stdout


def test_ncu_lines_reduces_details_and_source_pages(tmp_path):
    """bench/gpu.py lines --reduce: Nsight Compute's details page gives each kernel's duration,
    SMs' active share and occupancy; its source page (several file blocks per kernel, a source row
    followed by its SASS rows) gives the source lines with the most warp samples, summed over the
    SASS rows' blocks, per kernel."""
    import gpu

    hdr = '"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"'
    rows = [hdr]
    for k, dur, el, act in (("void k_sparq_select<(bool)0>(sparq_cu_args)", "80.10", "120,000", "30,000"),
                            ("void k_sparq_score<1, __half, 8>(sparq_cu_args)", "52.00", "78,000", "70,200")):
        for m, u, v in (("Duration", "us", dur), ("Elapsed Cycles", "cycle", el), ("SM Active Cycles", "cycle", act),
                        ("Registers Per Thread", "register/thread", "80"), ("Theoretical Occupancy", "%", "37.50"),
                        ("Achieved Occupancy", "%", "20.00"), ("Grid Size", "", "544"), ("Block Size", "", "256")):
            rows.append(f'"0","{k}","s","{m}","{u}","{v}"')
    (tmp_path / "details_65536.csv").write_text("\n".join(rows) + "\n")
    src = ['"File Path","/x/ggml-sparq/cuda/sparq-cuda-select.cuh"',
           '"Function Name","void k_sparq_select<(bool)0>(sparq_cu_args)"',
           '"Line No","Source","Address","Source","Warp Stall Sampling (All Samples)"',
           '"54","if (choose && s < ri.w0) {","-","-","70"', '"","","0x1","  ISETP","40"', '"","","0x2","  BRA","30"',
           '"57","take = true;","-","-","10"',
           '"File Path","/x/ggml-sparq/cuda/sparq-cuda-common.cuh"',
           '"Function Name","void k_sparq_select<(bool)0>(sparq_cu_args)"',
           '"Line No","Source","Address","Source","Warp Stall Sampling (All Samples)"',
           '"349","return __ldcg(a.wbits);","-","-","120"',
           '"File Path","/x/ggml-sparq/cuda/sparq-cuda-score.cuh"',
           '"Function Name","void k_sparq_score<1, __half, 8>(sparq_cu_args)"',
           '"Line No","Source","Address","Source","Warp Stall Sampling (All Samples)"',
           '"150","acc = fmaf(q, v, acc);","-","-","5"']
    (tmp_path / "source_65536.csv").write_text("\n".join(src) + "\n")
    res = gpu.lines_reduce_dir(tmp_path)
    sel = res["65536"]["source"]["k_sparq_select<0>"]
    assert sel["samples"] == 200 and [e["where"] for e in sel["lines"]] == [
        "sparq-cuda-common.cuh:349", "sparq-cuda-select.cuh:54", "sparq-cuda-select.cuh:57"]
    assert res["65536"]["details"]["k_sparq_score<1, __half, 8>"]["Duration"]["value"] == "52.00"
    md = gpu.lines_markdown({"tag": "t"}, res)
    assert "| `k_sparq_select<0>` | 80.10 us | 25 % | 544 | 80 | 37.50 % / 20.00 % |" in md
    assert "| 60.0 % | sparq-cuda-common.cuh:349 |" in md and "| 90 % |" in md


def test_gpu_sweep_report_names_the_cuda_launch_settings(tmp_path, monkeypatch):
    """A run with LLAMA_SPARQ_CUDA_* set (one side of an A/B, e.g. LLAMA_SPARQ_CUDA_ATTEND_ITEMS=16)
    records them, and the report says which way the kernels ran; a run without them says nothing."""
    import json

    import gpu

    monkeypatch.setenv("LLAMA_SPARQ_CUDA_ATTEND_ITEMS", "16")
    monkeypatch.setenv("LLAMA_SPARQ_CUDA_SELECT", "")
    assert gpu.cuda_env() == {"LLAMA_SPARQ_CUDA_ATTEND_ITEMS": "16"}
    doc = json.loads((ROOT / "bench" / "results" / "gpu_e2e_h200_49b147f_b1.json").read_text())
    monkeypatch.setattr(gpu, "OUT", tmp_path)
    for tag, env in (("ab", gpu.cuda_env()), ("plain", {})):
        doc["meta"]["cuda_env"] = env
        (tmp_path / f"gpu_e2e_{tag}.json").write_text(json.dumps(doc))
        gpu.report(tag)
    assert "`LLAMA_SPARQ_CUDA_ATTEND_ITEMS=16`" in (tmp_path / "gpu_ab.md").read_text()
    plain = (tmp_path / "gpu_plain.md").read_text()
    assert "set from the environment" not in plain and "| 131072 |" in plain


def test_ab_runs_the_batch1_rows_once_per_setting(tmp_path):
    """The ab step: per AB_ENVS setting (one or more variables joined by ','), the SPARQ_ATTN grid on
    CUDA0 with it set (AB_CHECK, on by default), then one e2e run with it set and its own tag (a
    stand-in Python prints what it was given; the package counted as installed). The default times
    the programmatic launches and the score tiles' histogram, alone and together, against the
    default kernels (PDL=0) in the same session, then the kernels' other ways and the one launch per
    layer (FUSED=1); then the rows once per AB_BUCKETS count with the bucketed top-k (no grid of
    its own: the grid has bucketed cases), and once per AB_KT_BITS width at its default r."""
    (tmp_path / "site" / "llama_sparq").mkdir(parents=True)
    (tmp_path / "site" / "llama_sparq" / "__init__.py").write_text("")
    py = tmp_path / "py"
    py.write_text('#!/bin/sh\necho "RAN $* HIST=${LLAMA_SPARQ_CUDA_SELECT_HIST:-} LOADS=${LLAMA_SPARQ_CUDA_SELECT_LOADS:-} '
                  'ITEMS=${LLAMA_SPARQ_CUDA_ATTEND_ITEMS:-} PDL=${LLAMA_SPARQ_CUDA_PDL:-} '
                  'SCORE=${LLAMA_SPARQ_CUDA_SCORE_HIST:-} FUSED=${LLAMA_SPARQ_CUDA_FUSED:-} '
                  'CALIB=${LLAMA_SPARQ_CUDA_CALIB_HIST:-}"\n')
    py.chmod(0o755)
    res = run(tmp_path, "ab", SPARQ_PYTHON=str(py), GPU_TAG="h0_abc", AB_DEPTHS="4096")
    assert res.returncode == 0, res.stdout + res.stderr
    ran = [line for line in res.stdout.splitlines() if line.startswith("RAN ")]
    e2e = [r for r in ran if "--only e2e" in r]
    checks = [r for r in ran if "-k backend_ops_cuda_equals_cpu" in r]
    assert len(e2e) == 12 and len(checks) == 9 and len(ran) == 21, res.stdout
    assert ran[0] in checks and ran[1] in e2e and ran[0].endswith("PDL=0 SCORE= FUSED= CALIB="), ran
    assert "--tag h0_abc_ab_pdl_0 --depths 4096 " in e2e[0] and e2e[0].endswith("ITEMS= PDL=0 SCORE= FUSED= CALIB="), e2e
    assert "--tag h0_abc_ab_pdl_1 --depths 4096 " in e2e[1] and e2e[1].endswith("PDL=1 SCORE= FUSED= CALIB="), e2e
    assert "--tag h0_abc_ab_score_hist_1 --depths 4096 " in e2e[2] and e2e[2].endswith("PDL= SCORE=1 FUSED= CALIB="), e2e
    assert "--tag h0_abc_ab_pdl_1_score_hist_1 --depths 4096 " in e2e[3], e2e
    assert e2e[3].endswith("PDL=1 SCORE=1 FUSED= CALIB="), e2e
    assert checks[3].endswith("PDL=1 SCORE=1 FUSED= CALIB="), checks
    assert "--tag h0_abc_ab_select_hist_atomic --depths 4096 " in e2e[4], e2e
    assert "HIST=atomic LOADS= ITEMS= PDL= SCORE= FUSED= CALIB=" in e2e[4], e2e
    assert "--tag h0_abc_ab_select_loads_early --depths 4096 " in e2e[5] and "HIST= LOADS=early ITEMS= " in e2e[5], e2e
    assert "--tag h0_abc_ab_attend_items_16 --depths 4096 " in e2e[6] and "HIST= LOADS= ITEMS=16 " in e2e[6], e2e
    assert "--tag h0_abc_ab_fused_1 --depths 4096 " in e2e[7] and e2e[7].endswith("PDL= SCORE= FUSED=1 CALIB="), e2e
    assert "--tag h0_abc_ab_calib_hist_1 --depths 4096 " in e2e[8] and e2e[8].endswith("SCORE= FUSED= CALIB=1"), e2e
    assert checks[8].endswith("SCORE= FUSED= CALIB=1"), checks
    assert "--tag h0_abc_ab_topk_buckets_1024 --topk-buckets 1024 --depths 4096 " in e2e[9], e2e
    assert e2e[9].endswith("PDL= SCORE= FUSED= CALIB="), e2e
    assert "--tag h0_abc_ab_kt4 --kt-bits 4 --r 0 --depths 4096 " in e2e[10], e2e
    assert "--tag h0_abc_ab_kt8 --kt-bits 8 --r 0 --depths 4096 " in e2e[11], e2e
    import gpu

    # r = 0: each width's default r at the paper shape's head size, as the fork resolves it
    assert (gpu.resolve_r(0, 4), gpu.resolve_r(0, 8), gpu.resolve_r(0, 16), gpu.resolve_r(32, 4)) == (48, 40, 32, 32)
    assert all("--depths-batch  --nkvo-depths " in r for r in e2e), e2e
    # without the checks, one run per setting
    res = run(tmp_path, "ab", SPARQ_PYTHON=str(py), GPU_TAG="h0_abc", AB_DEPTHS="4096", AB_CHECK="0",
              AB_ENVS="LLAMA_SPARQ_CUDA_PDL=1", AB_BUCKETS="", AB_KT_BITS="")
    ran = [line for line in res.stdout.splitlines() if line.startswith("RAN ")]
    assert res.returncode == 0 and len(ran) == 1 and "--only e2e" in ran[0], ran
    assert ran[0].endswith("PDL=1 SCORE= FUSED= CALIB="), ran
    res = run(tmp_path, "ab", SPARQ_PYTHON=str(py), GPU_TAG="h0_abc", AB_CHECK="0", AB_ENVS="LLAMA_SPARQ_CUDA_PDL=1",
              AB_BUCKETS="", AB_KT_BITS="5")
    assert res.returncode != 0 and "AB_KT_BITS: '5' is not 4, 8 or 16" in res.stdout + res.stderr, res.stdout


def test_calib_times_the_calibrated_k_with_the_default_and_the_experimental_kernels(tmp_path):
    """The calib step: the calibrated k's batch-1 rows (dense -fa 1 beside them) with the default
    kernels (LLAMA_SPARQ_CUDA_CALIB_HIST=0) and the calibrated k's histogram from the score tiles
    (CALIB_HIST=1), each under its own tag; CALIB_ENVS replaces them."""
    (tmp_path / "site" / "llama_sparq").mkdir(parents=True)
    (tmp_path / "site" / "llama_sparq" / "__init__.py").write_text("")
    py = tmp_path / "py"
    py.write_text('#!/bin/sh\necho "RAN $* DIFFUSE=${LLAMA_SPARQ_CUDA_DIFFUSE:-} CALIB=${LLAMA_SPARQ_CUDA_CALIB_HIST:-}"\n')
    py.chmod(0o755)
    res = run(tmp_path, "calib", SPARQ_PYTHON=str(py), GPU_TAG="h0_abc")
    assert res.returncode == 0, res.stdout + res.stderr
    ran = [line for line in res.stdout.splitlines() if line.startswith("RAN ")]
    assert len(ran) == 2, res.stdout
    assert "--tag h0_abc_calib_calib_hist_0 --depths 65536 " in ran[0] and ran[0].endswith("DIFFUSE= CALIB=0"), ran
    assert "--tag h0_abc_calib_calib_hist_1 --depths 65536 " in ran[1] and ran[1].endswith("DIFFUSE= CALIB=1"), ran
    assert all("--only e2e" in r and " --k 0 --l -1 " in r and "--n-gen 64" in r for r in ran), ran
    res = run(tmp_path, "calib", SPARQ_PYTHON=str(py), GPU_TAG="h0_abc", CALIB_ENVS="LLAMA_SPARQ_CUDA_DIFFUSE=1")
    ran = [line for line in res.stdout.splitlines() if line.startswith("RAN ")]
    assert res.returncode == 0 and len(ran) == 1 and "--tag h0_abc_calib_diffuse_1 " in ran[0], res.stdout
    assert ran[0].endswith("DIFFUSE=1 CALIB="), ran
    res = run(tmp_path, "calib", SPARQ_PYTHON=str(py), GPU_TAG="h0_abc", CALIB_ENVS="DIFFUSE=1")
    assert res.returncode != 0 and "CALIB_ENVS: 'DIFFUSE=1' is not LLAMA_SPARQ_CUDA_<NAME>=<value>" in res.stderr


def test_gpu_counters_keep_the_diffuse_calls_and_the_reports():
    """The fork's exit log, as the sweep reads it: the diffuse stretches' calls among the dense ones
    and the calls the op reported (a GPU's op reports too)."""
    import gpu

    log = ("llama_sparq: counters: SparQ calls = 40, dense calls = 88 (diffuse 88), compression = 0.5000, "
           "rebuilds = 0, SparQ calls on a device (GPU, RPC host) = 40\n"
           "llama_sparq: the op reported 40 calls: 812.5 cells attended per KV head and step, 0.901 of the "
           "estimated attention mass (mean)\n")
    c = gpu.counters(log)
    assert c["sparq_calls"] == 40 and c["dense_calls"] == 88 and c["diffuse_calls"] == 88
    assert c["reported_calls"] == 40 and abs(c["reported_mean_cells"] - 812.5) < 1e-9
    c = gpu.counters(log.splitlines()[0].replace(" (diffuse 88)", ""))
    assert c["diffuse_calls"] == 0 and c["reported_calls"] == 0 and c["reported_mean_cells"] is None
