"""A context well under the dense threshold pays nothing for SparQ: a graph whose ubatch leaves its
longest stream under the append floor (min_kv - n_ubatch cells) builds none of SparQ's nodes, so
its nodes and inputs are dense's; its streams' K^T, sums and windows go stale and are rebuilt once
by the first graph at or over the floor, which still runs dense (it holds fewer than min_kv cells),
so the rebuild comes before the first SparQ step. From there the data is checked against a host
recomputation at every step, and the logits equal those of a context that appends all along (its
ubatches as long as the dense threshold: its append floor is 0) to the rounding of the V sums,
which the rebuild adds in another order, with the same counters but the rebuilds. Both take their
prompts in the same ubatches (the cache's values depend on a ubatch's shape)."""

from __future__ import annotations

import numpy as np
import pytest

from sparq_ctx import Ctx, Model, prefill, rand_tokens

MIN_KV, N_UBATCH = 128, 32
FLOOR = MIN_KV - N_UBATCH
APPEND_UBATCH = MIN_KV  # ubatches of min_kv tokens: the append floor is 0 (sparq_append_floor)
# logits of the rebuilt data against the appended data's (the V sums' rounding; about 1e-7 seen)
LOGIT_TOL = 1e-5
SPARQ = dict(enabled=True, r=4, k=16, l=4, min_kv=MIN_KV, all_rows=False)


@pytest.fixture(scope="module")
def model(tiny_gqa_model):
    return Model(tiny_gqa_model)


def _ctx(model, n_seq, appends_all_along=False, sparq=SPARQ):
    c = Ctx(model, n_ctx=1024, n_seq=n_seq, n_ubatch=APPEND_UBATCH if appends_all_along else N_UBATCH)
    if sparq:
        c.sparq(**sparq)
    return c


def _io(c):
    return {k: v for k, v in c.graph_io().items() if k != "n_transfers"}


def _prefill(c, seq, tokens):
    """A prompt in llama_decode calls of N_UBATCH tokens: the same ubatches, so the same K and V, in
    a context of longer ubatches (the cache's values depend on the ubatch's shape)."""
    for i in range(0, len(tokens), N_UBATCH):
        prefill(c, seq, tokens[i:i + N_UBATCH], pos0=i)


def test_under_the_floor_the_graph_is_denses(model):
    """Prompt and decode steps under the floor: every graph has dense's nodes and inputs (no SparQ
    node), the same logits, the calls counted dense (`prefill`, `short`), no rebuild; in a context
    whose floor is 0 the same steps carry SparQ's append nodes."""
    rng = np.random.default_rng(3)
    prompt = rand_tokens(rng, 40, model.n_vocab)
    toks = rand_tokens(rng, 8, model.n_vocab)
    runs = {}
    for name, sparq, keep in (("dense", None, False), ("skip", SPARQ, False), ("append", SPARQ, True)):
        c = _ctx(model, 1, keep, sparq)
        try:
            _prefill(c, 0, prompt)
            io_prompt = _io(c)
            ios, logits = [], []
            for i, t in enumerate(toks):
                rc, out = c.decode([(int(t), len(prompt) + i, 0)])
                assert rc == 0
                ios.append(_io(c))
                logits.append(out[0])
            runs[name] = (io_prompt, ios, logits, c.stats() if sparq else None)
        finally:
            c.free()
    dense, skip, append = runs["dense"], runs["skip"], runs["append"]
    print(f"\nper decode step under the floor: dense {dense[1][0]}\n  skipped {skip[1][0]}\n  appended {append[1][0]}")
    assert skip[0] == dense[0]  # the prompt's graph
    assert all(s == d for s, d in zip(skip[1], dense[1]))
    assert skip[1][0]["n_nodes_sparq"] == 0 and skip[1][0]["n_inputs_sparq"] == 0
    assert append[1][0]["n_nodes"] > dense[1][0]["n_nodes"]  # the appends, with the floor at 0
    for a, b in zip(skip[2], dense[2]):
        np.testing.assert_array_equal(a, b)
    st, sa = skip[3], append[3]
    n_layers = st["n_layers"]
    assert st["n_sparq"] == 0 and st["n_dense"]["short"] == len(toks) * n_layers
    assert st["n_dense"]["prefill"] == 2 * n_layers  # 40 tokens in ubatches of 32
    assert st["n_dense"] == sa["n_dense"] and st["n_sparq"] == sa["n_sparq"]
    assert st["n_rebuilds"] == 0


def _steps(c, seqs, n, tok_rng, out, check_tol):
    """n decode steps of the sequences seqs together (each at its next position): per step the
    longest stream's cells, the counters' deltas, whether the graph has a SparQ node, the logits;
    the kept data checked after every step."""
    for _ in range(n):
        items = [(int(tok_rng.integers(3, c.nv)), c.pos_max(s) + 1, s) for s in seqs]
        st0 = c.stats()
        rc, logits = c.decode(items)
        assert rc == 0
        st1 = c.stats()
        used = max(c.pos_max(s) + 1 for s in seqs)
        out.append(dict(used=used, sparq=st1["n_sparq"] - st0["n_sparq"], rebuilds=st1["n_rebuilds"] - st0["n_rebuilds"],
                        short=st1["n_dense"]["short"] - st0["n_dense"]["short"],
                        nodes_sparq=c.graph_io()["n_nodes_sparq"], logits=logits))
        assert c.check() <= check_tol, out[-1]["used"]


def _run(model, keep, n_seq, prompts, graph_rebuild, sparq=SPARQ):
    c = _ctx(model, n_seq, keep, sparq)
    if graph_rebuild:
        c.debug_graph_rebuild()
    rng = np.random.default_rng(11)
    steps, marks = [], {}
    try:
        for s, p in enumerate(prompts):
            _prefill(c, s, p)
        marks["prefill_rebuilds"] = c.stats()["n_rebuilds"]
        seqs = list(range(n_seq))
        # up to past the threshold
        _steps(c, seqs, MIN_KV + 24 - max(len(p) for p in prompts), rng, steps, 1e-3)
        marks["rm"] = len(steps)
        # every stream taken back under the floor (the longest to 30 cells), then past the threshold again
        for s in seqs:
            assert c.seq_rm(s, 30 - 10 * s, -1)
        _steps(c, seqs, MIN_KV + 8 - 30, rng, steps, 1e-3)
        marks["stats"] = c.stats()
    finally:
        c.free()
    return steps, marks


def test_h2o_appends_under_the_threshold(model):
    """h2o's scores follow every step (a prompt's attention included), which no rebuild restores: it
    keeps its appends and runs SparQ under the threshold, as before."""
    c = _ctx(model, 1, False, dict(SPARQ, selector="h2o"))
    try:
        prefill(c, 0, rand_tokens(np.random.default_rng(1), 40, model.n_vocab))
        st0 = c.stats()
        assert step_ok(c)
        st1 = c.stats()
        assert c.graph_io()["n_nodes_sparq"] > 0 and st1["n_sparq"] - st0["n_sparq"] == st1["n_layers"]
    finally:
        c.free()


def step_ok(c):
    return c.decode([(5, c.pos_max(0) + 1, 0)])[0] == 0


@pytest.mark.parametrize("n_seq,graph_rebuild,selector", [(1, False, "sparq"), (1, True, "sparq"), (2, False, "sparq"),
                                                          (2, True, "sparq"), (1, False, "index"), (1, False, "streaming")])
def test_rebuilt_once_before_the_first_sparq_step(model, n_seq, graph_rebuild, selector):
    """Decode steps from under the floor to past the threshold, a removal that takes the longest
    stream back under the floor, and past the threshold again (one or two sequences, the rebuild on
    the host or as a graph; the selectors that skip too: the index's lists are reset by the rebuild
    and trained at its first SparQ step, as after any rebuild): each crossing of the floor rebuilds
    once, at a dense step before the first SparQ step; every step's kept data passes the check; the
    logits and the counters but the rebuilds equal those of a context that appends all along."""
    rng = np.random.default_rng(7)
    prompts = [rand_tokens(rng, n, model.n_vocab) for n in (40, 60)[:n_seq]]
    sparq = dict(SPARQ, selector=selector)
    skip, m_skip = _run(model, False, n_seq, prompts, graph_rebuild, sparq)
    keep, m_keep = _run(model, True, n_seq, prompts, graph_rebuild, sparq)
    assert len(skip) == len(keep)
    n_layers = m_skip["stats"]["n_layers"]
    for phase in (skip[:m_skip["rm"]], skip[m_skip["rm"]:]):
        rebuilt = [i for i, s in enumerate(phase) if s["rebuilds"]]
        first_sparq = next(i for i, s in enumerate(phase) if s["sparq"])
        # one rebuild per stream of the ubatch, at the first step at the floor, a dense one
        assert len(rebuilt) == 1 and phase[rebuilt[0]]["rebuilds"] == n_seq, rebuilt
        assert phase[rebuilt[0]]["used"] == FLOOR and rebuilt[0] < first_sparq
        assert phase[first_sparq]["used"] == MIN_KV
        for s in phase:
            # no SparQ node under the floor; over it SparQ runs at the threshold (the op over it)
            assert (s["nodes_sparq"] > 0) == (s["used"] >= FLOOR), s["used"]
            assert s["sparq"] == (n_layers if s["used"] >= MIN_KV else 0)
    assert m_skip["prefill_rebuilds"] == 0  # the prompts are under the floor
    # the counters are those of the context that appended, but the rebuilds
    a, b = m_skip["stats"], m_keep["stats"]
    assert a["n_sparq"] == b["n_sparq"] and a["n_dense"] == b["n_dense"]
    # the rebuilt V sums add the same values in another order than the appends (a rounding of f32's,
    # through the mean of V): equal to that, not bit for bit
    worst = 0.0
    for s, k in zip(skip, keep):
        assert s["used"] == k["used"]
        for x, y in zip(s["logits"], k["logits"]):
            np.testing.assert_allclose(x, y, atol=LOGIT_TOL, rtol=0, err_msg=f"at {s['used']} cells")
            worst = max(worst, float(np.abs(x - y).max()))
    print(f"\n{selector} n_seq={n_seq} graph_rebuild={graph_rebuild}: logits within {worst:.3g} of the appending run's")


def test_a_prompt_crossing_the_floor_appends_from_that_ubatch(model):
    """A prompt over the floor in one batch: the ubatches under it append nothing, the one that
    reaches it rebuilds what came before (one rebuild) and appends; the decode steps after it
    check and equal a context that appends all along."""
    rng = np.random.default_rng(5)
    prompt = rand_tokens(rng, 150, model.n_vocab)
    res = {}
    for keep in (False, True):
        c = _ctx(model, 1, keep)
        try:
            # ubatches of 32: 32, 64, 96 (the floor: rebuilt), 128, 150; in one batch where it skips
            (prefill if not keep else _prefill)(c, 0, prompt)
            st = c.stats()
            assert c.check() <= 1e-3
            steps = []
            _steps(c, [0], 8, np.random.default_rng(2), steps, 1e-3)
            res[keep] = (st, steps, c.stats())
        finally:
            c.free()
    (st_s, skip, end_s), (st_k, keep, end_k) = res[False], res[True]
    assert st_s["n_rebuilds"] == 1 and st_s["n_dense"] == st_k["n_dense"]
    assert all(s["sparq"] == end_s["n_layers"] and not s["rebuilds"] for s in skip)
    assert end_s["n_sparq"] == end_k["n_sparq"] and end_s["n_dense"] == end_k["n_dense"]
    for s, k in zip(skip, keep):
        np.testing.assert_allclose(s["logits"][0], k["logits"][0], atol=LOGIT_TOL, rtol=0)
