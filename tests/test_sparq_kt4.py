"""A 4-bit K^T (sparq_kt_bits = 4: blocks of 32 cells with a power-of-two scale, stored as q4_1):
the C write (ggml-sparq-kt4.h, shared by the CPU, CUDA and the emulator) and the NumPy reference
bit for bit, whatever order a block's cells are written in; the kept K^T equal to a recomputation
after appends and cache operations; state save and load; the counters' compression; bad values."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from sparq_lab.reference import round_kt4
from sparq_lab._reference_kt4 import kt4_encode, kt4_row_bytes

INC = Path(__file__).resolve().parent.parent / "ggml-sparq" / "include"

# reads (n, then n f16 values, then n cell indices: the order of the writes) from stdin and writes
# the row's q4_1 bytes after ggml_sparq_kt4_put of each cell in that order
PUT_MAIN = r"""
#include "ggml-sparq-kt4.h"
#include <stdio.h>
#include <stdlib.h>
int main(void) {
    int n;
    if (fread(&n, 4, 1, stdin) != 1) return 1;
    uint16_t * h = malloc(2 * (size_t) n);
    int32_t * ord = malloc(4 * (size_t) n);
    uint8_t * row = calloc((size_t) n / 32, 20);
    if (fread(h, 2, (size_t) n, stdin) != (size_t) n || fread(ord, 4, (size_t) n, stdin) != (size_t) n) return 1;
    for (int i = 0; i < n; ++i) ggml_sparq_kt4_put(row, ord[i], h[ord[i]]);
    fwrite(row, 20, (size_t) n / 32, stdout);
    return 0;
}
"""


@pytest.fixture(scope="module")
def put_exe(tmp_path_factory):
    d = tmp_path_factory.mktemp("kt4")
    src = d / "put.c"
    src.write_text(PUT_MAIN)
    exe = d / "put"
    subprocess.run(["cc", "-O1", "-Wall", "-Werror", f"-I{INC}", str(src), "-o", str(exe)], check=True,
                   capture_output=True)
    return exe


def c_puts(exe, x, order):
    h = np.asarray(x, np.float32).astype(np.float16)
    data = np.int32(h.size).tobytes() + h.tobytes() + np.asarray(order, np.int32).tobytes()
    return subprocess.run([str(exe)], input=data, check=True, capture_output=True).stdout


def test_reference_rounding_cases():
    """Each block's scale is the smallest power of two holding its values in [-8 s, 8 s); a value
    reads as its floor bin's midpoint."""
    x = np.zeros(64, np.float32)
    x[:4] = [1.0, -1.0, 0.3, 7.99]      # block 0: 7.99 < 8 -> s = 1
    x[32:35] = [-8.0, 0.1, 3.0]         # block 1: -8 >= -8 s -> s = 1
    y = round_kt4(x)
    assert np.array_equal(y[:4], [1.5, -0.5, 0.5, 7.5])
    assert np.array_equal(y[32:35], [-7.5, 0.5, 3.5])
    assert y[4] == 0.5 and y[40] == 0.5
    x[0] = 8.0                            # needs s = 2: every bin of block 0 halves
    assert np.array_equal(round_kt4(x)[:4], [9.0, -1.0, 1.0, 7.0])
    e, _ = kt4_encode(np.array([0.0] * 32 + [65504.0] + [0.0] * 31 + [np.inf] + [0.0] * 31, np.float32))
    assert list(e) == [-23, 13, -23]


@pytest.mark.parametrize("scale", [1e-6, 1e-2, 1.0, 300.0, 3e4])
def test_c_put_equals_the_reference_in_any_order(put_exe, scale):
    """Cell by cell in order, in reverse, shuffled: the same bytes as the reference's rounding of the
    whole row (the scale a block grows to shifts its bins exactly)."""
    rng = np.random.default_rng(int(scale * 1e6) % 1000)
    n = 256
    x = (rng.standard_normal(n) * scale * np.exp(rng.uniform(-3, 3, n))).astype(np.float32)
    x[rng.integers(0, n, 8)] = 0.0
    x[rng.integers(0, n, 4)] *= -1
    x = np.clip(x, -65504, 65504)
    want = kt4_row_bytes(x)
    for order in (np.arange(n), np.arange(n)[::-1], rng.permutation(n)):
        assert c_puts(put_exe, x, order) == want


def test_c_put_every_f16_value(put_exe):
    """Every finite f16 value, one per block with its neighbours zero and written after it and
    before it: the bins and scales of the reference."""
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    h = h[np.isfinite(h)].astype(np.float32)
    x = np.zeros((h.size, 32), np.float32)
    x[:, 5] = h
    x[:, 6] = -h / 3
    x = x.reshape(-1)
    order = np.arange(x.size).reshape(-1, 32)[:, ::-1].reshape(-1)
    assert c_puts(put_exe, x, order) == kt4_row_bytes(x)


# ----------------------------------------------------------------------------- in a model

HEAD = 16  # both tiny models' head size


@pytest.mark.parametrize("graph_rebuild", [False, True], ids=["host-rebuild", "graph-rebuild"])
@pytest.mark.parametrize("cache", ["f16", "f32"])
def test_kt4_equals_a_recomputation_after_cache_operations(tiny_gqa_model, graph_rebuild, cache):
    """The graph's appends (one put per cell, ubatches and decode steps) and the host rebuild (a 4-bit
    K^T is rebuilt on the host either way) write the same blocks: debug_check finds K^T as a
    recomputation gives it after appends, a removal (its rebuild), a context shift and a state load
    (whose continuation cache_operations_keep_data_exact holds to the 4-bit's bounds)."""
    from llama_sparq import _sparq
    from test_sparq_llama import cache_operations_keep_data_exact, make_llm

    tk = {"f16": 1, "f32": 0}[cache]
    sp = make_llm(tiny_gqa_model, sparq=True, sparq_k=32, sparq_min_kv=0, sparq_kt_bits=4, type_k=tk, type_v=tk)
    _sparq.debug_graph_rebuild(sp._ctx.ctx, graph_rebuild)
    cache_operations_keep_data_exact(sp, n_decode=6)


def test_kt4_switched_on_a_live_context(tiny_gqa_model):
    """From 8 to 4 bits on a live context: K^T allocated again (less memory) and rebuilt; back at 8
    the logits are an 8-bit context's that never switched."""
    from sparq_ctx import rand_prompt
    from test_sparq_llama import debug_check, decode_greedy, make_llm, n_vocab, step

    ref8 = make_llm(tiny_gqa_model, sparq=True, sparq_k=32, sparq_min_kv=0, sparq_kt_bits=8)
    prompt = rand_prompt(400, 7, n_vocab(ref8))
    _, want = decode_greedy(ref8, prompt, 4)
    sp = make_llm(tiny_gqa_model, sparq=True, sparq_k=32, sparq_min_kv=0, sparq_kt_bits=8)
    decode_greedy(sp, prompt, 2)
    bytes8 = sp.sparq_stats()["extra_bytes"]
    sp.set_sparq(sparq_kt_bits=4)
    assert sp.sparq_params()["sparq_kt_bits"] == 4
    assert sp.sparq_stats()["extra_bytes"] < bytes8
    reb = sp.sparq_stats()["n_rebuilds"]
    step(sp, 3)
    assert sp.sparq_stats()["n_rebuilds"] > reb
    assert debug_check(sp) <= 1e-3
    sp.set_sparq(sparq_kt_bits=8)
    _, got = decode_greedy(sp, prompt, 4)
    assert debug_check(sp) <= 1e-3
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_kt4_compression_and_default_r(tiny_model):
    """r = 0 resolves to 3 d / 8 (6 at this head size) with a 4-bit K^T, and the counters count a
    K^T element at 20/32 bytes: each step's compression is the cost model's."""
    from sparq_ctx import rand_prompt
    from test_sparq_llama import decode_greedy, make_llm, n_vocab

    from sparq_lab import cost

    k, n = 32, 6
    r = cost.default_r(HEAD, 4)
    assert r == 6
    sp = make_llm(tiny_model, sparq=True, sparq_k=k, sparq_min_kv=0, sparq_kt_bits=4)
    prompt = rand_prompt(300, 9, n_vocab(sp))
    decode_greedy(sp, prompt, n)
    S = np.arange(len(prompt), len(prompt) + n)
    got = sp.sparq_stats()["compression"]
    assert sp.sparq_stats()["n_sparq"] == 2 * n
    for rr in (r - 1, r + 1):
        assert abs(got - float(np.mean(cost.compression(S, HEAD, rr, k, kt_bits=4)))) > 1e-3
    assert abs(got - float(np.mean(cost.compression(S, HEAD, r, k, kt_bits=4)))) < 1e-3
    assert got < float(np.mean(cost.compression(S, HEAD, cost.default_r(HEAD, 8), k, kt_bits=8)))


def test_bad_kt_bits_is_refused_naming_the_setting(tiny_model):
    """kt_bits = 3, 5 or 12: the message names the setting and the allowed values; the settings stay."""
    from test_sparq_llama import make_llm

    from sparq_lab import cost

    sp = make_llm(tiny_model, n_ctx=256, sparq=True)
    for bad in (3, 5, 12):
        with pytest.raises(ValueError, match=rf"SparQ: kt_bits = {bad} is out of range: allowed 4, 8 or 16"):
            sp.set_sparq(sparq_kt_bits=bad)
    assert sp.sparq_params()["sparq_kt_bits"] == 4  # the default, unchanged
    with pytest.raises(ValueError, match="kt_bits must be 4, 8"):
        cost.compression(1000, 64, 16, 64, kt_bits=3)
    from sparq_lab import reference

    with pytest.raises(ValueError, match="kt_bits must be 4, 8"):
        reference.sparq_attention(np.zeros((1, 1, 16)), np.zeros((64, 1, 16)), np.zeros((64, 1, 16)), r=4, k=8,
                                  kt_bits=3)
