"""Host round trips per decode step, counted without a GPU: what a step's graph would copy to a
device and what SparQ itself reads, writes or waits for, SparQ against dense on the same model.

ggml's scheduler copies every graph input that a device node reads, at every computation: one
host-to-device copy, with a stream synchronisation before it, per input
(`ggml_backend_sched_compute_splits`). So SparQ must add as few inputs as possible: its appends
take upstream's own K row index, and the valid-cell counts are kept on the device beside the V
sums; only the local window's cells remain (none with l = 0). SparQ's own transfers (tensor
reads and writes, synchronisations: the rebuilds, the counters) must not happen at a steady
decode step at all. `llama_sparq_debug_graph_io` counts both on the last computed graph."""

from __future__ import annotations

import numpy as np
import pytest

from sparq_ctx import Ctx, Model, prefill, rand_tokens

N_STEPS = 4


@pytest.fixture(scope="module")
def model(tiny_gqa_model):
    return Model(tiny_gqa_model)


def decode_steps(c, n_seq, toks, pos0):
    """N_STEPS decode steps, one token per sequence each, all sequences in one batch; the graph's
    traffic after each step and SparQ's own transfers over the steps."""
    ios = []
    before = c.graph_io()["n_transfers"]
    for i in range(N_STEPS):
        rc, _ = c.decode([(int(toks[i]), pos0 + i, s) for s in range(n_seq)])
        assert rc == 0
        ios.append(c.graph_io())
    return ios, ios[-1]["n_transfers"] - before


def run(model, n_seq, sparq):
    rng = np.random.default_rng(5)
    prompt = rand_tokens(rng, 200, model.n_vocab)
    toks = rand_tokens(rng, N_STEPS, model.n_vocab)
    c = Ctx(model, n_ctx=1024, n_seq=n_seq)
    try:
        if sparq:
            c.sparq(**sparq)
        for s in range(n_seq):
            prefill(c, s, prompt)
        # one step first: the graph of a step is built at the first one
        assert c.decode([(int(toks[0]), len(prompt), s) for s in range(n_seq)])[0] == 0
        st0 = c.stats()
        ios, transfers = decode_steps(c, n_seq, toks, len(prompt) + 1)
        st1 = c.stats()
        return ios, transfers, st0, st1
    finally:
        c.free()


@pytest.mark.parametrize("n_seq", [1, 2])
@pytest.mark.parametrize("l", [4, 0])
def test_sparq_adds_at_most_one_input_and_no_transfer_per_step(model, n_seq, l):
    dense, dense_tr, _, _ = run(model, n_seq, None)
    sparse, sparse_tr, st0, st1 = run(model, n_seq, dict(enabled=True, r=4, k=16, l=l, min_kv=0, all_rows=False))
    n_layers = st1["n_layers"]
    # SparQ ran at every step of every layer, with no rebuild in between
    assert st1["n_sparq"] - st0["n_sparq"] == N_STEPS * n_layers
    assert st1["n_rebuilds"] == st0["n_rebuilds"]
    for ios in (dense, sparse):  # every step alike: the counts are per step
        per_step = [{k: v for k, v in io.items() if k != "n_transfers"} for io in ios]
        assert all(p == per_step[0] for p in per_step)
    d, s = dense[0], sparse[0]
    print(f"\nn_seq={n_seq} l={l}: dense {d}\n                 sparq {s}")
    assert d["n_inputs_sparq"] == 0
    # the window's cells (l > 0) are SparQ's one input per step; its appends and counts add none
    assert s["n_inputs_sparq"] == (1 if l > 0 else 0)
    assert s["n_inputs"] - d["n_inputs"] == s["n_inputs_sparq"]
    assert s["input_bytes_sparq"] == (4 * l * n_seq if l > 0 else 0)
    # no read-back, write or synchronisation of SparQ's own at a decode step (dense makes none either)
    assert dense_tr == 0 and sparse_tr == 0
    # launches: per layer the op and its three writes (K^T, the V sums with the counts, the k^2 sums),
    # no more nodes than those beside dense's
    assert s["n_nodes_sparq"] == 4 * n_layers
    assert s["n_nodes"] - d["n_nodes"] <= 4 * n_layers
