"""SparQ on CUDA: the op against the CPU op (test-backend-ops), GPU-offloaded SparQ on
Gemma 3 270M against CPU SparQ, and the counters that say where the op ran.

Where no NVIDIA GPU is present every test here is skipped with the reason "no CUDA device: ...".
Where one is present they run, and they fail (never skip) when the installed fork was built
without CUDA: build it with `make install CUDA=1` first (LLAMA_SPARQ_CUDA_TESTS=skip skips them
on purpose, e.g. on a GPU machine that only checks the CPU build).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import numpy as np
import pytest
from sparq_ctx import teacher_forced

from llama_sparq import lib_dir, tool_path


def _gpu() -> str | None:
    """The first GPU's line from nvidia-smi -L, or None."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        res = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [x for x in res.stdout.splitlines() if x.startswith("GPU ")]
    return lines[0] if res.returncode == 0 and lines else None


@pytest.fixture(scope="module")
def cuda():
    """The GPU's name; skips without a GPU, fails when the fork has no CUDA backend."""
    if os.environ.get("LLAMA_SPARQ_CUDA_TESTS", "") == "skip":
        pytest.skip("CUDA tests skipped on purpose (LLAMA_SPARQ_CUDA_TESTS=skip)")
    gpu = _gpu()
    if gpu is None:
        why = "nvidia-smi not found" if not shutil.which("nvidia-smi") else "nvidia-smi -L lists no GPU"
        pytest.skip(f"no CUDA device: {why}; these tests run on a machine with an NVIDIA GPU "
                    "after `make install CUDA=1`")
    if not (lib_dir() / "libggml-cuda.so").is_file():
        pytest.fail(f"{gpu} is present but the installed fork has no CUDA backend ({lib_dir()} has no "
                    "libggml-cuda.so): build it with `make install CUDA=1`")
    return gpu


def test_backend_ops_cuda_equals_cpu(cuda):
    """Every SPARQ_ATTN case of the grid (ggml-sparq/tools/test-backend-ops-sparq.h: head sizes 64..256,
    GQA 1/4/8/16, 1-4 sequences, S up to 64K, f16/f32, masks, k >= S, l = 0, r = d, the oracle,
    per-head choice, no mean-V, window list, basis, dense streams) runs on CUDA0 and matches the CPU.
    A case the CUDA backend does not support would be skipped by test-backend-ops: that fails here."""
    exe = tool_path("test-backend-ops")
    res = subprocess.run([str(exe), "test", "-b", "CUDA0", "-o", "SPARQ_ATTN"], capture_output=True, text=True,
                         timeout=3000)
    out = re.sub(r"\x1b\[[0-9;]*m", "", res.stdout + res.stderr)  # test-backend-ops colours OK/FAIL
    cases = [x for x in out.splitlines() if "SPARQ_ATTN(" in x]
    ok = [x for x in cases if re.search(r"\bOK\b", x)]
    bad = [x for x in cases if not re.search(r"\bOK\b", x)]
    assert res.returncode == 0, out[-4000:]
    assert len(cases) >= 100, out[-4000:]
    assert not bad, "\n".join(bad[:20])
    assert len(ok) == len(cases)


def _llm(model, **kw):
    from llama_sparq import Llama

    kw.setdefault("flash_attn", True)
    return Llama(str(model), n_ctx=4096, n_threads=2, n_batch=512, verbose=False, seed=0, logits_all=True, **kw)


def _greedy(llm, prompt, n):
    llm.reset()
    llm.eval(prompt[:-1])
    tok, toks = prompt[-1], []
    for _ in range(n):
        llm.eval([tok])
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        toks.append(tok)
    return toks


PROMPT = b"The history of the city begins in the bronze age, when " * 40


@pytest.mark.real_model
def test_gemma_gpu_sparq_equals_cpu_sparq(cuda, gemma_model):
    """Exact settings (r = d, k above the context): GPU-offloaded SparQ's logits are no farther from
    CPU SparQ's than upstream's GPU dense attention is from its CPU dense on the same steps (the rest of
    the model differs between the backends too: Gemma 3 270M's logits differ by about 1 between them, so
    the backends' greedy tokens may part at a near tie); every SparQ call on the GPU, none for the CPU
    run; on the GPU alone, SparQ stays within upstream's spread between its two dense attention paths."""
    exact = dict(sparq_r=256, sparq_k=4096, sparq_min_kv=0)
    cpu = _llm(gemma_model, n_gpu_layers=0, **exact)
    prompt = cpu.tokenize(PROMPT)
    steps = _greedy(cpu, prompt, 16)  # the steps every run below is fed (teacher forcing)
    cpu.reset_sparq_stats()
    cpu_sq = teacher_forced(cpu, prompt, steps)
    st_cpu = cpu.sparq_stats()
    assert st_cpu["n_sparq"] > 0 and st_cpu["n_sparq_device"] == 0, st_cpu

    gpu = _llm(gemma_model, n_gpu_layers=-1, **exact)
    gpu_sq = teacher_forced(gpu, prompt, steps)
    st = gpu.sparq_stats()
    # Gemma 3 270M: 3 full-attention layers x 16 decode steps, every one on the GPU
    assert st["n_sparq"] == 3 * 16 and st["n_sparq_device"] == st["n_sparq"], st

    cpu_d = teacher_forced(_llm(gemma_model, n_gpu_layers=0), prompt, steps)
    gpu_d = teacher_forced(_llm(gemma_model, n_gpu_layers=-1), prompt, steps)
    d_sparq = np.abs(gpu_sq - cpu_sq).max(axis=1)
    d_dense = np.abs(gpu_d - cpu_d).max(axis=1)
    print(f"\n{cuda}: largest |GPU - CPU| logit per step, SparQ {np.round(d_sparq, 3)}\n"
          f"dense {np.round(d_dense, 3)}\nGPU counters {st}")
    assert d_sparq.max() <= 1.25 * d_dense.max() + 0.05, (d_sparq, d_dense)
    assert np.median(d_sparq) <= 1.25 * np.median(d_dense) + 0.05, (d_sparq, d_dense)

    # on the GPU alone: SparQ (exact) against upstream's flash attention, within -fa 1 vs -fa 0
    nofa = _llm(gemma_model, n_gpu_layers=-1, flash_attn=False)
    fa_spread = np.abs(teacher_forced(nofa, prompt, steps) - gpu_d).max()
    assert np.abs(gpu_sq - gpu_d).max() <= 1.5 * fa_spread + 0.05, (np.abs(gpu_sq - gpu_d).max(), fa_spread)


@pytest.mark.real_model
@pytest.mark.parametrize("k", [0, 128], ids=["calibrated", "k128"])
def test_gemma_gpu_sparq_defaults_run_on_the_gpu(cuda, gemma_model, k):
    """The default settings on the GPU (r = d/4, scaled basis, window) with the calibrated k (k = 0:
    the CUDA op cuts each selection at the coverage target itself) and with a fixed k = 128: SparQ
    calls all on the GPU; the output agrees with CPU SparQ's teacher-forced argmax where the margin
    is clear."""
    cpu = _llm(gemma_model, n_gpu_layers=0, sparq=True, sparq_min_kv=0, sparq_k=k)
    prompt = cpu.tokenize(PROMPT)
    want = _greedy(cpu, prompt, 12)
    want_lg = teacher_forced(cpu, prompt, want)
    gpu = _llm(gemma_model, n_gpu_layers=-1, sparq=True, sparq_min_kv=0, sparq_k=k)
    got_lg = teacher_forced(gpu, prompt, want)
    st = gpu.sparq_stats()
    assert st["n_sparq"] == 3 * 12 and st["n_sparq_device"] == st["n_sparq"], st
    top2 = np.sort(want_lg, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 1.0
    assert clear.sum() >= 4
    assert np.array_equal(got_lg.argmax(axis=1)[clear], want_lg.argmax(axis=1)[clear])


@pytest.mark.real_model
def test_gemma_nkvo_runs_sparq_on_the_cpu(cuda, gemma_model):
    """-nkvo (offload_kqv=False): weights on the GPU, cache and attention on the CPU; SparQ runs,
    none of its calls on the GPU."""
    llm = _llm(gemma_model, n_gpu_layers=-1, offload_kqv=False, sparq=True, sparq_min_kv=0)
    prompt = llm.tokenize(PROMPT)
    _greedy(llm, prompt, 6)
    st = llm.sparq_stats()
    assert st["n_sparq"] == 3 * 6 and st["n_sparq_device"] == 0, st


@pytest.mark.real_model
def test_bench_and_cli_on_the_gpu(cuda, gemma_model, tmp_path):
    """llama-sparq-bench -ngl 99 --sparq 0,1 runs and counts SparQ calls; the CLI's counters line
    shows the calls on the GPU."""
    bench = tool_path("llama-bench")
    res = subprocess.run([str(bench), "-m", str(gemma_model), "-ngl", "99", "-fa", "1", "--sparq", "0,1", "--sparq-k", "128",
                          "--sparq-min-kv", "0", "-p", "0", "-n", "8", "-d", "2048", "-r", "1", "-o", "json"],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    import json

    rows = json.loads(res.stdout)
    sp = [r for r in rows if int(r.get("sparq", 0)) == 1]
    assert sp and all(int(r["sparq_calls"]) > 0 for r in sp), rows
    cli = tool_path("llama-completion")
    res = subprocess.run([str(cli), "-m", str(gemma_model), "-ngl", "99", "--sparq", "--sparq-k", "128", "--sparq-min-kv", "0",
                          "-p", PROMPT.decode()[:2000], "-n", "8", "--temp", "0", "-no-cnv", "-v"],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    m = re.search(r"SparQ calls = (\d+),.*SparQ calls on a device \(GPU, RPC host\) = (\d+)", res.stderr)
    assert m and int(m.group(1)) > 0 and m.group(1) == m.group(2), res.stderr[-3000:]


def test_gpu_calibrated_k_reports_diffuse_layers(cuda, tiny_gqa_model):
    """The calibrated k with the cache on the GPU: the CUDA op reports its choice into page-locked
    host memory (no wait), so the counters count the cells it attended: on layers whose every KV
    head is diffuse (the tiny random model's near uniform attention) every valid cell, at every
    step, as on the CPU (test_sparq_llama.py)."""
    from sparq_ctx import make_llm, rand_prompt

    llm = make_llm(tiny_gqa_model, logits_all=True, flash_attn=True, n_gpu_layers=-1, sparq=True, sparq_min_kv=0,
                   sparq_k=0, sparq_k_min=16)
    prompt = rand_prompt(700, 5, 256)
    llm.eval(prompt[:-1])
    tok = prompt[-1]
    n = 40
    for _ in range(n):
        llm.eval([tok])
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    st = llm.sparq_stats()
    layers = llm.sparq_layer_stats()
    llm.close()
    assert st["n_sparq"] == 2 * n and st["n_sparq_device"] == st["n_sparq"], st
    assert all(x["mean_k"] > 600 for x in layers), layers  # every valid cell, as reported by the GPU


_FUSED_RUN = """
import sys
import numpy as np
from llama_sparq import Llama
llm = Llama(sys.argv[1], n_ctx=1024, n_threads=2, n_batch=512, verbose=True, seed=0, logits_all=True, flash_attn=True,
            n_gpu_layers=-1, sparq=True, sparq_k=32, sparq_min_kv=0)
rng = np.random.default_rng(3)
llm.eval([1] + rng.integers(3, llm.n_vocab(), size=599).tolist())
out = []
for t in range(5, 13):
    llm.eval([t])
    out.append(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64))
st = llm.sparq_stats()
assert st["n_sparq"] == 2 * 8 and st["n_sparq_device"] == st["n_sparq"], st
np.save(sys.argv[2], np.array(out))
"""


def test_gpu_fused_one_launch_equals_three_launches(cuda, tiny_model, tmp_path):
    """LLAMA_SPARQ_CUDA_FUSED=1 on a GPU (test-backend-ops' grid has no tickets, so it never runs the
    one launch): the tiny MHA model with its cache on the GPU, a fixed k, a 600-token prompt and 8
    decode steps, once per way (the switch is read once per process). With the switch the op says
    once that its one launch runs, and the logits equal the three launches' to rounding (the same
    cells; one attend block per unit instead of parts)."""
    import sys

    logits = {}
    for way in ("0", "1"):
        env = dict(os.environ, LLAMA_SPARQ_CUDA_FUSED=way)
        dst = tmp_path / f"fused_{way}.npy"
        res = subprocess.run([sys.executable, "-c", _FUSED_RUN, str(tiny_model), str(dst)], capture_output=True,
                             text=True, timeout=600, env=env)
        assert res.returncode == 0, res.stderr[-3000:]
        assert ("one launch per layer" in res.stderr) == (way == "1"), res.stderr[-3000:]
        logits[way] = np.load(dst)
    ref = logits["0"]
    assert np.abs(logits["1"] - ref).max() <= 1e-3 * max(1.0, np.abs(ref).max()), np.abs(logits["1"] - ref).max()


def test_selectors_on_a_gpu_context(cuda, tiny_gqa_model):
    """With the cache on the GPU: sparq and oracle run there (every call counted on the device);
    streaming, h2o and index are refused when set, naming the selector and the way out, never run on
    the CPU with the cache copied to the host each step; with the cache in host memory (-nkvo) they run."""
    from llama_sparq import Llama

    def llm(**kw):
        return Llama(str(tiny_gqa_model), n_ctx=1024, n_threads=2, n_batch=512, verbose=False, seed=0,
                     flash_attn=True, sparq=True, sparq_k=32, sparq_min_kv=0, **kw)

    rng = np.random.default_rng(1)
    # the default dense threshold (min_kv = -1) by where the cache is, and on a GPU by the kind of k
    on_gpu = Llama(str(tiny_gqa_model), n_ctx=1024, verbose=False, n_gpu_layers=-1, sparq=True, sparq_k=32)
    on_gpu_cal = Llama(str(tiny_gqa_model), n_ctx=1024, verbose=False, n_gpu_layers=-1, sparq=True)
    on_host = Llama(str(tiny_gqa_model), n_ctx=1024, verbose=False, n_gpu_layers=-1, offload_kqv=False, sparq=True,
                    sparq_k=32)
    assert [m.sparq_params()["sparq_min_kv"] for m in (on_gpu, on_gpu_cal, on_host)] == [65536, 1048576, 1024]
    # changing k keeps the default (set_sparq passes the value read back), a value given stays
    on_gpu.set_sparq(sparq_k=0)
    assert on_gpu.sparq_params()["sparq_min_kv"] == 1048576
    on_gpu.set_sparq(sparq_min_kv=5000)
    on_gpu.set_sparq(sparq_k=64)
    assert on_gpu.sparq_params()["sparq_min_kv"] == 5000
    for sel in ("sparq", "oracle"):
        m = llm(n_gpu_layers=-1, sparq_selector=sel)
        m.eval([1] + rng.integers(3, m.n_vocab(), size=299).tolist())
        for t in (5, 6, 7):
            m.eval([t])
        st = m.sparq_stats()
        assert st["n_sparq"] == 2 * 3 and st["n_sparq_device"] == st["n_sparq"], (sel, st)
    for sel in ("streaming", "h2o", "index"):
        with pytest.raises(RuntimeError, match=f"selector {sel} .*(CUDA0|host memory).*offload_kqv = false"):
            llm(n_gpu_layers=-1, sparq_selector=sel)
        m = llm(n_gpu_layers=-1, offload_kqv=False, sparq_selector=sel)
        m.eval([1] + rng.integers(3, m.n_vocab(), size=299).tolist())
        m.eval([5])
        st = m.sparq_stats()
        assert st["n_sparq"] == 2 and st["n_sparq_device"] == 0, (sel, st)


# ---------------------------------------------------------------------------
# the CUDA kernels' logic, checked on the CPU (no GPU needed)
# ---------------------------------------------------------------------------

# the emulators: sparq-cuda-emu runs the default build's one pipeline (it reads no switch),
# sparq-cuda-emu-exp the experimental build's (ggml-sparq/cuda/experimental/: the variants and the
# LLAMA_SPARQ_CUDA_* switches that choose them or force a choice of the launch)
EMU, EMU_EXP = "sparq-cuda-emu", "sparq-cuda-emu-exp"
# the runs' ways of test_cuda_kernels_emulated_equal_the_cpu_op that are the default pipeline's
EMU_DEFAULT_WAYS = ("rank", "auto", "match", "late", "0", "0", "0", "0")

# d S n_head n_head_kv n_rows n_stream r k l f16 mask selector flags variant [force one-cell loads
# [coverage k_min k_frac]]
EMU_CASES = {
    "gqa4-f32-vec": "128 1000 8 2 1 2 16 64 16 0 1 0 0 0",
    "mha-f16-scalar-loads": "64 2048 4 4 1 1 16 128 32 1 1 0 0 0 1",
    "gqa4-perhead-window": "64 1024 8 2 1 1 16 64 16 1 1 0 1 1",
    "basis-no-mean-v": "128 1024 4 1 1 2 32 64 16 1 1 0 2 2",
    "oracle-l0-nomask": "64 1024 4 2 1 1 16 64 0 0 0 1 0 0",
    "rows-dense-stream": "64 300 4 2 2 2 8 32 8 1 1 0 0 3",
    "short-sequence-long-cache": "64 4096 4 4 1 2 8 64 16 1 1 0 0 4",
    # a dense stream beside a SparQ one, several rows, k = 128: both split in 4 parts
    "rows-dense-stream-parts": "64 1000 4 2 3 2 8 128 8 1 1 0 0 3",
    # the calibrated k: each list cut at the coverage target within its row's cap (MHA, GQA shared,
    # per-head with a window list), units found diffuse (the cap's best cells, the rest to the mean of V),
    # and a mix of diffuse and chosen units over two streams
    "calibrated-mha": "64 2048 4 4 1 1 16 512 32 1 1 0 0 0 0 0.4 64 0.3",
    "calibrated-gqa-two-streams": "128 1000 8 2 1 2 16 256 16 0 1 0 0 0 0 0.3 8 0.25",
    "calibrated-perhead-window": "64 1024 8 2 1 1 16 256 16 1 1 0 1 1 0 0.5 16 0.25",
    "calibrated-diffuse": "128 1000 8 2 1 2 16 256 16 0 1 0 0 0 0 0.95 16 0.25",
    "mixed-diffuse-chosen": "64 1000 4 4 1 2 16 256 16 1 1 0 0 0 0 0.53 16 0.25",
    # several selection tiles per list (4096 cells each): every tile's candidates in the list's buffer
    "gqa4-five-tiles": "128 20000 8 2 1 1 32 128 32 1 1 0 0 0",
    "mha-three-tiles-window": "64 12000 4 4 1 1 16 128 32 1 1 0 1 1",
    # an 8-bit K^T (e5m2, f16 K and V): 8-byte vector loads, and one-byte loads
    "gqa4-e5m2-vec": "128 1000 8 2 1 2 16 64 16 2 1 0 0 0",
    "mha-e5m2-scalar-loads": "64 2048 4 4 1 1 16 128 32 2 1 0 0 0 1",
    # a 4-bit K^T (q4_1 blocks of 32 cells, f16 K and V): a thread's cells in one block, and one cell a thread
    "gqa4-kt4-vec": "128 1024 8 2 1 2 16 64 16 3 1 0 0 0",
    "mha-kt4-scalar-loads": "64 2048 4 4 1 1 16 128 32 3 1 0 0 0 1",
}

# SPARQ_EMU_FULL=1 adds the longer grid (a few minutes on 2 cores)
EMU_CASES_FULL = [
    "128 1000 8 2 1 2 16 64 16 1 1 0 0 0", "64 4096 4 4 1 1 16 128 32 1 1 0 0 0",
    "128 2048 16 2 1 1 32 128 32 1 1 0 0 0", "80 2048 16 1 1 1 20 128 32 1 1 0 0 0",
    "128 2048 8 2 1 1 32 64 16 1 1 0 1 0", "128 2048 8 2 1 1 32 64 16 1 1 0 2 0",
    "128 2048 8 2 1 1 16 64 16 1 1 1 0 0", "128 2048 8 2 2 2 32 128 32 1 1 0 0 1",
    "128 2048 8 2 1 2 32 128 32 1 1 0 0 2", "128 2048 8 2 1 3 32 128 32 1 1 0 0 3",
    "64 1000 4 4 3 2 8 32 8 1 1 0 0 0", "128 100 8 2 1 2 16 128 32 1 1 0 0 0",
    "128 2048 8 2 1 2 16 64 16 1 0 0 0 0", "128 2048 8 2 1 2 16 64 0 1 1 0 0 0",
    "128 2048 8 2 1 2 16 64 64 1 1 0 0 0", "256 8192 4 1 1 1 64 256 64 1 1 0 0 0",
    "64 7 4 4 1 1 8 32 8 1 1 0 0 0", "64 20000 2 2 1 1 16 128 32 1 1 0 0 0",
    "128 4096 8 2 1 1 32 128 32 0 1 0 1 1", "128 1000 8 2 1 2 16 64 16 0 1 0 0 0",
    "128 2048 8 2 1 1 32 512 16 1 1 0 0 0 0 0.5 16 0.25", "64 2048 4 4 1 1 16 512 32 1 1 0 0 0 0 0.6 8 0.5",
    "128 2048 8 2 1 1 32 512 16 1 1 0 0 0 0 0.3 8 0.25", "64 20000 2 2 1 1 16 2048 32 1 1 0 0 0 0 0.5 64 0.2",
]
if os.environ.get("SPARQ_EMU_FULL", "0") not in ("", "0"):
    EMU_CASES.update({"full-" + c.replace(" ", "_"): c for c in EMU_CASES_FULL})


# the selection's two ways (LLAMA_SPARQ_CUDA_SELECT): by default the bin holding the k-th key is
# ranked in shared memory, so the radix passes over the list (what a bin too full to rank takes)
# run on some cases forced; the attend stage's two ways (LLAMA_SPARQ_CUDA_ATTEND): these few units
# get split into parts by default, so the one-block-per-unit kernel runs on some of them forced
EMU_RADIX = ["gqa4-f32-vec", "gqa4-perhead-window", "short-sequence-long-cache", "calibrated-mha",
             "calibrated-perhead-window"]
EMU_SINGLE = ["gqa4-perhead-window", "basis-no-mean-v", "rows-dense-stream-parts", "calibrated-gqa-two-streams"]
# the tiles' histogram (LLAMA_SPARQ_CUDA_SELECT_HIST): a warp vote, then one add per distinct bin, by
# default; one add per cell on these (several tiles per list, a window, the calibrated k, e5m2); and
# the tiles' key loads (LLAMA_SPARQ_CUDA_SELECT_LOADS) after the list's context by default, before it
# on these (GQA summed and not, a dense stream, the calibrated k)
EMU_HIST_ATOMIC = ["gqa4-five-tiles", "mha-three-tiles-window", "calibrated-mha", "gqa4-e5m2-vec"]
EMU_LOADS_EARLY = ["gqa4-five-tiles", "mha-three-tiles-window", "rows-dense-stream", "calibrated-gqa-two-streams",
                   "calibrated-perhead-window"]
# the programmatic dependent launches (LLAMA_SPARQ_CUDA_PDL=1) on the one-block attend's and the early
# loads' runs (both attend kernels, the select with and without the calibrated k, a dense stream):
# the emulator checks that every thread of every such block waits for its predecessor once
# the histogram counted by the score tiles (LLAMA_SPARQ_CUDA_SCORE_HIST=1; a fixed k's lists keyed by
# one head's logits: MHA, per-head choice) on these, with the programmatic launches, and once with
# the radix passes; a k whose tiles keep more candidates than fit (the select's pass over the list)
EMU_CASES_SCORE = {"mha-score-overflow": "64 2048 4 4 1 1 16 640 32 1 1 0 0 0"}
EMU_SCORE_HIST = ["mha-f16-scalar-loads", "gqa4-perhead-window", "mha-three-tiles-window", "short-sequence-long-cache",
                  "mha-score-overflow"]
# the all-cells units streamed (LLAMA_SPARQ_CUDA_DIFFUSE=1: contiguous ranges of cells, 16-byte K
# and V loads, the launch's parts from S where k >= S makes every row dense): every row dense (a
# dense stream, two rows and streams) at a head size whose rows take no 16-byte loads, one block per
# unit
EMU_CASES_STREAM = {"dense-rows-unaligned": "100 300 4 2 2 2 8 512 8 1 1 0 0 3"}
EMU_STREAM = [("dense-rows-unaligned", "single")]
if os.environ.get("SPARQ_EMU_FULL", "0") not in ("", "0"):
    # GQA's heads, f32 caches and 8 parts per unit; k >= S split; a short sequence in a long cache
    # (chunks without a valid cell) with the calibrated k (its histogram below)
    EMU_CASES_STREAM.update({"dense-rows-parts": "64 300 4 2 2 2 8 512 8 1 1 0 0 3",
                             "short-sequence-calibrated": "64 4096 4 4 1 2 8 64 16 1 1 0 0 4 0 0.5 48 0.25"})
    EMU_STREAM += [("dense-rows-parts", "auto")]
# the calibrated k's histogram from the score tiles (LLAMA_SPARQ_CUDA_CALIB_HIST=1: each tile's masses
# per bin relative to its own maximum, rescaled at the merge; lists keyed by one head's logits, MHA
# and per-head choice; GQA's shared choice keeps the select tiles, which the GQA cases check) on the
# calibrated cases, diffuse units among chosen ones, and: one tile holding almost all of the softmax
# (SPARQ_EMU_PEAK: its cut runs on into the other tiles' cells, each rescaled from its own maximum),
# whole score tiles masked (SPARQ_EMU_HOLE) with per-head lists and a window list, and crossing bins
# below the tiles' candidates (the passes over the list); with radix passes and programmatic launches
EMU_CASES_CALIB = {"calibrated-peak-tile": "64 8192 4 4 1 1 16 2048 32 1 1 0 0 0 0 0.99 16 0.25",
                   "calibrated-hole-perhead-window": "64 12000 8 2 1 1 16 4096 32 1 1 0 1 1 0 0.5 64 0.3",
                   "calibrated-many-tiles": "64 12000 4 4 1 1 16 8192 32 1 1 0 0 0 0 0.7 64 0.5"}
EMU_CASE_ENV = {"calibrated-peak-tile": {"SPARQ_EMU_PEAK": "8"},
                "calibrated-hole-perhead-window": {"SPARQ_EMU_HOLE": "1"}}
EMU_CALIB_HIST = ["calibrated-mha", "calibrated-gqa-two-streams", "calibrated-perhead-window", "calibrated-diffuse",
                  "mixed-diffuse-chosen", *EMU_CASES_CALIB]
if os.environ.get("SPARQ_EMU_FULL", "0") not in ("", "0"):
    EMU_CALIB_HIST += ["short-sequence-calibrated"]
EMU_RUNS = ([(c, "rank", "auto", "match", "late", "0", "0", "0", "0") for c in EMU_CASES]
            + [(c, "radix", "auto", "match", "late", "0", "0", "0", "0") for c in EMU_RADIX if c in EMU_CASES]
            + [(c, "rank", "single", "match", "late", "1", "0", "0", "0") for c in EMU_SINGLE if c in EMU_CASES]
            + [(c, "rank", "auto", "atomic", "late", "0", "0", "0", "0") for c in EMU_HIST_ATOMIC if c in EMU_CASES]
            + [(c, "rank", "auto", "match", "early", "1", "0", "0", "0") for c in EMU_LOADS_EARLY if c in EMU_CASES]
            + [(c, "rank", "auto", "match", "late", "1", "1", "0", "0") for c in EMU_SCORE_HIST]
            + [("gqa4-perhead-window", "radix", "auto", "match", "late", "0", "1", "0", "0")]
            + [(c, "rank", at, "match", "late", "0", "0", "1", "0") for c, at in EMU_STREAM]
            + [("calibrated-peak-tile", "rank", "auto", "match", "late", "0", "0", "0", "0")]
            + [(c, "rank", "auto", "match", "late", "0", "0", "0", "1") for c in EMU_CALIB_HIST]
            + [(c, "radix", "auto", "match", "late", "1", "0", "0", "1")
               for c in ("calibrated-perhead-window", "calibrated-peak-tile")])

# kernel launches per layer and step the op may take (the emulator counts them)
SPARQ_CUDA_MAX_LAUNCHES = 4


@pytest.mark.parametrize("case,select,attend,hist,loads,pdl,score,stream,calib", EMU_RUNS,
                         ids=["-".join([c, s] + [w for w in (a, h, ld) if w not in ("auto", "match", "late")]
                                       + (["pdl"] if p == "1" else []) + (["scorehist"] if sc == "1" else [])
                                       + (["stream"] if st == "1" else []) + (["calibhist"] if cb == "1" else []))
                              for c, s, a, h, ld, p, sc, st, cb in EMU_RUNS])
def test_cuda_kernels_emulated_equal_the_cpu_op(case, select, attend, hist, loads, pdl, score, stream, calib):
    """The kernels of ggml-sparq/cuda/, run on the CPU by sparq-cuda-emu (one thread
    per CUDA thread; __syncthreads and the warp shuffles as barriers; blocks in a shuffled order),
    give the CPU op's output and choose the same cells (the unit's bitmap equals the CPU's list; a unit
    the calibrated k found diffuse keeps its cap's best cells) on tie-proof inputs,
    in at most SPARQ_CUDA_MAX_LAUNCHES kernel launches (the report's copy to the host is not a kernel),
    and write the CPU op's report (per stream and KV head: cells attended, coverage, and with the
    calibrated k the cells reaching the target and whether they did; a diffuse unit's reach as a lower
    bound at or over the row's cap, on both). This checks the kernels' indexing and logic before any
    GPU runs them; not the GPU's memory model or speed.
    select: the bin at the k-th key ranked in shared memory (the default) or radix passes over the
    list; attend: the default (each unit's cells split over blocks here, the last combining) or one
    block per unit; hist: the tiles' histogram after a warp vote (the default) or an add per cell;
    loads: the tiles' key loads after the list's context (the default) or before it; pdl: the select
    and attend as programmatic dependent launches, each block waiting once for its predecessor; score:
    the histogram and candidates from the score tiles, the select one block per list; stream: the
    all-cells units (dense rows) streamed over contiguous ranges of cells, the launch's parts from S; calib: the calibrated k's mass histogram and candidates from the score tiles, the
    select one block per list where the lists are keyed by one head's logits."""
    # only the switches a run changes are set, as a GPU session sets them (a select tiles' switch set
    # to either way takes the experimental tiles' kernel)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_SPARQ_CUDA_")}
    ways = {"LLAMA_SPARQ_CUDA_SELECT": select, "LLAMA_SPARQ_CUDA_ATTEND": attend,
            "LLAMA_SPARQ_CUDA_SELECT_HIST": hist, "LLAMA_SPARQ_CUDA_SELECT_LOADS": loads,
            "LLAMA_SPARQ_CUDA_PDL": pdl, "LLAMA_SPARQ_CUDA_SCORE_HIST": score, "LLAMA_SPARQ_CUDA_DIFFUSE": stream,
            "LLAMA_SPARQ_CUDA_CALIB_HIST": calib}
    env.update({k: w for (k, w), d in zip(ways.items(), EMU_DEFAULT_WAYS) if w != d})
    env.update(EMU_CASE_ENV.get(case, {}))
    args = {**EMU_CASES, **EMU_CASES_SCORE, **EMU_CASES_STREAM, **EMU_CASES_CALIB}[case].split()
    tool = EMU if (select, attend, hist, loads, pdl, score, stream, calib) == EMU_DEFAULT_WAYS else EMU_EXP
    res = subprocess.run([str(tool_path(tool)), *args], capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0 and res.stdout.startswith("OK"), res.stdout + res.stderr[-2000:]
    m = re.search(r"sel_differ=(\d+)", res.stdout)
    assert m and m.group(1) == "0"
    assert re.search(r"report_differ=(\d+)", res.stdout).group(1) == "0", res.stdout
    assert f"score_hist={score}" in res.stdout, res.stdout  # (every case of EMU_SCORE_HIST has such lists)
    # (every case of EMU_STREAM has k >= S)
    assert f"stream={stream}" in res.stdout, res.stdout
    reach = int(re.search(r"report_reach=(\d+)", res.stdout).group(1))
    # every (stream, KV head) measured its reach with the calibrated k, none with a fixed k; a dense
    # stream (variants 3 and 4: stream 0's rows attend over every valid cell) measures none
    sparq_streams = int(args[5]) - (1 if int(args[13]) in (3, 4) else 0)
    assert reach == (int(args[3]) * sparq_streams if len(args) > 15 else 0), res.stdout
    assert all(f"{k}={v}" in res.stdout for k, v in (("select", select), ("hist", hist), ("loads", loads))), res.stdout
    launches = int(re.search(r" launches=(\d+)", res.stdout).group(1))
    assert 1 <= launches <= SPARQ_CUDA_MAX_LAUNCHES, res.stdout
    if len(args) > 15:
        # the calibrated k's lists keyed by one head's logits (g == 1, per-head choice) take the score
        # tiles' histogram with the switch: one select block per list, else the select tiles' grid
        g, per_head = int(args[2]) // int(args[3]), int(args[12]) & 1
        lists = int(args[4]) * int(args[5]) * int(args[3]) * (g if per_head and g > 1 else 1)
        one_head = calib == "1" and (g == 1 or per_head == 1)
        assert f"calib_hist={int(one_head)}" in res.stdout, res.stdout
        blocks = lists * (1 if one_head else -(-int(args[1]) // 4096))
        assert f"select_blocks={blocks} " in res.stdout and launches == 3, res.stdout
    # the select and the attend, once each
    assert re.search(r"pdl_launches=(\d+)", res.stdout).group(1) == ("2" if pdl == "1" else "0"), res.stdout
    parts = int(re.search(r"attend_parts=(\d+)", res.stdout).group(1))
    if attend == "single":
        assert parts == 1, res.stdout
    elif case in ("gqa4-perhead-window", "rows-dense-stream-parts", "mha-f16-scalar-loads"):
        assert parts > 1, res.stdout  # k >= 64 on a few units: the split ran
    diffuse = int(re.search(r"diffuse_units=(\d+)", res.stdout).group(1))
    cells = float(re.search(r"mean_cells=([0-9.]+)", res.stdout).group(1))
    if case == "calibrated-diffuse":
        from sparq_lab import reference

        # a diffuse unit attends over its cap's cells (the window among them), not every cell
        k, k_min, k_frac, S = int(args[7]), int(args[16]), float(args[17]), int(args[1])
        assert diffuse > 0 and cells <= reference.coverage_cap(k, k_min, k_frac, S), res.stdout
    elif case == "mixed-diffuse-chosen":
        units = int(re.search(r"sparq_units=(\d+)", res.stdout).group(1))
        assert 0 < diffuse < units, res.stdout
    elif case.startswith("dense-rows"):
        assert "sparq_units=0 " in res.stdout, res.stdout
        assert ("kv_vec=0" if case.endswith("unaligned") else "kv_vec=1") in res.stdout, res.stdout
    elif case.startswith("calibrated-"):
        # the cut lies inside (k_min, the row's cap): the target, not a bound, set the cells
        k_min, k_frac, S = int(args[16]), float(args[17]), int(args[1])
        assert diffuse == 0 and k_min < cells < k_frac * S, res.stdout


# the attention variants (SPARQ_EMU_VARIANTS="softcap max_bias sinks [kq_b]", on both sides): GQA per
# head with a window list and all three; 6 heads (ALiBi's slopes past the largest power of 2) with sinks;
# the calibrated k with sinks (the window's mass, alpha); dense rows and a dense stream (the sinks in
# the dense softmax); soft-capping with f32 caches, split into parts; a KQ bias (per row, head and
# cell) over several rows and streams, with per-head choice and the calibrated k, and with all four
EMU_CASES_VARIANTS = {
    "gqa4-perhead-window-all": ("64 1024 8 2 1 1 16 64 16 1 1 0 1 1", "3.0 8.0 1"),
    "gqa3-alibi-sinks": ("64 1024 6 2 1 1 16 64 16 1 1 0 0 0", "0 8.0 1"),
    "calibrated-gqa-sinks": ("128 1000 8 2 1 2 16 256 16 0 1 0 0 0 0 0.3 8 0.25", "0 0 1"),
    "calibrated-perhead-softcap-alibi": ("64 1024 8 2 1 1 16 256 16 1 1 0 1 1 0 0.5 16 0.25", "2.0 4.0 0"),
    "rows-dense-stream-all": ("64 300 4 2 2 2 8 32 8 1 1 0 0 3", "2.0 8.0 1"),
    "mha-f32-softcap-parts": ("128 2048 4 4 1 1 16 128 32 0 1 0 0 0", "2.0 0 0"),
    "gqa4-kqb-rows-streams": ("64 1024 8 2 3 2 16 64 16 1 1 0 0 0", "0 0 0 1"),
    "calibrated-perhead-kqb": ("64 1024 8 2 1 1 16 256 16 1 1 0 1 0 0 0.5 16 0.25", "0 0 0 1"),
    "rows-dense-stream-kqb-all": ("64 300 4 2 2 2 8 32 8 1 1 0 0 3", "2.0 8.0 1 1"),
}


@pytest.mark.parametrize("case", list(EMU_CASES_VARIANTS))
def test_cuda_kernels_emulated_with_the_attention_variants(case):
    """The kernels with soft-capping, ALiBi, sinks and a KQ bias give the CPU op's output, cells and report
    (the CPU op is checked against the NumPy reference in test_kernels.py)."""
    args, variants = EMU_CASES_VARIANTS[case]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_SPARQ_CUDA_")}
    env["SPARQ_EMU_VARIANTS"] = variants
    res = subprocess.run([str(tool_path(EMU)), *args.split()], capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0 and res.stdout.startswith("OK"), res.stdout + res.stderr[-2000:]
    assert "sel_differ=0 " in res.stdout and "report_differ=0 " in res.stdout, res.stdout


# K and V head sizes that differ (args, V's head size, V read through K's rows): DeepSeek's unabsorbed
# heads (K 192, V 128), a V wider than K with GQA over two streams (f32), and MLA's absorbed decode in
# the sizes the kernels take (one latent KV head for every query head, V the first dv values of each K
# row: an 8-bit K^T; the calibrated k with a window list). MLA's own 576 is above the kernels' head
# size: such a node runs on the CPU (sparq_cuda_attn_unsupported)
EMU_CASES_DK_DV = {
    "deepseek-heads-f16": ("192 1000 8 8 1 1 24 64 16 1 1 0 0 0", 128, False),
    "v-wider-gqa-f32-streams": ("64 1000 8 2 1 2 16 64 16 0 1 0 0 0", 128, False),
    "mla-v-in-k-e5m2": ("96 1000 8 1 1 1 16 64 16 2 1 0 0 0", 64, True),
    "mla-v-in-k-calibrated-window": ("128 2048 16 1 1 1 32 256 16 1 1 0 0 1 0 0.5 16 0.25", 96, True),
}


@pytest.mark.parametrize("case", list(EMU_CASES_DK_DV))
def test_cuda_kernels_emulated_with_k_and_v_head_sizes_that_differ(case):
    """The kernels with V of its own head size, and V read through K's rows as MLA's cache holds it,
    give the CPU op's output, cells and report (the CPU op against the NumPy reference for these
    shapes: test_kernels.py)."""
    args, dv, v_in_k = EMU_CASES_DK_DV[case]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_SPARQ_CUDA_")}
    env["SPARQ_EMU_DV"] = str(dv)
    env["SPARQ_EMU_V_IN_K"] = "1" if v_in_k else "0"
    res = subprocess.run([str(tool_path(EMU)), *args.split()], capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0 and res.stdout.startswith("OK"), res.stdout + res.stderr[-2000:]
    assert "sel_differ=0 " in res.stdout and "report_differ=0 " in res.stdout, res.stdout


# the whole op in one launch (LLAMA_SPARQ_CUDA_FUSED=1: a fixed k, S <= 16384, f16 K and V, the
# layer's tickets): MHA in one score tile (S = 1000, not a multiple of it) and in three (the last
# partial; the 8-bit K^T); a window list over several KV heads (each unit's own window bitmap);
# per-head choice with GQA (g = 4, and g = 16: the kernel's shared buffer at its largest; with a
# window list and the radix passes); GQA's shared choice (the last block's own select tiles: one,
# with a window list over two streams, and three with g = 8); two streams, one dense; three rows of
# two streams; k whose tiles keep fewer candidates than they find (MHA: the score tiles', GQA: the
# select tiles'). Where it does not apply, three launches: S over the limit, the calibrated k, f32
# caches, and a node without tickets (a graph without the llama glue, as test-backend-ops')
EMU_CASES_FUSED = {
    "mha-one-tile": "64 1000 4 4 1 1 16 128 32 1 1 0 0 0",
    "mha-three-tiles-e5m2": "64 5000 4 4 1 1 16 128 32 2 1 0 0 0",
    "mha-window-list": "64 5000 4 4 1 1 16 128 32 1 1 0 0 1",
    "gqa4-perhead": "64 2048 8 2 1 1 16 64 16 1 1 0 1 0",
    "gqa16-perhead-e5m2": "64 2048 16 1 1 1 16 64 16 2 1 0 1 0",
    "gqa4-perhead-window-radix": "64 2048 8 2 1 1 16 64 16 1 1 0 1 1",
    "gqa4-shared": "64 1000 8 2 1 1 16 64 16 1 1 0 0 0",
    "gqa4-shared-window-streams": "128 1000 8 2 1 2 16 64 16 1 1 0 0 1",
    "gqa8-shared-three-tiles-e5m2": "64 9000 16 2 1 1 16 128 32 2 1 0 0 0",
    "perhead-dense-stream": "64 1000 4 2 1 2 8 32 8 1 1 0 1 3",
    "mha-rows-streams": "64 1000 4 4 3 2 8 32 8 1 1 0 0 0",
    "mha-overflow": "64 2048 4 4 1 1 16 640 32 1 1 0 0 0",
    "gqa4-shared-overflow": "64 2048 8 2 1 1 16 640 32 1 1 0 0 0",
    "over-limit": "64 20000 2 2 1 1 16 128 32 1 1 0 0 0",
    "calibrated": "64 2048 4 4 1 1 16 512 32 1 1 0 0 0 0 0.4 64 0.3",
    "f32-caches": "64 1000 4 4 1 1 16 128 32 0 1 0 0 0",
    "no-tickets": "64 1000 4 4 1 1 16 128 32 1 1 0 0 0",
}
EMU_FUSED_NOT = {"over-limit", "calibrated", "f32-caches", "no-tickets"}
EMU_FUSED_ENV = {"gqa4-perhead-window-radix": {"LLAMA_SPARQ_CUDA_SELECT": "radix"},
                 "no-tickets": {"SPARQ_EMU_NO_TICKETS": "1"}}


@pytest.mark.parametrize("case", list(EMU_CASES_FUSED))
def test_cuda_kernels_emulated_fused_in_one_launch(case):
    """LLAMA_SPARQ_CUDA_FUSED=1: where the one launch applies, k_sparq_fused alone (one launch; its
    blocks in a shuffled order, so the last block of each unit is any of them) gives the CPU op's
    output, selections and report, and leaves the layer's tickets zero for the next launch (the
    emulator checks); where it does not, the three launches run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_SPARQ_CUDA_")}
    env["LLAMA_SPARQ_CUDA_FUSED"] = "1"
    env.update(EMU_FUSED_ENV.get(case, {}))
    res = subprocess.run([str(tool_path(EMU_EXP)), *EMU_CASES_FUSED[case].split()], capture_output=True,
                         text=True, timeout=600, env=env)
    assert res.returncode == 0 and res.stdout.startswith("OK"), res.stdout + res.stderr[-2000:]
    assert re.search(r"sel_differ=(\d+)", res.stdout).group(1) == "0", res.stdout
    assert re.search(r"report_differ=(\d+)", res.stdout).group(1) == "0", res.stdout
    fused = case not in EMU_FUSED_NOT
    assert f"fused={int(fused)}" in res.stdout, res.stdout
    launches = int(re.search(r" launches=(\d+)", res.stdout).group(1))
    assert launches == (1 if fused else 3), res.stdout
    if fused:
        assert "attend_parts=1 " in res.stdout, res.stdout
    units = int(re.search(r"sparq_units=(\d+)", res.stdout).group(1))
    assert units > 0, res.stdout


def test_cuda_attend_part_size_from_the_environment():
    """LLAMA_SPARQ_CUDA_ATTEND_ITEMS sets the attend's positions per part (a GPU session times other
    sizes without a rebuild): smaller parts mean more of them, with the same cells and output; a value
    out of range is said and the default kept."""
    case = EMU_CASES["mha-f16-scalar-loads"].split()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_SPARQ_CUDA_")}

    def emu(**extra):
        res = subprocess.run([str(tool_path(EMU_EXP)), *case], capture_output=True, text=True, timeout=600,
                             env=dict(env, **extra))
        assert res.returncode == 0 and res.stdout.startswith("OK"), res.stdout + res.stderr[-2000:]
        assert re.search(r"sel_differ=(\d+)", res.stdout).group(1) == "0", res.stdout
        return int(re.search(r"attend_parts=(\d+)", res.stdout).group(1)), res.stderr

    default, _ = emu()
    small, _ = emu(LLAMA_SPARQ_CUDA_ATTEND_ITEMS="8")
    assert small > default > 1
    same, err = emu(LLAMA_SPARQ_CUDA_ATTEND_ITEMS="0")
    assert same == default and "LLAMA_SPARQ_CUDA_ATTEND_ITEMS=0 is not an integer in 1..1024" in err


@pytest.mark.parametrize("case,ties", [("64 4096 4 4 1 1 16 128 32 1 1 0 0 0", 4), ("64 4096 4 4 1 1 16 128 32 1 1 0 0 0", 24),
                                       ("128 2048 8 2 1 2 16 64 16 1 1 0 0 0", 4)],
                         ids=["mha-ties4", "mha-ties24", "gqa-ties4"])
def test_cuda_kernels_emulated_rank_equal_keys_as_the_cpu_op(case, ties):
    """Groups of exactly equal keys (SPARQ_EMU_TIES: each cell's key row copied from the first of
    its group) where the k-th key falls: the select's ranking of the crossing bin takes the lower
    cells first, as the CPU op does; a few ties by a count, many by a sort."""
    env = dict(os.environ, SPARQ_EMU_TIES=str(ties))
    env.pop("LLAMA_SPARQ_CUDA_SELECT", None)
    env.pop("LLAMA_SPARQ_CUDA_ATTEND", None)
    res = subprocess.run([str(tool_path(EMU)), *case.split()], capture_output=True, text=True,
                         timeout=600, env=env)
    assert res.returncode == 0 and res.stdout.startswith("OK"), res.stdout + res.stderr[-2000:]
    m = re.search(r"sel_differ=(\d+)", res.stdout)
    assert m and m.group(1) == "0", res.stdout


# every switch of the experimental build, each at a value that changes its launch
EMU_ALL_SWITCHES = {"LLAMA_SPARQ_CUDA_SELECT": "radix", "LLAMA_SPARQ_CUDA_SELECT_HIST": "atomic",
                    "LLAMA_SPARQ_CUDA_SELECT_LOADS": "early", "LLAMA_SPARQ_CUDA_ATTEND": "single",
                    "LLAMA_SPARQ_CUDA_ATTEND_ITEMS": "8", "LLAMA_SPARQ_CUDA_PDL": "1",
                    "LLAMA_SPARQ_CUDA_SCORE_HIST": "1", "LLAMA_SPARQ_CUDA_CALIB_HIST": "1",
                    "LLAMA_SPARQ_CUDA_DIFFUSE": "1", "LLAMA_SPARQ_CUDA_FUSED": "1"}


@pytest.mark.parametrize("case", ["mha-f16-scalar-loads", "calibrated-perhead-window"])
def test_cuda_kernels_emulated_default_build_reads_no_switch(case):
    """The default build compiles one pipeline and reads no LLAMA_SPARQ_CUDA_* switch: with every
    switch of the experimental build set, sparq-cuda-emu prints what it prints with none. The
    experimental build with none set runs that same pipeline (the same launches, output, selections
    and report), and with them set it takes other launches."""
    args = EMU_CASES[case].split()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_SPARQ_CUDA_")}

    def emu(tool, env):
        res = subprocess.run([str(tool_path(tool)), *args], capture_output=True, text=True, timeout=600, env=env)
        assert res.returncode == 0 and res.stdout.startswith("OK"), res.stdout + res.stderr[-2000:]
        return res.stdout

    default = emu(EMU, clean)
    assert emu(EMU, dict(clean, **EMU_ALL_SWITCHES)) == default
    assert emu(EMU_EXP, clean) == default
    assert emu(EMU_EXP, dict(clean, **EMU_ALL_SWITCHES)) != default


# The approximate bucketed top-k (SPARQ_EMU_BUCKETS=B: topk_buckets on the CPU op and the kernels):
# B = k (many cells per bucket, each selection tile spanning several cells of every bucket) with
# MHA, GQA's shared choice over two streams, per-head choice with a window list, several rows of two
# streams with a dense stream beside, the oracle without a mask and l = 0; B between k and S over
# three selection tiles (a bucket's cells in several tiles) with a window list; B >= S (one cell per
# bucket: the exact top-k); groups of equal keys wider than B (SPARQ_EMU_TIES: ties within a bucket
# and between offers, to the lower cell). Where the switches would take other paths (the score tiles'
# histogram, the one launch) the select tiles still choose; the radix mode and programmatic launches
# change nothing of it.
EMU_CASES_BUCKETS = {
    "mha-b-eq-k": ("64 2048 4 4 1 1 16 64 16 1 1 0 0 0", 64, {}),
    "gqa4-shared-streams": ("128 1000 8 2 1 2 16 64 16 0 1 0 0 0", 64, {}),
    "gqa4-perhead-window": ("64 1024 8 2 1 1 16 64 16 1 1 0 1 1", 80, {}),
    "rows-streams-dense-stream": ("64 1000 4 2 3 2 8 32 8 1 1 0 0 3", 32, {}),
    "oracle-l0-nomask": ("64 1024 4 2 1 1 16 64 0 0 0 1 0 0", 64, {}),
    "three-tiles-window": ("64 12000 4 4 1 1 16 128 32 1 1 0 0 1", 300, {}),
    "b-over-s-exact": ("64 2048 4 4 1 1 16 128 32 1 1 0 0 0", 4096, {}),
    "ties-within-buckets": ("64 2048 4 4 1 1 16 16 0 1 1 0 0 0", 16, {"SPARQ_EMU_TIES": "24"}),
    "score-hist-fused-switches": ("64 1000 4 4 1 1 16 64 16 1 1 0 0 0", 64,
                                  {"LLAMA_SPARQ_CUDA_SCORE_HIST": "1", "LLAMA_SPARQ_CUDA_FUSED": "1"}),
    "radix-pdl": ("64 1024 8 2 1 1 16 64 16 1 1 0 1 1", 64,
                  {"LLAMA_SPARQ_CUDA_SELECT": "radix", "LLAMA_SPARQ_CUDA_PDL": "1"}),
}


@pytest.mark.parametrize("case", list(EMU_CASES_BUCKETS))
def test_cuda_kernels_emulated_bucketed_topk_equal_the_cpu_op(case):
    """topk_buckets: the select tiles offer each eligible cell to its bucket (a 64-bit atomic maximum
    of key and cell), the list's last tile takes the best offers; the kernels choose the CPU op's
    cells (each bucket's best outside the window, ties to the lower cell, then the k - l best of
    those), with its output and report, in three launches of the select tiles' grid."""
    args, buckets, extra = EMU_CASES_BUCKETS[case]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_SPARQ_CUDA_")}
    env.pop("SPARQ_EMU_TIES", None)
    env.update(extra, SPARQ_EMU_BUCKETS=str(buckets))
    tool = EMU_EXP if any(k.startswith("LLAMA_SPARQ_CUDA_") for k in extra) else EMU
    res = subprocess.run([str(tool_path(tool)), *args.split()], capture_output=True, text=True,
                         timeout=600, env=env)
    assert res.returncode == 0 and res.stdout.startswith("OK"), res.stdout + res.stderr[-2000:]
    assert re.search(r"sel_differ=(\d+)", res.stdout).group(1) == "0", res.stdout
    assert re.search(r"report_differ=(\d+)", res.stdout).group(1) == "0", res.stdout
    S = int(args.split()[1])
    assert f"buckets={min(buckets, S)}" in res.stdout, res.stdout
    a = args.split()
    g, per_head = int(a[2]) // int(a[3]), int(a[12]) & 1
    lists = int(a[4]) * int(a[5]) * int(a[3]) * (g if per_head and g > 1 else 1)
    assert "score_hist=0 " in res.stdout and "fused=0 " in res.stdout, res.stdout
    assert f"select_blocks={lists * -(-S // 4096)} " in res.stdout, res.stdout
    assert re.search(r" launches=(\d+)", res.stdout).group(1) == "3", res.stdout
    assert int(re.search(r"sparq_units=(\d+)", res.stdout).group(1)) > 0, res.stdout


# ---------------------------------------------------------------------------
# what lets CUDA graphs replay a SparQ step, checked on the CPU (no GPU needed)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("k", ["16", "0"], ids=["fixed-k", "calibrated"])
def test_sparq_decode_graphs_are_reused_as_dense(tiny_gqa_model, k):
    """ggml's CUDA backend replays a captured CUDA graph as long as llama.cpp reuses the decode
    graph (its uid does not change, so no node is compared); a SparQ node or input that changed
    every step would force a new graph, an instantiation and direct launches each step. Here, on
    the CPU: a 40-token decode reuses its graph as often with SparQ as dense does (one build for
    the first SparQ step aside), with a fixed k and with the calibrated k."""
    prompt = " ".join(f"w{i % 50}" for i in range(250))  # about 1000 tokens

    def reused(extra):
        res = subprocess.run([str(tool_path("llama-completion")), "-m", str(tiny_gqa_model), "-p", prompt, "-n", "40",
                              "-no-cnv", "--temp", "0", "-t", "2", "-c", "2048", "-v", *extra], capture_output=True,
                             text=True, errors="replace", timeout=300, stdin=subprocess.DEVNULL)
        assert res.returncode == 0, res.stderr[-3000:]
        m = re.search(r"graphs reused\s*=\s*(\d+)", res.stderr)
        assert m, res.stderr[-3000:]
        return int(m.group(1)), res.stderr

    dense, _ = reused([])
    sparq, log = reused(["--sparq", "--sparq-k", k, "--sparq-min-kv", "0"])
    m = re.search(r"SparQ calls = (\d+)", log)
    assert m and int(m.group(1)) >= 2 * 39, log[-2000:]  # 2 layers, every decode step SparQ
    assert dense >= 30 and sparq >= dense - 1, (dense, sparq)


# ---------------------------------------------------------------------------
# the device rebuild's graph, checked on the CPU (no GPU needed)
# ---------------------------------------------------------------------------

def _rebuild_scenario(llm_args: dict, graph_rebuild=False):
    """SparQ through removals, a context shift, a state load and a synthetic fill of part of the
    cache, each followed by a rebuild (with graph_rebuild, a cache in host memory rebuilt by the
    device's graph, on the CPU backend): the logits after each and llama_sparq_debug_check's
    differences between the data SparQ keeps and a recomputation from K, V and the cells."""
    from llama_sparq import Llama, _sparq

    sp = Llama(**llm_args)
    _sparq.debug_graph_rebuild(sp._ctx.ctx, graph_rebuild)
    rng = np.random.default_rng(4)
    prompt = [1] + rng.integers(3, sp.n_vocab(), size=399).tolist()
    sp.eval(prompt)
    out, checks = [], []
    n = sp.n_tokens
    assert sp._ctx.kv_cache_seq_rm(0, n - 50, -1)
    sp.n_tokens = n - 50
    for t in (11, 12, 13):
        sp.eval([t])
        out.append(np.array(sp.scores[sp.n_tokens - 1], dtype=np.float64))
    checks.append(_sparq.debug_check(sp._ctx.ctx))
    n = sp.n_tokens
    sp._ctx.kv_cache_seq_rm(0, 10, 110)
    sp._ctx.kv_cache_seq_shift(0, 110, n, -100)
    sp.n_tokens = n - 100
    sp.eval([5])
    out.append(np.array(sp.scores[sp.n_tokens - 1], dtype=np.float64))
    checks.append(_sparq.debug_check(sp._ctx.ctx))
    state = sp.save_state()
    sp.eval([7])
    sp.load_state(state)
    sp.eval([7])
    out.append(np.array(sp.scores[sp.n_tokens - 1], dtype=np.float64))
    checks.append(_sparq.debug_check(sp._ctx.ctx))
    # a fill of fewer cells than the cache holds: K^T's rows are written with the cache's stride
    sp.reset()
    sp._ctx.kv_cache_clear()
    _sparq.bench_fill(sp._ctx.ctx, 700, seed=2)
    sp.n_tokens = 700
    sp.eval([9])
    out.append(np.array(sp.scores[sp.n_tokens - 1], dtype=np.float64))
    checks.append(_sparq.debug_check(sp._ctx.ctx))
    assert sp.sparq_stats()["n_rebuilds"] >= 4
    return np.array(out), checks


def _rebuild_args(model, **kw) -> dict:
    return dict(model_path=str(model), n_ctx=2048, n_threads=2, n_batch=512, verbose=False, seed=0,
                logits_all=True, flash_attn=True, sparq=True, sparq_k=32, sparq_min_kv=0, **kw)


def test_graph_rebuild_equals_the_host_rebuild(tiny_gqa_model):
    """The rebuild that runs on the GPU when the cache is in VRAM (a ggml graph per layer: K
    transposed into K^T, V and k^2 summed over the used cells by products) runs here on the CPU
    backend (llama_sparq_debug_graph_rebuild) after removals, a context shift, a state load and a
    synthetic fill; the data it leaves equals the host recomputation (llama_sparq_debug_check), and
    SparQ's logits equal those of the host rebuild."""
    host, _ = _rebuild_scenario(_rebuild_args(tiny_gqa_model))
    graph, checks = _rebuild_scenario(_rebuild_args(tiny_gqa_model), graph_rebuild=True)
    assert max(checks) <= 1e-3, checks
    assert np.abs(graph - host).max() <= 1e-4 * np.abs(host).max()


def test_gpu_rebuild_equals_the_host_rebuild(cuda, tiny_gqa_model):
    """The same on the GPU, where the graph runs on the CUDA backend: the K^T, V and k^2 sums it
    leaves in VRAM equal a recomputation from the cache (CUDA's copy of a transposed source once
    wrote K^T's rows contiguously, ignoring their stride: every GPU rebuild of fewer cells than the
    cache holds scrambled K^T), and the logits follow the CPU's host rebuild."""
    host, _ = _rebuild_scenario(_rebuild_args(tiny_gqa_model))
    gpu, checks = _rebuild_scenario(_rebuild_args(tiny_gqa_model, n_gpu_layers=-1))
    assert max(checks) <= 1e-3, checks
    assert np.abs(gpu - host).max() <= 2e-2 * np.abs(host).max()
