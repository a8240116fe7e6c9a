"""The benchmark harnesses of bench/ run end to end on a tiny model and write complete
result files (the timings themselves are not tested: speed is shown by the benchmarks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llama_sparq import tool_path

REPO = Path(__file__).resolve().parents[1]


def harness(command, *args, env=None, timeout=900):
    """Run `bench/<driver> <subcommand>` (command: "sweep.py e2e") with args; it must succeed."""
    e = dict(os.environ, **(env or {}))
    script, *sub = command.split()
    p = subprocess.run([sys.executable, str(REPO / "bench" / script), *sub, *map(str, args)], capture_output=True,
                       text=True, timeout=timeout, env=e, cwd=REPO)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return p


# tiny_model: 2 layers, 4 heads of 16, MHA
TINY = {"HEAD_DIM": "16", "N_HEAD_KV": "4", "N_LAYER_SPARQ": "2"}


def test_e2e_bench_writes_results(tiny_model, tmp_path):
    harness("sweep.py e2e", "--model", tiny_model, "--fill", "synthetic", "--depths", "0,256,512", "--reps", "2",
            "--n-gen", "2", "--r", "4", "--k", "16", "--l", "4", "--tag", "t", "--out-dir", tmp_path, env=TINY)
    for ext in ("csv", "json", "md", "png"):
        assert (tmp_path / f"t.{ext}").stat().st_size > 0
    res = json.loads((tmp_path / "t.json").read_text())
    meta, rows = res["meta"], res["rows"]
    for key in ("command", "machine", "commit", "sparq", "fill", "fits", "counters", "llama_bench_commands"):
        assert meta[key], key
    assert "r=4, k=16, l=4" in meta["sparq"] and "threads" in meta["machine"]
    assert [r["S"] for r in rows] == [0, 256, 512]
    for r in rows:
        assert r["sparq_calls"] > 0 and r["sparq_dense_calls"] == 0
        assert r["baseline"] in ("dense_fa0", "dense_fa1")
        assert r["speedup"] > 0 and 0 <= r["z"] <= 1 and r["amdahl_bound"] >= 1
        assert len(r["samples"]["sparq"]) == 4 and len(r["samples"]["dense_fa0"]) == 2
    assert 0 < rows[-1]["compression"] < 1
    # the fill really was synthetic, and every command is on record
    assert all("--depth-fill synthetic" in c for c in meta["llama_bench_commands"] if "-d 0 " not in c)
    md = (tmp_path / "t.md").read_text()
    assert "| S | dense ms/token (path) |" in md and "paper, Llama 2 7B" in md


def test_e2e_fill_check(tiny_model, tmp_path):
    harness("sweep.py e2e", "--model", tiny_model, "--fill-check", "300", "--reps", "2", "--n-gen", "2",
            "--r", "4", "--k", "16", "--l", "4", "--tag", "t", "--out-dir", tmp_path, env=TINY)
    res = json.loads((tmp_path / "t_fill_check.json").read_text())
    assert set(res["summary"]) == {"dense_fa0", "dense_fa1", "sparq"}
    for s in res["summary"].values():
        assert s["prefill_s"] > 0 and s["synthetic_s"] > 0
    fills = {r["depth_fill"] for r in res["llama_bench"]}
    assert fills == {"prefill", "synthetic"}


def test_overhead_bench_writes_results(tiny_model, tmp_path):
    harness("sweep.py overhead", "--model", tiny_model, "--prompts", "64", "--depths", "0,100", "--n-gen", "4",
            "--reps", "2", "--rounds", "1", "--tag", "o", "--out-dir", tmp_path)
    res = json.loads((tmp_path / "o.json").read_text())
    tests = {r["test"]: r for r in res["rows"]}
    assert set(tests) == {"pp64", "tg4 @ d0", "tg4 @ d100"}
    for t, r in tests.items():
        assert r["sparq_ts"] > 0 and r["dense_fa1_ts"] > 0 and r["dense_fa0_ts"] > 0
        assert r["ratio_ci95"][0] <= r["ratio"] <= r["ratio_ci95"][1]
        # below the dense threshold (1024 cells) SparQ never runs
        assert r["sparq_calls"] == 0 and r["sparq_dense"] > 0, t
    assert "verdict" in (tmp_path / "o.md").read_text()


def test_depth_fill_flag(tiny_model):
    exe = str(tool_path("llama-bench"))
    p = subprocess.run([exe, "-m", tiny_model, "-d", "10", "--depth-fill", "nope"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0 and "--depth-fill: 'nope' is not allowed (prefill or synthetic)" in p.stderr
    p = subprocess.run([exe, "-m", tiny_model, "-p", "0", "-n", "2", "-r", "1", "-d", "200", "-fa", "1",
                        "--depth-fill", "synthetic", "--sparq", "1", "--sparq-min-kv", "0",
                        # a fixed k: the calibrated k finds the tiny random model diffuse and attends densely
                        "--sparq-k", "32", "-o", "json"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    (row,) = json.loads(p.stdout)
    assert row["n_depth"] == 200 and row["sparq_calls"] > 0 and row["sparq_dense"] == 0


@pytest.mark.parametrize("fill", ["prefill", "synthetic"])
def test_bench_counters_cover_timed_runs_only(tiny_model, fill):
    """llama-bench's SparQ counters count the timed decode steps: layers x tokens x reps,
    not the warm-up step (at an empty cache) or the prefill of -d."""
    exe = str(tool_path("llama-bench"))
    p = subprocess.run([exe, "-m", tiny_model, "-p", "0", "-n", "8", "-r", "3", "-d", "300", "-fa", "1",
                        "--depth-fill", fill, "--sparq", "1", "--sparq-r", "4", "--sparq-k", "32",
                        "--sparq-kt-bits", "16", "--sparq-min-kv", "0", "-o", "json"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    (row,) = json.loads(p.stdout)
    assert row["sparq_calls"] == 2 * 8 * 3 and row["sparq_dense"] == 0
    # the mean compression of steps at 301..308 cells (d = 16, f16 K^T): (S*r + 2*k*d + 4*d) / (2*S*d + 2*d)
    want = sum((S * 4 + 2 * 32 * 16 + 4 * 16) / (2 * S * 16 + 2 * 16) for S in range(301, 309)) / 8
    assert abs(row["sparq_compr"] - want) < 1e-3


@pytest.mark.real_model
def test_depth_fill_covers_sliding_window_models(gemma_model):
    """Gemma 3's sliding-window layers keep their own cache: the fill gives it the last positions,
    and SparQ runs on the 3 global layers of every decoded token."""
    p = subprocess.run([str(tool_path("llama-bench")), "-m", str(gemma_model), "-p", "0", "-n", "2", "-r", "1",
                        "-d", "1000", "--depth-fill", "synthetic", "-fa", "1", "--sparq", "1", "--sparq-min-kv", "0",
                        "-o", "json"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    (row,) = json.loads(p.stdout)
    assert row["sparq_calls"] == 3 * 2, row


def test_real_text_speed_writes_results(tiny_model, tmp_path):
    """bench/real_text.py speed on the tiny model (Python's documentation tokenizes by bytes
    there): every mode timed (dense -fa 1 and -fa 0, SparQ), SparQ's counters over its reps, the
    files written."""
    harness("real_text.py speed", "--model", tiny_model, "--tokens", "1100", "--n-gen", "4", "--reps", "2",
            "--cache-types", "f16", "--kt-bits", "16,8", "--tag", "t", "--out-dir", tmp_path, env=TINY)
    res = json.loads((tmp_path / "t.json").read_text())
    r = res["result"]
    assert r["prompt_tokens"] == 1100
    assert {m: len(v) for m, v in r["tokens_per_s"].items()} == {"dense_f16_fa1": 2, "dense_f16_fa0": 2, "sparq_f16": 2,
                                                                   "sparq_f16_kt8": 2}
    assert r["modes"]["sparq_f16_kt8"]["kt_bits"] == 8 and r["counters"]["sparq_f16_kt8"]["sparq_calls"] > 0
    assert r["fastest_dense"] in ("dense_f16_fa1", "dense_f16_fa0")
    assert set(r["speedup"]["sparq_f16"]) == {"vs_fastest_dense", "vs_dense_f16_fa1", "vs_dense_f16_fa0"}
    assert r["speedup"]["sparq_f16"]["vs_fastest_dense"] > 0
    # every SparQ step of the 2 layers ran SparQ
    c = r["counters"]["sparq_f16"]
    assert c["n_layers"] == 2
    assert c["sparq_calls"] == 2 * 2 * 4, c
    assert 0 < c["compression"] <= 1.2  # a head the op attends densely reads r/2d more than dense
    # the Amdahl bound from the dense paths at depth 0 and the measured compression
    assert {m: len(v) for m, v in r["depth0_tokens_per_s"].items()} == {"dense_f16_fa1": 2, "dense_f16_fa0": 2}
    b = r["amdahl"]["sparq_f16"]
    assert b["compression"] == c["compression"] and b["bound"] > 0 and b["share_of_bound"] > 0
    t0, tS = 1 / b["depth0_tokens_per_s"], 1 / r["median_tokens_per_s"][r["fastest_dense"]]
    assert abs(b["bound"] - tS / (t0 + c["compression"] * max(0.0, tS - t0))) < 2e-3
    for key in ("command", "machine", "commit", "text", "sparq", "cache_types", "timing"):
        assert res["meta"][key], key
    assert "| mode | K/V cache | attention |" in (tmp_path / "t.md").read_text()


def test_real_text_budget_compares_rules_with_dense(tiny_gqa_model, tmp_path):
    """bench/real_text.py budget: per length and rule, the teacher-forced steps against dense (an
    exact rule equals it: top-1 all dense's, KL ~0), the counters over the rule's steps, per layer."""
    harness("real_text.py budget", "--model", tiny_gqa_model, "--tokens", "1100,1300", "--steps", "5",
            "--rules", "default,coverage=0.8,k=4096+r=16", "--tag", "t", "--out-dir", tmp_path)
    res = json.loads((tmp_path / "t.json").read_text())["result"]
    assert set(res) == {"1100", "1300"}
    for per in res.values():
        rules = per["rules"]
        assert set(rules) == {"default", "coverage=0.8", "k=4096+r=16"}
        for name, r in rules.items():
            assert r["sparq_calls"] > 0 and 0 < r["compression"], (name, r)
            assert 0 <= r["top1"] <= 1 and r["kl"] >= -1e-9
        # the calibrated k's reports, per layer (a fixed k reports none)
        assert all(len(rules[n]["layers"]) == 2 for n in ("default", "coverage=0.8")), rules
        exact = rules["k=4096+r=16"]
        assert exact["top1"] == 1 and exact["kl"] < 1e-4 and abs(exact["dnll"]) < 1e-3, exact
    assert "| prompt tokens | rule |" in (tmp_path / "t.md").read_text()
    p = subprocess.run([sys.executable, str(REPO / "bench" / "real_text.py"), "budget", "--rules", "coverage",
                        "--tag", "t"], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 2 and "setting=value" in p.stderr
    p = subprocess.run([sys.executable, str(REPO / "bench" / "real_text.py"), "budget", "--rules", "cover=0.9",
                        "--tag", "t"], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 2 and "unknown setting 'cover'" in p.stderr


def test_decode_profile_runs_sparq_and_keeps_the_prefill(tiny_gqa_model, tmp_path):
    args = ("--model", tiny_gqa_model, "--tokens", "1300", "--steps", "4", "--state-dir", tmp_path)
    first = harness("real_text.py profile", *args)
    assert "prefill of 1299 tokens" in first.stdout
    assert list(tmp_path.glob("*_1300_f16_fa1.pkl"))
    again = harness("real_text.py profile", *args)
    assert "prefill of" not in again.stdout  # the kept state
    line = again.stdout.strip().splitlines()[-1]
    assert line.startswith("sparq: ") and "tokens/s over 4 steps" in line
    assert int(line.split("SparQ calls ")[1].split(",")[0]) > 0


def test_decode_ab_writes_results(tmp_path):
    from llama_sparq import lib_dir
    from sparq_lab.models import make_tiny_llama

    # heads of 32: a q8_0 cache's blocks must divide the head size
    model = make_tiny_llama(tmp_path / "tiny-gqa-32.gguf", n_layer=2, n_embd=256, n_head=8, n_head_kv=2, seed=3)
    harness("real_text.py ab", "--before", lib_dir(), "--model", model, "--tokens", "1300", "--steps", "3",
            "--rounds", "2", "--state-dir", tmp_path / "state", "--out-dir", tmp_path, "--tag", "ab")
    doc = json.loads((tmp_path / "ab.json").read_text())
    assert len(doc["rounds"]) == 2 and doc["commit"] and doc["machine"]
    assert all(r[w]["sparq_calls"] > 0 and r[w]["tokens_per_s"] > 0 for r in doc["rounds"] for w in ("before", "after"))
    assert doc["summary"]["ratio_of_medians"] > 0
    assert set(doc["summary"]["dense_medians"]) == {"f16_fa1", "f16_fa0", "q8_0_fa1"}
    assert all(r[f"dense_{d}"]["sparq_calls"] == 0 for r in doc["rounds"] for d in ("f16_fa1", "f16_fa0", "q8_0_fa1"))
    assert doc["summary"]["fastest_dense"] in doc["summary"]["dense_medians"]
    md = (tmp_path / "ab.md").read_text()
    assert "after / before" in md and "Medians: before" in md and "dense f16_fa0 t/s" in md and "the fastest" in md


def test_decode_ab_refuses_a_folder_without_a_build(tmp_path):
    p = subprocess.run([sys.executable, str(REPO / "bench" / "real_text.py"), "ab", "--before", str(tmp_path)],
                       capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 2 and "--before" in p.stderr and "libllama.so" in p.stderr


def test_op_ab_times_a_layer_shape_and_the_8bit_kt(tmp_path):
    from llama_sparq import lib_dir

    harness("op.py ab", "--before", lib_dir(), "--sizes", "700", "--heads", "6", "--head-kv", "2", "--d", "32",
            "--r", "8", "--k", "64", "--kt-bits", "8", "--rounds", "2", "--reps", "2", "--out-dir", tmp_path,
            "--tag", "ab")
    doc = json.loads((tmp_path / "ab.json").read_text())
    assert [r["S"] for r in doc["rows"]] == [700] and doc["rows"][0]["after_us"] > 0
    assert "6 heads on 2 KV heads" in doc["meta"]["sparq"] and "8-bit K^T" in doc["meta"]["sparq"]
    exe = str(tool_path("sparq-op-bench"))
    p = subprocess.run([exe, "--S", "300", "--d", "32", "--heads", "2", "--head-kv", "2", "--r", "8", "--k", "16",
                        "--l", "4", "--reps", "1", "--kt-bits", "8", "--ops", "sparq"], capture_output=True, text=True)
    assert p.returncode == 0 and json.loads(p.stdout)["kt_bits"] == 8, p.stderr
    p = subprocess.run([exe, "--S", "320", "--d", "32", "--heads", "2", "--head-kv", "2", "--r", "8", "--k", "16",
                        "--l", "4", "--reps", "1", "--kt-bits", "4", "--ops", "sparq"], capture_output=True, text=True)
    assert p.returncode == 0 and json.loads(p.stdout)["kt_bits"] == 4, p.stderr
    for bad in (["--kt-bits", "3"], ["--kt-bits", "4", "--S", "300"]):
        p = subprocess.run([exe, *bad], capture_output=True, text=True)
        assert p.returncode == 2 and "kt-bits 16, 8 or 4" in p.stderr
    p = subprocess.run([sys.executable, str(REPO / "bench" / "op.py"), "ab", "--before", str(tmp_path), "--heads", "9",
                        "--head-kv", "2"], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 2 and "--heads must be a multiple of --head-kv" in p.stderr


def test_step_split_classifies_perf_symbols():
    """real_text.py split's parts: quantized matmuls are weights, f16 dots and SparQ's kernels
    attention (upstream's anonymous-namespace tinyBLAS is not), libgomp the barriers."""
    sys.path.insert(0, str(REPO / "bench"))
    from real_text_split import classify, parse_report

    assert classify("libggml-cpu.so", "ggml_vec_dot_q4_1_q8_1") == "weights"
    assert classify("libggml-cpu.so", "quantize_row_q8_0") == "weights"
    assert classify("libggml-cpu.so", "void (anonymous namespace)::tinyBLAS<16, float, float>::gemm<4, 1>") == "weights"
    assert classify("libggml-cpu.so", "ggml_vec_dot_f16") == "attention"
    assert classify("libggml-cpu.so", "ggml_compute_forward_flash_attn_ext_f16_one_chunk") == "attention"
    assert classify("libggml-cpu.so", "(anonymous namespace)::avx512_expsum_store") == "attention"
    assert classify("libggml-cpu.so", "sparq_cpu::attend_cells") == "attention"
    assert classify("libm.so.6", "__expf_fma") == "attention"
    assert classify("libggml-cpu.so", "std::__introselect<float*, long, __gnu_cxx::__ops::_Iter_comp_iter<"
                                      "std::greater<float> > >") == "attention"
    assert classify("libggml-cpu.so", "std::__introsort_loop<int*, long, __gnu_cxx::__ops::_Iter_comp_iter<"
                                      "cmp_top_k> >") == "other"  # upstream's top-k (a MoE's routing)
    assert classify("libgomp.so.1.0.0", "0x000000000001f7da") == "barriers"
    assert classify("libggml-cpu.so", "ggml_compute_forward_rms_norm") == "other"
    assert classify("libpython3.11.so.1.0", "_PyEval_EvalFrameDefault") == "other"
    report = "\n".join([
        "# Samples: 4K of event 'cpu-clock:pppH'",
        "    35.30%         18841  libggml-cpu.so     [.] ggml_vec_dot_q4_1_q8_1            -      -",
        "     6.23%          3326  libgomp.so.1.0.0   [.] 0x000000000001f7da                -      -",
        "     4.65%          2482  libggml-cpu.so     [.] (anonymous namespace)::simd_approx_kt4_tile<(anonymous "
        "namespace)::avx512_vec, 3, 3, 3>     -      -",
        "     1.00%           500  [kernel.kallsyms]  [k] clear_page_erms                   -      -",
    ])
    p = parse_report(report)
    assert p["samples"] == {"weights": 18841, "attention": 2482, "barriers": 3326, "other": 500}
    assert p["symbols"]["attention"] == {
        "(anonymous namespace)::simd_approx_kt4_tile<(anonymous namespace)::avx512_vec, 3, 3, 3>": 2482}


def _perf_usable():
    sys.path.insert(0, str(REPO / "bench"))
    from real_text_split import perf_usable

    return perf_usable()


def test_step_split_writes_results(tmp_path):
    """real_text.py split on a tiny model with q8_0 weights: every run sampled over its decode steps
    only, the parts and the bounds in the result files; SparQ ran."""
    why = _perf_usable()
    if why:
        pytest.skip(why)
    from sparq_lab.models import make_tiny_llama

    # weights large enough for perf to sample their matmuls at depth 0
    model = make_tiny_llama(tmp_path / "small-q8.gguf", n_layer=2, n_embd=512, n_ff=2048, n_head=8, n_head_kv=2,
                            seed=3, weight_type="q8_0")
    harness("real_text.py split", "--model", model, "--tokens", "1300", "--steps", "40", "--kt-bits", "4,8",
            "--tag", "split", "--out-dir", tmp_path)
    doc = json.loads((tmp_path / "split.json").read_text())
    runs = doc["result"]["runs"]
    assert set(runs) == {"depth0_fa1", "depth0_fa0", "dense_fa1", "dense_fa0", "sparq_kt4", "sparq_kt8"}
    assert runs["sparq_kt4"]["sparq_calls"] > 0 and runs["dense_fa1"]["sparq_calls"] == 0
    assert all(set(r["cpu_ms"]) == {"weights", "attention", "barriers", "other"} for r in runs.values())
    assert runs["depth0_fa1"]["cpu_ms"]["weights"] > 0
    an = doc["result"]["analysis"]
    assert an["dense_fastest"] in ("dense_fa1", "dense_fa0")
    assert 0 < an["sparq"]["sparq_kt4"]["bound_depth0"] and 0 < an["sparq"]["sparq_kt4"]["share_depth0"]
    md = (tmp_path / "split.md").read_text()
    assert "| sparq_kt8 | 1300 |" in md and "the depth-0 bound" in md and "top symbols" in md


def test_step_split_refuses_bad_input(tmp_path, tiny_gqa_model):
    """Bad options are named; a model with f32 weights (no quantized matmul to tell the weights by)
    is refused with the reason."""
    script = str(REPO / "bench" / "real_text.py")
    p = subprocess.run([sys.executable, script, "split", "--kt-bits", "3", "--tag", "x"], capture_output=True,
                       text=True, cwd=REPO)
    assert p.returncode == 2 and "--kt-bits" in p.stderr
    p = subprocess.run([sys.executable, script, "profile", "--perf-control", str(tmp_path / "no-fifo")],
                       capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 2 and "--perf-control" in p.stderr
    if _perf_usable() is not None:
        return  # the refusal comes after the runs perf samples
    p = subprocess.run([sys.executable, script, "split", "--model", tiny_gqa_model, "--tokens", "1300", "--steps", "2",
                        "--kt-bits", "4", "--tag", "x", "--out-dir", str(tmp_path)], capture_output=True, text=True,
                       cwd=REPO)
    assert p.returncode != 0 and "quantized" in p.stderr
    assert not (tmp_path / "x.json").exists()
