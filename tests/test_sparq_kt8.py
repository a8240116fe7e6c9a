"""An 8-bit K^T (sparq_kt_bits = 8: e5m2, f16's upper byte): the rounding of C and of the NumPy
reference bit for bit, exact settings still equal to dense, the kept K^T equal to a recomputation
after appends and cache operations (host and graph rebuilds, f16 and f32 caches), the switch on a
live context, the counters' compression (one byte a K^T element, as the cost model) and bad values."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from sparq_ctx import rand_prompt
from test_sparq_llama import cache_operations_keep_data_exact, debug_check, decode_greedy, make_llm, n_vocab, step

from sparq_lab import cost
from sparq_lab.reference import round_e5m2

HEAD = 16  # both tiny models' head size


def test_reference_rounding_cases():
    """Ties to even on the f16 bits, saturation at the largest finite e5m2, Inf and NaN kept."""
    x = np.array([1.0, 1.125, 1.375, -1.375, 57344.0, 60000.0, 65504.0, -65504.0, np.inf, -np.inf, 0.0,
                  2.0 ** -16, 3 * 2.0 ** -17], np.float32)
    want = np.array([1.0, 1.0, 1.5, -1.5, 57344.0, 57344.0, 57344.0, -57344.0, np.inf, -np.inf, 0.0,
                     2.0 ** -16, 2.0 ** -15], np.float32)
    assert np.array_equal(round_e5m2(x), want)
    assert np.isnan(round_e5m2(np.float32("nan")))


def test_reference_rounding_equals_the_c_rounding(tmp_path):
    """Every f16 bit pattern through ggml_sparq_f16_to_e5m2 (the header the kernels, CUDA and the
    emulator share) and through round_e5m2 gives the same byte (NaNs: both NaN)."""
    from pathlib import Path

    inc = Path(__file__).resolve().parent.parent / "ggml-sparq" / "include"
    src = tmp_path / "e5m2.c"
    src.write_text('#include "ggml-sparq-e5m2.h"\n#include <stdio.h>\n'
                   "int main(void) { for (unsigned h = 0; h < 65536; ++h) "
                   "putchar(ggml_sparq_f16_to_e5m2((uint16_t) h)); return 0; }\n")
    exe = tmp_path / "e5m2"
    subprocess.run(["cc", "-O1", f"-I{inc}", str(src), "-o", str(exe)], check=True, capture_output=True)
    got = np.frombuffer(subprocess.run([str(exe)], check=True, capture_output=True).stdout, np.uint8)
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    want = round_e5m2(h)
    got_f = (got.astype(np.uint16) << 8).view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got_f), nan)
    assert np.array_equal(got_f[~nan], want[~nan])


@pytest.mark.parametrize("graph_rebuild", [False, True], ids=["host-rebuild", "graph-rebuild"])
@pytest.mark.parametrize("cache", ["f16", "f32"])
def test_kt8_equals_a_recomputation_after_cache_operations(tiny_gqa_model, graph_rebuild, cache):
    """The appends (the op's append mode) and the rebuilds (host, or the device graph on the CPU
    backend) round the keys alike: debug_check finds K^T as a recomputation gives it."""
    from llama_sparq import _sparq

    tk = {"f16": 1, "f32": 0}[cache]
    sp = make_llm(tiny_gqa_model, sparq=True, sparq_k=32, sparq_min_kv=0, sparq_kt_bits=8, type_k=tk, type_v=tk)
    _sparq.debug_graph_rebuild(sp._ctx.ctx, graph_rebuild)
    cache_operations_keep_data_exact(sp, n_decode=6)


def test_kt_bits_switched_on_a_live_context(tiny_gqa_model):
    """K^T is allocated again in the new type and every stream rebuilt into it; back at 16 the
    logits are those of a context that never switched."""
    ref16 = make_llm(tiny_gqa_model, sparq=True, sparq_k=32, sparq_min_kv=0, sparq_kt_bits=16)
    prompt = rand_prompt(400, 7, n_vocab(ref16))
    _, want = decode_greedy(ref16, prompt, 4)
    sp = make_llm(tiny_gqa_model, sparq=True, sparq_k=32, sparq_min_kv=0, sparq_kt_bits=16)
    decode_greedy(sp, prompt, 2)
    bytes16 = sp.sparq_stats()["extra_bytes"]
    sp.set_sparq(sparq_kt_bits=8)
    assert sp.sparq_params()["sparq_kt_bits"] == 8
    st = sp.sparq_stats()
    assert st["extra_bytes"] < bytes16
    reb = st["n_rebuilds"]
    step(sp, 3)
    assert sp.sparq_stats()["n_rebuilds"] > reb
    assert debug_check(sp) <= 1e-3
    sp.set_sparq(sparq_kt_bits=16)
    assert sp.sparq_stats()["extra_bytes"] == bytes16
    _, got = decode_greedy(sp, prompt, 4)
    assert debug_check(sp) <= 1e-3
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_kt8_compression_is_the_cost_models(tiny_model):
    """The counters count a K^T element at one byte: the mean compression of the same decode
    steps is lower than with f16 K^T, each equal to the cost model's (cost.compression)."""
    r, k, n = HEAD // 4, 32, 10
    got = {}
    for bits in (16, 8):
        sp = make_llm(tiny_model, sparq=True, sparq_r=r, sparq_k=k, sparq_min_kv=0, sparq_kt_bits=bits)
        prompt = rand_prompt(300, 8, n_vocab(sp))
        decode_greedy(sp, prompt, n)
        st = sp.sparq_stats()
        assert st["n_sparq"] == 2 * n
        got[bits] = st["compression"]
        S = np.arange(len(prompt), len(prompt) + n)  # the cells each decode step attends over
        want = float(np.mean(cost.compression(S, HEAD, r, k, kt_bits=bits)))
        assert abs(got[bits] - want) < 2e-3, (bits, got[bits], want)
    assert got[8] < got[16]


@pytest.mark.parametrize("bits", [16, 8])
def test_default_r_follows_kt_bits(tiny_model, bits):
    """r = 0 resolves to cost.default_r: d / 4 with f16 K^T, 5 d / 16 with an 8-bit one (4 and 5
    at this head size), as the counters' compression shows against the cost model's."""
    k, n = 32, 6
    r = cost.default_r(HEAD, bits)
    assert r == {16: 4, 8: 5}[bits]
    sp = make_llm(tiny_model, sparq=True, sparq_k=k, sparq_min_kv=0, sparq_kt_bits=bits)
    assert sp.sparq_params()["sparq_r"] == 0
    prompt = rand_prompt(300, 9, n_vocab(sp))
    decode_greedy(sp, prompt, n)
    S = np.arange(len(prompt), len(prompt) + n)
    got = sp.sparq_stats()["compression"]
    for rr in (r - 1, r + 1):  # the neighbours' compression is told apart at this tolerance
        assert abs(got - float(np.mean(cost.compression(S, HEAD, rr, k, kt_bits=bits)))) > 2e-3
    assert abs(got - float(np.mean(cost.compression(S, HEAD, r, k, kt_bits=bits)))) < 2e-3
