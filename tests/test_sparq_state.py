"""SparQ's cache-derived data (K^T and the V sums) never goes stale: content that changes
under the same cell positions (re-prefill while SparQ was off, state loads, stream copies),
and llama_sparq_sync before the deferred K-shift. Each case checks the data against a
recomputation (llama_sparq_debug_check) and the SparQ logits (sparse settings: selection
runs) against a context that reached the same cache contents directly."""

from __future__ import annotations

import numpy as np
import pytest

from sparq_ctx import Ctx, Model, prefill, rand_tokens, step

TOL = 1e-3
SPARSE = dict(enabled=True, r=4, k=16, l=4, min_kv=0, all_rows=False)


@pytest.fixture(scope="module")
def model(tiny_gqa_model):
    return Model(tiny_gqa_model)


def close(a, b, rel=1e-3):
    a, b = np.asarray(a), np.asarray(b)
    return np.abs(a - b).max() <= rel * np.abs(b).max()


def run_steps(c, seq, toks):
    return [step(c, seq, t) for t in toks]


def reference(model, prompt, toks, **ctx_kw):
    """SparQ logits of a fresh context: prompt, then one decode step per token."""
    c = Ctx(model, **ctx_kw)
    c.sparq(**SPARSE)
    prefill(c, 0, prompt)
    out = run_steps(c, 0, toks)
    c.free()
    return out


def test_python_debug_check_and_sync(tiny_gqa_model):
    from llama_sparq import Llama

    llm = Llama(str(tiny_gqa_model), n_ctx=512, n_threads=2, verbose=False, flash_attn=True)
    assert llm.sparq_debug_check() == -1.0  # SparQ never enabled: no data
    llm.set_sparq(sparq=True, sparq_k=16, sparq_min_kv=0)
    llm.eval([1] + list(range(10, 60)))
    llm.eval([7])
    assert 0.0 <= llm.sparq_debug_check() <= TOL
    llm.sparq_sync()
    assert 0.0 <= llm.sparq_debug_check(sync=True) <= TOL


def test_reenable_after_same_length_reprefill(model):
    """SparQ off, the context re-prefilled with another prompt of the same length, SparQ on:
    the data is rebuilt (the cells keep their positions: only their content versions say the data is stale)."""
    rng = np.random.default_rng(1)
    a, b = rand_tokens(rng, 200, model.n_vocab), rand_tokens(rng, 200, model.n_vocab)
    toks = rand_tokens(rng, 4, model.n_vocab)
    c = Ctx(model)
    c.sparq(**SPARSE)
    prefill(c, 0, a)
    assert c.check() <= TOL
    c.sparq(enabled=False)
    c.seq_rm(0, 0, -1)
    prefill(c, 0, b)  # the same cells, the same positions, other content
    c.sparq(enabled=True)
    got = run_steps(c, 0, toks)
    assert c.check() <= TOL
    assert close(got, reference(model, b, toks))
    c.free()


@pytest.mark.parametrize("which", ["whole", "seq"])
def test_state_load_onto_same_positions(model, which):
    """A saved state loaded over other content held at the same cells and positions."""
    rng = np.random.default_rng(2)
    a, b = rand_tokens(rng, 150, model.n_vocab), rand_tokens(rng, 150, model.n_vocab)
    toks = rand_tokens(rng, 4, model.n_vocab)
    c = Ctx(model)
    c.sparq(**SPARSE)
    prefill(c, 0, a)
    saved = c.state_get() if which == "whole" else c.seq_state_get(0)
    c.seq_rm(0, 0, -1)
    prefill(c, 0, b)
    assert c.check() <= TOL
    if which == "whole":
        c.state_set(saved)
    else:
        assert c.seq_state_set(saved, 0) > 0
    got = run_steps(c, 0, toks)
    assert c.check() <= TOL
    assert close(got, reference(model, a, toks))
    c.free()


def test_seq_cp_across_streams_onto_same_positions(model):
    """seq_cp from one KV stream to another whose cells hold the same positions."""
    rng = np.random.default_rng(3)
    a, b = rand_tokens(rng, 120, model.n_vocab), rand_tokens(rng, 120, model.n_vocab)
    toks = rand_tokens(rng, 4, model.n_vocab)
    c = Ctx(model, n_ctx=1024, n_seq=2)
    c.sparq(**SPARSE)
    prefill(c, 0, a)
    prefill(c, 1, b)
    assert c.check() <= TOL
    c.seq_cp(0, 1)  # stream 1 now holds seq 0's cells: same indices, same positions
    got = run_steps(c, 1, toks)
    assert c.check() <= TOL
    assert close(got, reference(model, a, toks, n_ctx=1024, n_seq=2))
    c.free()


@pytest.mark.parametrize("op", ["add", "div"])
def test_sync_applies_the_pending_k_shift(model, op):
    """llama_sparq_sync after seq_add / seq_div rebuilds from the shifted K: the next step
    finds the data current (no rebuild) and equal to a recomputation."""
    rng = np.random.default_rng(4)
    c = Ctx(model)
    c.sparq(**SPARSE)
    prefill(c, 0, rand_tokens(rng, 300, model.n_vocab))
    step(c, 0, 5)
    if op == "add":
        c.seq_rm(0, 20, 60)
        c.seq_add(0, 60, -1, -40)  # a context shift: re-ropes K at the next update
    else:
        c.seq_div(0, 100, -1, 2)
    c.sync()
    assert c.check() <= TOL
    reb = c.stats()["n_rebuilds"]
    step(c, 0, 6)
    assert c.check() <= TOL
    assert c.stats()["n_rebuilds"] == reb
    c.free()


def test_decode_steps_do_not_rebuild(model):
    """Steady-state decoding keeps the data by appends only: no rebuild per step."""
    rng = np.random.default_rng(5)
    c = Ctx(model)
    c.sparq(**SPARSE)
    prefill(c, 0, rand_tokens(rng, 100, model.n_vocab))
    step(c, 0, 3)
    reb = c.stats()["n_rebuilds"]
    for t in rand_tokens(rng, 8, model.n_vocab):
        step(c, 0, t)
    assert c.stats()["n_rebuilds"] == reb
    assert c.check() <= TOL
    c.free()
