"""SparQ on a quantized K/V cache, q8_0 and the 4- and 5-bit q4_0, q4_1, q5_0, q5_1 and iq4_nl: the op
reads the chosen K and V rows from their blocks and keeps K^T in f16 of the dequantized keys
(docs/algorithm.md, "Where it applies"). q8_0 runs every check; the other types run the same checks
through parameters (exact settings against dense, the op against the reference, the counters, the
cache operations, the tools).

On a tiny generated model with head size 64 (upstream rotates q and k with a Walsh-Hadamard matrix
for a quantized K cache of head size % 64 == 0; LLAMA_ATTN_ROT_DISABLE=1 turns that off): exact
settings equal dense attention on the same q8_0 cache, the op equals the NumPy reference on its
own tensors, K^T and the sums stay equal to a recomputation through state save/load, sequence
removal, shifts, and both rebuild paths; the counters count bytes; the tools run with
-ctk/-ctv q8_0."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from sparq_ctx import Ctx, Model, make_llm, prefill, rand_prompt, rand_tokens, step, teacher_forced

from llama_sparq import tool_path
from sparq_lab import cost, reference
from sparq_lab._reference_kt4 import kt4_encode

TOL = 1e-3
Q8_0, F16, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL = 8, 1, 2, 3, 6, 7, 20  # ggml type ids (llama_cpp.GGML_TYPE_*)
TYPE_NAMES = {Q8_0: "q8_0", F16: "f16", Q4_0: "q4_0", Q4_1: "q4_1", Q5_0: "q5_0", Q5_1: "q5_1", IQ4_NL: "iq4_nl"}
BLOCKS_4_5 = (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL)  # the 4- and 5-bit types


@pytest.fixture(scope="module")
def q8_model(tmp_path_factory):
    """A tiny random llama model with head size 64 (blocks of 32; Hadamard-rotated q and k under a
    quantized K cache) and GQA (2 query heads per KV head)."""
    from sparq_lab.models import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-d64.gguf", n_layer=2, n_embd=256, n_head=4,
                           n_head_kv=2, seed=11)


def llm_q8(model, type_k=Q8_0, type_v=Q8_0, **kw):
    return make_llm(model, **{"logits_all": True, "flash_attn": True, "type_k": type_k, "type_v": type_v, **kw})


EXACT_TYPES = [((Q8_0, Q8_0), "on"), ((Q8_0, Q8_0), "off"), ((Q8_0, F16), "on"), ((F16, Q8_0), "on"),
               *(((t, t), "on") for t in BLOCKS_4_5), ((Q4_0, Q4_0), "off"), ((Q4_0, Q8_0), "on"),
               ((Q4_0, F16), "on"), ((F16, IQ4_NL), "on"), ((Q5_1, Q4_1), "off")]


@pytest.mark.parametrize("types,rot", EXACT_TYPES,
                         ids=[f"k{TYPE_NAMES[k]}-v{TYPE_NAMES[v]}" + ("-norot" if r == "off" else "")
                              for (k, v), r in EXACT_TYPES])
def test_exact_settings_equal_dense_quantized(q8_model, monkeypatch, types, rot):
    """r = d and k >= S: SparQ's exact attention over every cell, reading the quantized rows, equals
    upstream's dense attention on the same cache to float rounding (upstream rounds q to q8_0 for the
    K dot, the op does not: the logits agree to that rounding, 2e-4 of 1.1 here for q8_0), with K and
    V types apart too. With an f16 V, upstream's flash attention accumulates V in f16 (5e-3 of 1.1 from
    either f32 path): the reference is then upstream's other dense path (-fa 0, V transposed), and the
    gap between upstream's two dense paths bounds the op's from it."""
    if rot == "off":
        monkeypatch.setenv("LLAMA_ATTN_ROT_DISABLE", "1")
    prompt = rand_prompt(1200, 1, 260)
    dense = llm_q8(q8_model, *types, flash_attn=types[1] != F16)
    cont = [int(t) for t in np.random.default_rng(2).integers(3, 260, size=12)]
    want = teacher_forced(dense, prompt, cont)
    sp = llm_q8(q8_model, *types, sparq=True, sparq_r=64, sparq_k=4096, sparq_min_kv=0)
    got = teacher_forced(sp, prompt, cont)
    st = sp.sparq_stats()
    assert st["n_sparq"] == 2 * 12 and st["n_dense"]["cache_type"] == 0, st
    assert st["compression"] == pytest.approx(1.0)  # S <= k: a dense step, counted at 1
    tol = 1e-3 * np.abs(want).max() + 1e-4
    if types[1] == F16:  # upstream's own spread between its two dense paths, where both run (an f16 V)
        spread = np.abs(teacher_forced(llm_q8(q8_model, *types, flash_attn=True), prompt, cont) - want).max()
        print(f"upstream's -fa 1 against -fa 0: {spread:.3g}")
        tol = max(tol, spread)
    print(f"max |SparQ exact - dense| {np.abs(got - want).max():.3g} of {np.abs(want).max():.3g} (allowed {tol:.3g})")
    assert np.abs(got - want).max() <= tol, np.abs(got - want).max()
    assert np.array_equal(got.argmax(axis=1), want.argmax(axis=1))
    assert sp.sparq_debug_check(sync=True) <= TOL


def hadamard(n):
    """Upstream's Walsh-Hadamard matrix (Sylvester's, orthonormal, symmetric: its own inverse)."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


LEVELS = {Q8_0: 255, Q4_0: 16, Q4_1: 16, Q5_0: 32, Q5_1: 32, IQ4_NL: 16}  # distinct values a block can hold


def check_block_values(K, type_k):
    """K's values (the capture's dequantization) are blocks of type_k: at most LEVELS values per block
    of 32, and (but iq4_nl, whose scale ggml searches for) a fixed point of the reference's quantizer."""
    b = K.reshape(-1, 32)
    assert max(len(np.unique(r)) for r in b) <= LEVELS[type_k], "K's values are not blocks of the cache's type"
    if type_k != IQ4_NL:
        assert np.array_equal(reference.round_kv(K, TYPE_NAMES[type_k]), K), "K's values are not the type's blocks"


def check_calls(calls, settings, min_calls, rotated=True, type_k=Q8_0):
    """Every captured call: K's values are blocks of type_k (dequantized by the capture), K^T holds their
    f16 rotated back from upstream's Hadamard rotation (rotated) with the query rotated back for steps
    1-2, or as they are (the PCA basis: K^T in its own axes; no rotation), and the op's output equals
    the reference on the same tensors with the cache's rounding (kv_quant)."""
    from test_selectors import check_calls_against_reference

    from sparq_lab.capture import stream0

    pca = settings.get("sparq_basis") == "pca"
    h = hadamard(64)
    for c in calls:
        x = stream0(c)
        valid = np.isfinite(x["mask"][0])
        kt = c["KT"][0].transpose(2, 0, 1).astype(np.float64)  # ggml [n_kv, d, hkv, ns] -> (n_kv, hkv, d)
        check_block_values(x["K"][valid], type_k)
        if pca:
            continue
        want = x["K"][valid] @ h if rotated else x["K"][valid]
        if c["kt_bits"] == 4:
            # the 4-bit K^T (the default): each value within half its block's bin (the block's scale,
            # of the keys of all its cells) of the exact one, plus one f16 rounding of the rotation
            e, _ = kt4_encode(x["K"] @ h if rotated else x["K"], axis=0)
            s = np.ldexp(1.0, np.repeat(e, 32, axis=0)[: len(valid)])[valid]
            err = np.abs(kt[valid] - want) - (0.5 * s + 2 ** -10 * np.abs(want) + 1e-6)
            assert err.max() <= 0, (c["layer"], err.max())
        else:
            # the f16 of the f32 rotation: within one f16 rounding of the exact one (an 8-bit K^T:
            # within one e5m2 rounding, two mantissa bits, subnormals down to 2^-16)
            rtol, atol = (2 ** -10, 1e-6) if c["kt_bits"] == 16 else (2 ** -3, 2 ** -16)
            assert np.allclose(kt[valid], want, rtol=rtol, atol=atol), (c["layer"], np.abs(kt[valid] - want).max())
        if rotated and settings.get("sparq_selector") not in ("index", "h2o"):  # (those read no K^T)
            assert c["q_sel"] is not None and np.allclose(x["q_sel"], x["q"] @ h, rtol=1e-5, atol=1e-6)
        if rotated:
            assert np.abs(kt[valid] - x["K"][valid]).max() > 0.01  # upstream did rotate: the bases differ
        elif c["q_sel"] is None:
            kt_want = {16: lambda K: K.astype(np.float16), 8: reference.round_e5m2,
                       4: lambda K: reference.round_kt4(K, axis=0)}[c["kt_bits"]](x["K"])  # blocks of all cells
            assert np.array_equal(kt[valid], kt_want[valid]), c["layer"]
    check_calls_against_reference(calls, settings, min_calls, kv_quant=TYPE_NAMES[type_k])


REF_RUNS = [(Q8_0, v) for v in ("scaled", "model", "pca", "oracle", "index", "h2o", "scaled-norot")] + [
    (Q4_0, "scaled"), (Q4_0, "index"), (Q4_0, "h2o"), (Q4_1, "scaled-norot"), (Q5_0, "pca"), (Q5_1, "oracle"),
    (IQ4_NL, "scaled"), (IQ4_NL, "model")]


@pytest.mark.parametrize("type_kv,variant", REF_RUNS, ids=[f"{TYPE_NAMES[t]}-{v}" for t, v in REF_RUNS])
def test_op_equals_reference_on_quantized_tensors(q8_model, monkeypatch, type_kv, variant):
    """k = 64 < S ~ 700: selection runs on the kept K^T, exact attention on the quantized rows; with
    upstream's rotation (the default for head size 64) and without it (LLAMA_ATTN_ROT_DISABLE=1)."""
    from sparq_lab.capture import Capture

    rotated = not variant.endswith("-norot")
    if not rotated:
        monkeypatch.setenv("LLAMA_ATTN_ROT_DISABLE", "1")
        variant = variant.removesuffix("-norot")

    extra = {"scaled": {}, "model": dict(sparq_basis="model"), "pca": dict(sparq_basis="pca"),
             "oracle": dict(sparq_selector="oracle"),
             "index": dict(sparq_selector="index", sparq_index_lists=16, sparq_index_probe=4),
             "h2o": dict(sparq_selector="h2o")}[variant]
    settings = dict(sparq_r=16, sparq_k=64, sparq_l=16, sparq_min_kv=0, **extra)
    llm = llm_q8(q8_model, type_kv, type_kv, sparq=True, **settings)
    llm.reset()
    llm.eval(rand_prompt(700, 5, 260))
    with Capture(llm) as cap:
        for t in rand_prompt(3, 6, 260):
            llm.eval([t])
    check_calls(cap.calls, settings, min_calls=2 * 3, rotated=rotated, type_k=type_kv)
    assert llm.sparq_stats()["n_sparq"] >= 6
    assert llm.sparq_debug_check(sync=True) <= (2e-2 if variant == "pca" else TOL)


@pytest.mark.parametrize("type_kv", [Q8_0, Q4_0, Q5_1], ids=lambda t: TYPE_NAMES[t])
def test_counters_count_bytes(q8_model, type_kv):
    """A fixed k: the counters' compression is the cost model's ratio of bytes for a quantized cache
    (K and V rows 34/32 bytes per value for q8_0, 18/32 for q4_0, 24/32 for q5_1; K^T 2), not of elements."""
    S_prompt, steps = 1500, 4
    llm = llm_q8(q8_model, type_kv, type_kv, sparq=True, sparq_r=16, sparq_k=128, sparq_l=32, sparq_min_kv=0, sparq_basis="model",
                 sparq_kt_bits=16)
    llm.reset()
    llm.eval(rand_prompt(S_prompt, 7, 260))
    llm.reset_sparq_stats()
    for i, t in enumerate(rand_prompt(steps, 8, 260)):
        llm.eval([t])
    st = llm.sparq_stats()
    assert st["n_sparq"] == 2 * steps
    want = np.mean([cost.compression(S_prompt + 1 + i, 64, 16, 128, kv_type=TYPE_NAMES[type_kv]) for i in range(steps)])
    assert st["compression"] == pytest.approx(want, rel=1e-6)
    assert st["compression"] > cost.compression(S_prompt, 64, 16, 128)  # K^T's f16 weighs more beside 8-bit rows


def decode_after_prompt(llm, n_prompt, n_steps, seed):
    """A random prompt prefilled, then n_steps decode steps counted from zero."""
    llm.reset()
    llm.eval(rand_prompt(n_prompt, seed, 260))
    llm.reset_sparq_stats()
    for t in rand_prompt(n_steps, seed + 1, 260):
        llm.eval([t])


@pytest.mark.parametrize("type_kv", [Q8_0, *BLOCKS_4_5], ids=lambda t: TYPE_NAMES[t])
def test_calibrated_defaults_run_on_quantized(q8_model, type_kv):
    """sparq=True on a quantized cache: SparQ calls, no cache_type dense calls, K^T current."""
    llm = llm_q8(q8_model, type_kv, type_kv, sparq=True, sparq_min_kv=0)
    decode_after_prompt(llm, 1100, 6, seed=9)
    st = llm.sparq_stats()
    assert st["n_dense"]["cache_type"] == 0, st
    assert st["n_sparq"] == 2 * 6, st
    assert llm.sparq_debug_check(sync=True) <= TOL


@pytest.mark.parametrize("types,k_min", [((Q8_0, Q8_0), 256), ((Q8_0, F16), 256), ((F16, Q8_0), 256),
                                         ((F16, F16), 128), ((Q4_0, Q4_0), 256)],
                         ids=["q8_0", "kq8_0-vf16", "kf16-vq8_0", "f16", "q4_0"])
def test_k_min_default_follows_the_cache_type(q8_model, types, k_min):
    """k_min = 0 (the default) resolves by the cache's types, 256 where K or V is quantized (a q8_0 cell
    costs half an f16 one's bytes, a q4_0 cell less): read back, and in the op's cells; a k_min given
    is kept."""
    llm = llm_q8(q8_model, type_k=types[0], type_v=types[1], sparq=True, sparq_min_kv=0)
    assert llm.sparq_params()["sparq_k_min"] == k_min
    decode_after_prompt(llm, 1300, 4, seed=12)
    layers = llm.sparq_layer_stats()
    assert all(L["n_measured"] > 0 and L["mean_k"] >= k_min - 1e-9 for L in layers), layers
    llm.set_sparq(sparq=True, sparq_k_min=100)
    assert llm.sparq_params()["sparq_k_min"] == 100
    llm.set_sparq(sparq=True, sparq_k_min=0)
    assert llm.sparq_params()["sparq_k_min"] == k_min


# ---------------------------------------------------------------------------
# cache operations: K^T and the sums equal a recomputation from the q8_0 cache
# ---------------------------------------------------------------------------

SPARSE = dict(enabled=True, r=16, k=32, l=8, min_kv=0, all_rows=False, basis="model")


@pytest.fixture(scope="module")
def q8m(q8_model):
    return Model(q8_model)


def fresh(model, prompt, first, toks, n_seq=1, type_kv=Q8_0):
    """SparQ logits of a fresh quantized context that reached the same cache directly: the prompt
    prefilled and the first tokens decoded one at a time, as the context under test did (a token's
    key from a prompt's batch may differ in its last bits, which a 4-bit cache can round a whole step
    apart), then toks decoded."""
    c = Ctx(model, n_seq=n_seq, type_k=type_kv, type_v=type_kv)
    c.sparq(**SPARSE)
    prefill(c, 0, prompt)
    for t in first:
        step(c, 0, t)
    out = [step(c, 0, t) for t in toks]
    c.free()
    return np.array(out)


@pytest.mark.parametrize("type_kv,rebuild", [(Q8_0, "host"), (Q8_0, "graph"), (Q4_0, "host"), (Q4_1, "graph"),
                                             (IQ4_NL, "host")], ids=lambda x: TYPE_NAMES.get(x, x))
def test_cache_operations_keep_kt_exact(q8m, type_kv, rebuild):
    """State save/load (whole and one sequence) over other content, sequence removal, a context shift
    (upstream re-ropes the quantized keys: dequantized, rotated back, roped, rotated, quantized) and a
    division, with the host rebuild and with the device-graph rebuild (on the CPU backend)."""
    rng = np.random.default_rng(3)
    a, b = rand_tokens(rng, 400, q8m.n_vocab), rand_tokens(rng, 400, q8m.n_vocab)
    toks = rand_tokens(rng, 3, q8m.n_vocab)
    c = Ctx(q8m, n_seq=1, type_k=type_kv, type_v=type_kv)
    c.sparq(**SPARSE)
    c.debug_graph_rebuild(rebuild == "graph")
    prefill(c, 0, a)
    step(c, 0, toks[0])
    assert c.check() <= TOL
    whole, seq = c.state_get(), c.seq_state_get(0)
    c.seq_rm(0, 0, -1)
    prefill(c, 0, b)
    assert c.check() <= TOL
    for load in ("whole", "seq"):
        if load == "whole":
            c.state_set(whole)
        else:
            c.seq_rm(0, 0, -1)
            prefill(c, 0, b)
            assert c.seq_state_set(seq, 0) > 0
        got = np.array([step(c, 0, t) for t in toks[1:]])
        assert c.check() <= TOL
        want = fresh(q8m, a, toks[:1], toks[1:], type_kv=type_kv)
        assert np.abs(got - want).max() <= 1e-3 * np.abs(want).max(), load
        c.seq_rm(0, c.pos_max(0) - 1, -1)  # the two steps again next time
    reb = c.stats()["n_rebuilds"]
    c.seq_rm(0, 50, 150)
    c.seq_add(0, 150, -1, -100)  # a context shift: K re-roped at the next update
    step(c, 0, toks[0])
    assert c.check() <= TOL
    c.seq_div(0, 100, -1, 2)
    c.sync()
    assert c.check() <= TOL
    step(c, 0, toks[1])
    assert c.check(sync=True) <= TOL
    assert c.stats()["n_rebuilds"] > reb
    c.free()


# ---------------------------------------------------------------------------
# the tools
# ---------------------------------------------------------------------------

def run(cmd, timeout=300):
    return subprocess.run([str(x) for x in cmd], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("type_kv", ["q8_0", "q4_0", "q5_1"])
def test_completion_runs_sparq_on_quantized(q8_model, type_kv):
    from test_sparq_tools import sparq_counters

    res = run([tool_path("llama-completion"), "-m", q8_model, "-p", "hello " * 300, "-n", "8", "-no-cnv", "-t", "2",
               "--temp", "0", "--ignore-eos", "-ctk", type_kv, "-ctv", type_kv, "--sparq", "--sparq-k", "64",
               "--sparq-min-kv", "0", "-v"])
    assert res.returncode == 0, res.stderr[-2000:]
    assert "SparQ on: " in res.stderr and "; 2 layers" in res.stderr, res.stderr[-3000:]
    assert "a type SparQ does not read" not in res.stderr  # no layer dense for its cache type
    assert sparq_counters(res.stderr)["n_sparq"] >= 2 * 7


@pytest.mark.parametrize("type_kv", ["q8_0", "q4_0", "iq4_nl"])
def test_bench_runs_sparq_on_quantized(q8_model, type_kv):
    """llama-bench with -ctk/-ctv of a quantized type: the depth prefilled, and filled synthetically in
    that type's blocks."""
    for fill in ([], ["--depth-fill", "synthetic"]):
        res = run([tool_path("llama-bench"), "-m", q8_model, "-ctk", type_kv, "-ctv", type_kv, "-fa", "1",
                   "--sparq", "0,1", "--sparq-k", "64", "--sparq-min-kv", "0", "-d", "1024", "-p", "0", "-n", "4",
                   "-r", "1", "-t", "2", "-o", "json", *fill])
        assert res.returncode == 0, res.stderr[-2000:]
        rows = json.loads(res.stdout)
        assert [r["type_k"] for r in rows] == [type_kv, type_kv]
        dense, sp = sorted(rows, key=lambda r: r["sparq"])
        assert dense["sparq_calls"] == 0 and sp["sparq_calls"] > 0, rows
