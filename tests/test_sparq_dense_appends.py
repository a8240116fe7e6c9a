"""Contexts and layers that run dense at every step whatever their length pay nothing for SparQ:
several sequences in one unified KV stream (`shared_stream`), a dense threshold over the cells a
stream holds (`short` at every step), and layers whose every attention call has a variant SparQ
refuses (a relative position bias: found at allocation from the layer's tensors, so such a layer
has no SparQ data; attention sinks, which the op computes, run SparQ). The contexts' graphs build none of SparQ's nodes: nodes and
inputs are dense's, the logits dense's bit for bit, every call counted dense with its reason, and
the kept data passes the debug check. A context whose settings change so that it can run SparQ
rebuilds its stale data once, before its first SparQ step, and then decodes as a context on which
SparQ came on at that step."""

from __future__ import annotations

import numpy as np
import pytest

from sparq_ctx import Ctx, Model, prefill, rand_tokens

SPARQ = dict(enabled=True, r=4, k=16, l=4, min_kv=0, all_rows=False)
N_STEPS = 6
@pytest.fixture(scope="module")
def model(tiny_gqa_model):
    return Model(tiny_gqa_model)


def _io(c):
    return {k: v for k, v in c.graph_io().items() if k != "n_transfers"}


def _run(model, ctx_kw, sparq, steps=N_STEPS, after=None):
    """Prompts for every sequence, then `steps` decode steps of all sequences together and one that
    mixes a prompt (sequence 0, three tokens) with decode steps: per graph its nodes and inputs, the
    logits, the debug check and the counters (while SparQ is on); after (settings): applied at the
    end, then `steps` more decode steps."""
    rng = np.random.default_rng(21)
    c = Ctx(model, **ctx_kw)
    n_seq = c.n_seq
    out = dict(io=[], logits=[], check=[], stats=[])
    on = [bool(sparq)]
    try:
        if sparq:
            c.sparq(**sparq)

        def record(logits):
            out["io"].append(_io(c))
            out["logits"].append(logits)
            if on[0]:
                out["check"].append(c.check())
                out["stats"].append(c.stats())

        for s in range(n_seq):
            prefill(c, s, rand_tokens(rng, 60 + 10 * s, model.n_vocab))
            record([])

        def step(items):
            rc, logits = c.decode(items)
            assert rc == 0
            record(logits)

        for _ in range(steps):
            step([(int(rng.integers(3, model.n_vocab)), c.pos_max(s) + 1, s) for s in range(n_seq)])
        p0 = c.pos_max(0) + 1
        step([(int(rng.integers(3, model.n_vocab)), p0 + i, 0) for i in range(3)] +
             [(int(rng.integers(3, model.n_vocab)), c.pos_max(s) + 1, s) for s in range(1, n_seq)])
        out["marks"] = len(out["io"])
        if after:
            c.sparq(**after)
            on[0] = True
            for _ in range(steps):
                step([(int(rng.integers(3, model.n_vocab)), c.pos_max(s) + 1, s) for s in range(n_seq)])
    finally:
        c.free()
    return out


CASES = {
    # two sequences in one unified stream: every call dense (shared_stream), whatever the length
    "shared_stream": (dict(n_ctx=1024, n_seq=2, unified=True), SPARQ, "shared_stream"),
    # min_kv over the 256 cells of the stream: every call dense (short, and prefill for prompts)
    "min_kv_over_the_cells": (dict(n_ctx=256, n_seq=1), dict(SPARQ, min_kv=300), "short"),
    # the same with a stream per sequence (256 cells each; the prompt beside a decode step: a ubatch
    # mixing prompt and decode rows first)
    "min_kv_over_the_cells_2seq": (dict(n_ctx=512, n_seq=2), dict(SPARQ, min_kv=300), "short"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_context_dense_at_every_step_builds_denses_graph(model, name):
    ctx_kw, sparq, reason = CASES[name]
    dense = _run(model, ctx_kw, None)
    skip = _run(model, ctx_kw, sparq)
    print(f"\n{name}: per decode step dense {dense['io'][-1]}\n  skipped {skip['io'][-1]}")
    assert skip["io"] == dense["io"]  # every graph: prompts, decode steps, the mixed one
    assert all(io["n_nodes_sparq"] == 0 and io["n_inputs_sparq"] == 0 for io in skip["io"])
    for a, b in zip(skip["logits"], dense["logits"]):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    assert all(0 <= v <= 1e-3 for v in skip["check"]), skip["check"]
    st = skip["stats"][-1]
    assert st["n_sparq"] == 0 and st["n_dense"][reason] > 0 and st["n_rebuilds"] == 0
    # every decode step of all sequences: one call per layer, counted dense with the context's reason
    n_seq, n_layers = ctx_kw.get("n_seq", 1), st["n_layers"]
    first = n_seq - 1  # the record after the last prompt
    for a, b in zip(skip["stats"][first:first + N_STEPS], skip["stats"][first + 1:first + N_STEPS + 1]):
        assert b["n_dense"][reason] - a["n_dense"][reason] == n_layers, (a["n_dense"], b["n_dense"])
        assert sum(b["n_dense"].values()) - sum(a["n_dense"].values()) == n_layers


def test_min_kv_lowered_rebuilds_once_then_runs_sparq(model):
    """A context built dense by a threshold over its cells, then given a reachable one: the first graph
    after the change appends again, rebuilding each stream once (its data stale since the prompt), and
    runs SparQ; the data checks clean and the logits equal those of a context on which SparQ came on
    at that step (its data made then from the cache, as the stale data is)."""
    ctx_kw, sparq, _ = CASES["min_kv_over_the_cells"]
    after = dict(sparq, min_kv=0)
    skip = _run(model, ctx_kw, sparq, after=after)
    late = _run(model, ctx_kw, None, after=after)
    m = skip["marks"]
    n_layers = skip["stats"][-1]["n_layers"]
    rebuilds = [s["n_rebuilds"] for s in skip["stats"]]
    sparq_calls = [s["n_sparq"] for s in skip["stats"]]
    assert rebuilds[m - 1] == 0 and rebuilds[m] == 1 and rebuilds[-1] == 1, rebuilds
    assert sparq_calls[m - 1] == 0 and all(sparq_calls[i] - sparq_calls[i - 1] == n_layers for i in range(m, len(sparq_calls)))
    assert all(io["n_nodes_sparq"] > 0 for io in skip["io"][m:])
    assert skip["io"][m:] == late["io"][m:]
    assert all(0 <= v <= 1e-3 for v in skip["check"] + late["check"]), (skip["check"], late["check"])
    # the context on which SparQ came on at the change made its data once, at its first step
    assert [s["n_rebuilds"] for s in late["stats"]] == [1] * len(late["stats"])
    assert all(np.array_equal(x, y) for a, b in zip(skip["logits"][:m], late["logits"][:m]) for x, y in zip(a, b))
    for a, b in zip(skip["logits"][m:], late["logits"][m:]):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_h2o_over_the_cells_keeps_its_appends(model):
    """h2o's scores follow every step and run SparQ under the threshold: a threshold over the cells
    does not skip its appends."""
    c = Ctx(model, n_ctx=256)
    try:
        c.sparq(**dict(SPARQ, selector="h2o", min_kv=300))
        prefill(c, 0, rand_tokens(np.random.default_rng(1), 40, model.n_vocab))
        st0 = c.stats()
        assert c.decode([(5, c.pos_max(0) + 1, 0)])[0] == 0
        assert c.graph_io()["n_nodes_sparq"] > 0 and c.stats()["n_sparq"] - st0["n_sparq"] == st0["n_layers"]
        assert c.check() <= 1e-3
    finally:
        c.free()


@pytest.fixture(scope="module")
def granite_swa_model(tmp_path_factory):
    from sparq_lab.models import make_tiny_granite_swa

    return make_tiny_granite_swa(tmp_path_factory.mktemp("granite_swa") / "tiny-granite-swa.gguf")


def test_layers_with_attention_sinks_run_sparq(granite_swa_model):
    """Granite's iSWA layers pass their sinks to every attention call, which the op computes: its
    full-attention layer gets SparQ data and runs SparQ at each decode step (counted), the kept data
    equal to a recomputation."""
    m = Model(granite_swa_model)
    c = Ctx(m, n_ctx=256)
    try:
        c.sparq(**SPARQ)
        prefill(c, 0, rand_tokens(np.random.default_rng(2), 40, m.n_vocab))
        st0 = c.stats()
        assert c.decode([(5, 40, 0)])[0] == 0
        assert c.graph_io()["n_nodes_sparq"] > 0 and c.stats()["n_sparq"] - st0["n_sparq"] == 1
        assert c.check() <= 1e-3
    finally:
        c.free()
