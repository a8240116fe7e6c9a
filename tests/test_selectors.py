"""The op's selection variants in the llama.cpp graph (docs/architecture.md, "Selectors"):
the op's output on the model's own tensors (captured from the graph, k < S so selection
really runs) against the NumPy reference with the same settings; K^T after the PCA
calibration equal to a recomputation; the settings' validation; the counters' cost model;
and a small subset of the retrieval evaluation on Gemma 3 270M."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sparq_ctx import N_THREADS, make_llm, rand_prompt

from sparq_lab import reference

VARIANTS = {
    "defaults": dict(),
    "paper": dict(sparq_basis="model"),
    "oracle": dict(sparq_selector="oracle"),
    "per_head": dict(sparq_gqa="per_head"),
    "no_mean_v": dict(sparq_mean_v=False),
    "scaled": dict(sparq_basis="scaled"),
    "pca": dict(sparq_basis="pca"),
    "pca_per_head": dict(sparq_basis="pca", sparq_gqa="per_head"),
    # the paper's baselines
    "streaming": dict(sparq_selector="streaming"),
    "h2o": dict(sparq_selector="h2o"),
    # the vector-index selector
    "index": dict(sparq_selector="index", sparq_index_lists=16, sparq_index_probe=4),
    "index_per_head": dict(sparq_selector="index", sparq_index_lists=16, sparq_index_probe=4, sparq_gqa="per_head"),
    # the approximate bucketed top-k (about 9 and 6 cells per bucket)
    "buckets": dict(sparq_topk_buckets=64),
    "buckets_per_head_oracle": dict(sparq_topk_buckets=96, sparq_gqa="per_head", sparq_selector="oracle"),
}


def variants(c, x):
    """A captured call's attention variants, as the reference takes them (x: its stream view, whose row's
    KQ bias it is)."""
    p = c["params"]
    sinks = None if c.get("sinks") is None else c["sinks"].ravel().astype(np.float64)
    return dict(softcap=p["softcap"], max_bias=p["max_bias"], sinks=sinks, kq_b=x.get("kq_b"))


def check_calls_against_reference(calls, settings, min_calls, kv_quant=None):
    """Every captured SparQ call, each of its streams: the op's output equals the reference on the same
    tensors (kv_quant: the cache's quantized type, whose rounding the reference applies as the op's K^T
    holds it)."""
    from sparq_lab.capture import op_params

    assert len(calls) >= min_calls
    for c in calls:
        p = op_params(c)
        for s in range(c["q"].shape[0]):
            check_stream_against_reference(c, s, p, settings, kv_quant)


def check_stream_against_reference(c, s, p, settings, kv_quant):
    from sparq_lab.capture import reference_kt, stream_view

    x = stream_view(c, s)
    S = int(np.isfinite(x["mask"][0]).sum())
    assert S > p["k"], "the test must run the sparse path (k < S)"
    sel = settings.get("sparq_selector")
    if sel in ("streaming", "h2o", "index"):
        check_baseline_call(c, x, p, sel, per_head=settings.get("sparq_gqa") == "per_head")
        return
    kw = dict(r=p["r"], k=p["k"], l=p["l"], mask=x["mask"], scale=p["scale"], vbar=x["vbar"],
              per_head=settings.get("sparq_gqa") == "per_head", mean_v=settings.get("sparq_mean_v", True),
              oracle=settings.get("sparq_selector") == "oracle", window=[x["win"]], kv_quant=kv_quant,
              kt_bits=c["kt_bits"], topk_buckets=p["topk_buckets"], **variants(c, x))
    assert p["topk_buckets"] == settings.get("sparq_topk_buckets", 0), "the op's buckets are not the setting's"
    if x["comp_w"] is not None:
        kw["comp_w"] = x["comp_w"]
    if c["q_sel"] is not None:
        kw["q_sel"] = x["q_sel"]
        # the keys in the basis K^T is stored in: ggml [n_kv, d, hkv, ns] -> (n_kv, hkv, d)
        kw["K_sel"] = c["KT"][s].transpose(2, 0, 1).astype(np.float64)
    if settings.get("sparq_basis", "scaled") == "scaled":
        # the weights are the keys' RMS per component over the stream's cells (times sqrt(count)):
        # sqrt of the running sums of squares, which the graph keeps like the V sums (of the keys in
        # K^T's basis: a quantized cache's rotated back from upstream's rotation)
        valid = np.isfinite(x["mask"][0])
        # (the weights sum the keys themselves: against an 8-bit K^T, within its rounding)
        want_w = np.sqrt((kw.get("K_sel", x["K"])[valid] ** 2).sum(axis=0))   # (hkv, d)
        rtol = 2e-3 if "K_sel" not in kw or c["kt_bits"] == 16 else 0.05
        assert np.allclose(kw["comp_w"], want_w, rtol=rtol, atol=1e-6), "scaled weights differ from sqrt(sum k^2)"
    basis = settings.get("sparq_basis", "scaled")  # the default
    if basis in ("scaled", "pca"):
        assert c["comp_w"] is not None, "the scaled/PCA basis must pass component weights"
    if basis == "pca":
        assert c["q_sel"] is not None, "the PCA basis must pass the rotated query"
    if kv_quant is not None:
        # the captured K and V are the cache's values already (dequantized as ggml does): the
        # reference takes them as they are, with K^T the f16 of those keys where no basis gave it
        kw["kv_quant"] = None
        kw.setdefault("K_sel", x["K"].astype(np.float16).astype(np.float64))
    if c["kt_bits"] == 4:
        kw.update(reference_kt(c, s))
    want, info = reference.sparq_attention(x["q"], x["K"], x["V"], return_info=True, **kw)
    got = x["out"]
    scale = max(1.0, np.abs(want).max())
    assert np.abs(got - want).max() <= 2e-3 * scale, (c["layer"], s, np.abs(got - want).max())


def check_baseline_call(c, x, p, sel, per_head=False):
    """One captured call of the streaming, h2o or index selector against the reference."""
    assert c["comp_w"] is None and c["q_sel"] is None, "the baselines take no basis"
    kw = dict(r=1, k=p["k"], l=p["l"], mask=x["mask"], scale=p["scale"], vbar=x["vbar"], **variants(c, x))
    if sel == "streaming":
        # LM-Infinite: entries 0..l-1 the most recent positions' cells, then the 16 earliest (k = 64: 16 sinks)
        assert p["l"] == p["k"] - 16 and len(x["win_raw"]) == p["k"]
        want, info = reference.sparq_attention(x["q"], x["K"], x["V"], streaming=True, window=[x["win_raw"]],
                                               return_info=True, **kw)
        pos_order = np.sort(info["i2"][0][0])
        assert pos_order.size == p["k"]
    elif sel == "index":
        ivf = x["ivf"]
        assert ivf is not None and ivf["lists_before"] is not None, "the index was not captured"
        assert ivf["cent"].shape[1] == 16 and ivf["n_probe"] == 4
        assert np.abs(ivf["cent"]).max() > 0, "the index was not trained"
        want, info = reference.sparq_attention(x["q"], x["K"], x["V"], window=[x["win"]], return_info=True,
                                               ivf=(ivf["cent"], ivf["lists_before"], ivf["n_probe"]), per_head=per_head,
                                               **kw)
        if per_head:
            assert max(len(s) for s in info["i2"][0]) > p["k"], "per-head search should reach beyond k cells"
        assert np.array_equal(ivf["lists"], info["ivf_lists"]), (c["layer"], np.argwhere(ivf["lists"] != info["ivf_lists"])[:5])
        assert ivf["reads"].tolist() == info["ivf_reads"][0].tolist(), "the op's count of the keys it read"
        valid = np.isfinite(x["mask"][0])
        assert np.all(ivf["lists"][:, valid] >= 0), "a valid cell was left out of the index"
    else:
        assert x["h2o_before"] is not None, "the scores before the op were not captured"
        want, info = reference.sparq_attention(x["q"], x["K"], x["V"], h2o_scores=x["h2o_before"], window=[x["win"]],
                                               return_info=True, **kw)
        assert np.allclose(x["h2o"], info["h2o"], rtol=1e-5, atol=1e-5), (c["layer"], np.abs(x["h2o"] - info["h2o"]).max())
        g = x["q"].shape[1] // x["K"].shape[1]
        # each query head's weights sum to 1: a step adds g to each KV head's total
        assert np.allclose(x["h2o"].sum(axis=1) - x["h2o_before"].sum(axis=1), g, rtol=1e-4)
    got = x["out"]
    scale = max(1.0, np.abs(want).max())
    assert np.abs(got - want).max() <= 2e-3 * scale, (c["layer"], np.abs(got - want).max())


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_op_equals_reference_on_graph_tensors(tiny_gqa_model, variant):
    """tiny GQA model (4 query heads per KV head, head size 16), S ~ 600 cells, k = 64 < S"""
    from sparq_lab.capture import Capture

    settings = dict(sparq_r=8, sparq_k=64, sparq_l=16, sparq_min_kv=0, **VARIANTS[variant])
    llm = make_llm(tiny_gqa_model, **settings)
    prompt = rand_prompt(600, 5, llm.n_vocab())
    llm.reset()
    llm.eval(prompt)
    with Capture(llm) as cap:
        for t in rand_prompt(4, 6, llm.n_vocab()):
            llm.eval([t])
    check_calls_against_reference(cap.calls, settings, min_calls=2 * 4)
    st = llm.sparq_stats()
    assert st["n_sparq"] >= 8
    from llama_sparq import _sparq

    if variant == "h2o":
        # the prompt's rows added their dense attention: g per row and KV head (summed over the group)
        first = [c for c in cap.calls if c["h2o_before"] is not None][0]
        g = first["q"].shape[1] // first["K"].shape[1]
        before = first["h2o_before"].reshape(first["h2o"].shape[-2], -1)
        assert np.allclose(before.sum(axis=1), g * len(prompt), rtol=1e-3), (before.sum(axis=1), g * len(prompt))
    assert llm.sparq_params()["sparq_basis"] == settings.get("sparq_basis", _sparq.default_params()["basis"])


@pytest.mark.parametrize("basis", ["scaled", "pca"])
def test_calibrated_basis_keeps_data_exact(tiny_gqa_model, basis):
    """After the calibration (first SparQ step) K^T holds the keys in the new basis: the
    debug check recomputes it (rotating with the calibrated axes) and compares."""
    llm = make_llm(tiny_gqa_model, sparq_r=8, sparq_k=64, sparq_min_kv=0, sparq_basis=basis)
    prompt = rand_prompt(500, 7, llm.n_vocab())
    llm.reset()
    llm.eval(prompt)
    for t in rand_prompt(3, 8, llm.n_vocab()):
        llm.eval([t])
    from llama_sparq import _sparq

    assert _sparq.debug_check(llm._ctx.ctx) <= 2e-2
    # a basis change rebuilds the data in the new basis
    llm.set_sparq(sparq_basis="model")
    llm.eval([5])
    assert _sparq.debug_check(llm._ctx.ctx) <= 2e-2


def test_pca_with_every_component_equals_dense(tiny_gqa_model):
    """r = d in the PCA basis gives exact scores (the rotation keeps q.k): with k >= S-ish
    selection and mean-V on, decode matches the oracle, and the rotation is orthogonal
    (captured K^T rows are K @ P with P^T P = I)."""
    from sparq_lab.capture import Capture

    llm = make_llm(tiny_gqa_model, sparq_r=16, sparq_k=64, sparq_l=16, sparq_min_kv=0, sparq_basis="pca",
                   sparq_kt_bits=16)  # K^T in f16, so the rotation is measured without e5m2's rounding
    llm.reset()
    llm.eval(rand_prompt(400, 9, llm.n_vocab()))
    with Capture(llm) as cap:
        llm.eval([7])
    for c in cap.calls:
        K = c["K"][0].astype(np.float64)                      # (hkv, n_kv, d)
        KT = c["KT"][0].astype(np.float64)                    # (hkv, d, n_kv)
        valid = np.isfinite(c["mask"][0, 0, 0, :K.shape[1]])
        for h in range(K.shape[0]):
            Kh, Ks = K[h][valid], KT[h][:, valid].T           # (S, d) each
            P, *_ = np.linalg.lstsq(Kh, Ks, rcond=None)       # Ks = Kh @ P
            assert np.abs(P.T @ P - np.eye(P.shape[0])).max() < 2e-2
            assert np.abs(Kh @ P - Ks).max() <= 2e-2 * max(1.0, np.abs(Ks).max())


@pytest.mark.parametrize("kw,message", [
    (dict(sparq_selector="best"), "sparq_selector = 'best' is unknown: allowed 'sparq', 'oracle', 'streaming', 'h2o', 'index'"),
    (dict(sparq_gqa="union"), "sparq_gqa = 'union' is unknown: allowed 'shared', 'per_head'"),
    (dict(sparq_basis="svd"), "sparq_basis = 'svd' is unknown: allowed 'model', 'scaled', 'pca'"),
    (dict(sparq_mean_v=1), "sparq_mean_v must be True or False, got 1")])
def test_invalid_variant_values_are_refused(tiny_model, kw, message):
    with pytest.raises(ValueError) as e:
        make_llm(tiny_model, **kw)
    assert str(e.value) == message


def test_set_sparq_refuses_unknown_values(tiny_model):
    llm = make_llm(tiny_model, sparq=True)
    with pytest.raises(ValueError, match="sparq_gqa = 'per_query' is unknown"):
        llm.set_sparq(sparq_gqa="per_query")
    with pytest.raises(ValueError, match=r"SparQ: basis = 7 is unknown: allowed 0 \(model\), 1 \(scaled\), 2 \(pca\)"):
        llm.set_sparq(sparq_basis=7)


def test_counters_cost_model_per_variant(tiny_gqa_model):
    """The counters' compression follows the cost model of each variant: per-head choice
    reads the union of the heads' choices (up to g (k - l) + l rows; the op reports the union's
    size, which the counters use), the oracle all d components."""
    from sparq_lab import cost

    prompt = rand_prompt(700, 11, 256)
    d, g = 16, 4
    out, mean_k = {}, {}
    for name, extra in (("paper", dict(sparq_basis="model")), ("per_head", dict(sparq_gqa="per_head")),
                        ("oracle", dict(sparq_selector="oracle"))):
        llm = make_llm(tiny_gqa_model, sparq_r=8, sparq_k=64, sparq_l=16, sparq_min_kv=0, sparq_kt_bits=16, **extra)
        llm.reset()
        llm.eval(prompt)
        llm.reset_sparq_stats()
        llm.eval([9])
        st = llm.sparq_stats()
        out[name], mean_k[name] = st["compression"], st["mean_k"]
    S = len(prompt) + 1
    assert out["paper"] == pytest.approx(cost.compression(S, d, 8, 64), rel=1e-6)
    # the union: more than one head's k, at most g (k - l) + l, and the cost model of its size
    assert 64 < mean_k["per_head"] <= g * (64 - 16) + 16, mean_k
    assert out["per_head"] == pytest.approx((S * 8 + 2 * mean_k["per_head"] * d + 4 * d) / (2 * S * d + 2 * d), rel=1e-5)
    assert cost.compression(S, d, 8, 64) < out["per_head"] <= cost.compression(S, d, 8, g * (64 - 16) + 16)
    assert out["oracle"] == pytest.approx(cost.compression(S, d, d, 64), rel=1e-6)


def test_counters_cost_model_of_the_baselines(tiny_gqa_model):
    """The paper's Appendix G: LM-Infinite moves 2kd + 2d, H2O 2kd + 2d + 2S (its scores read
    and written), against dense's 2Sd + 2d; neither reads K^T or the mean of V."""
    prompt = rand_prompt(700, 11, 256)
    d, k = 16, 64
    S = len(prompt) + 1
    for sel, moved in (("streaming", 2 * k * d + 2 * d), ("h2o", 2 * k * d + 2 * d + 2 * S)):
        llm = make_llm(tiny_gqa_model, sparq_k=k, sparq_min_kv=0, sparq_selector=sel)
        llm.reset()
        llm.eval(prompt)
        llm.reset_sparq_stats()
        llm.eval([9])
        st = llm.sparq_stats()
        assert st["n_sparq"] == 2, sel
        assert st["compression"] == pytest.approx(moved / (2 * S * d + 2 * d), rel=1e-6), sel


def test_counters_count_the_keys_the_index_read(tiny_gqa_model):
    """The index reads its centroids (f32), the list ids (f32), the keys of the lists its searches
    probed, then k rows of K and V. The op reports the keys it scored per KV head (the valid cells
    of the probed lists: the union of each head's with per-head search), and the counters replace
    their estimate (an even share index_probe / index_lists of the cells) by that count."""
    from sparq_lab.capture import Capture, op_params, stream0

    prompt = rand_prompt(700, 11, 256)
    d, k, l, C, p, g = 16, 64, 16, 16, 3, 4
    S = len(prompt) + 1
    for gqa, rows in (("shared", k), ("per_head", g * (k - l) + l)):
        # per-head search: each query head probes its own lists and picks its own k - l cells
        llm = make_llm(tiny_gqa_model, sparq_k=k, sparq_l=l, sparq_min_kv=0, sparq_selector="index",
                       sparq_index_lists=C, sparq_index_probe=p, sparq_gqa=gqa)
        llm.reset()
        llm.eval(prompt)
        llm.reset_sparq_stats()
        with Capture(llm) as cap:
            llm.eval([9])
        st = llm.sparq_stats()
        assert st["n_sparq"] == 2 and len(cap.calls) == 2
        compr = []
        for call in cap.calls:
            x, o = stream0(call), op_params(call)
            ivf = x["ivf"]
            _, info = reference.sparq_attention(x["q"], x["K"], x["V"], r=1, k=o["k"], l=o["l"], mask=x["mask"],
                                                scale=o["scale"], vbar=x["vbar"], window=[x["win"]], return_info=True,
                                                ivf=(ivf["cent"], ivf["lists_before"], ivf["n_probe"]),
                                                per_head=gqa == "per_head")
            want = info["ivf_reads"][0].tolist()
            assert ivf["reads"].tolist() == want, gqa
            # the lists are not even: the count differs from the estimate
            assert np.mean(want) != pytest.approx(S * p / C), gqa
            moved = 2 * C * d + 2 * S + np.mean(want) * d + 2 * rows * d + 2 * d
            compr.append(moved / (2 * S * d + 2 * d))
        assert st["compression"] == pytest.approx(np.mean(compr), rel=1e-6), gqa


@pytest.mark.parametrize("kw,message", [
    (dict(sparq_index_lists=0), "SparQ: index_lists = 0 is out of range: allowed 1..65536"),
    (dict(sparq_index_lists=8, sparq_index_probe=9),
     "SparQ: index_probe = 9 is out of range: allowed 1..index_lists (index_lists = 8)")])
def test_index_settings_are_checked(tiny_model, kw, message):
    with pytest.raises(ValueError) as e:
        make_llm(tiny_model, sparq_selector="index", **kw)
    assert str(e.value) == message


def test_index_is_trained_again_when_the_stream_doubles_and_after_a_rebuild(tiny_gqa_model):
    """The centroids come from the stream's keys at its first index step and again once it holds
    twice the cells or a cache operation rebuilt it; then every list id is reset, and the next
    step puts each cell in its nearest centroid's list (the reference's choice)."""
    from sparq_lab.capture import Capture, stream0
    from sparq_ctx import Ctx, Model, prefill, step

    m = Model(tiny_gqa_model)
    c = Ctx(m, n_ctx=2048)
    c.sparq(enabled=True, selector=4, k=32, l=8, min_kv=0, index_lists=8, index_probe=2)
    rng = np.random.default_rng(5)
    prefill(c, 0, rng.integers(3, m.n_vocab, 300).tolist())

    def cents():
        with Capture(c.ctx) as cap:
            step(c, 0, int(rng.integers(3, m.n_vocab)))
        return cap.calls

    first = cents()
    again = cents()
    for a, b in zip(first, again):
        assert np.array_equal(a["ivf_cent"], b["ivf_cent"]), "retrained without the stream doubling"
    prefill(c, 0, rng.integers(3, m.n_vocab, 400).tolist(), pos0=c.pos_max(0) + 1)
    grown = cents()
    for a, b in zip(first, grown):
        assert not np.array_equal(a["ivf_cent"], b["ivf_cent"]), "not retrained after the stream doubled"
    c.seq_rm(0, 500, -1)
    calls = cents()
    assert c.stats()["n_rebuilds"] >= 1
    for a, b in zip(grown, calls):
        assert not np.array_equal(a["ivf_cent"], b["ivf_cent"]), "not retrained after the rebuild"
    for call in calls:
        x = stream0(call)
        valid = np.isfinite(x["mask"][0])
        assert np.all(x["ivf"]["lists_before"][:, valid][:, :-1] == -1), "a rebuild must reset the list ids"
        d2 = ((x["K"][valid][:, :, None, :] - x["ivf"]["cent"][None]) ** 2).sum(-1)   # (cells, hkv, lists)
        assert np.array_equal(x["ivf"]["lists"][:, valid].T, d2.argmin(-1)), "cells not in their nearest list"
    c.free()


def test_index_sync_trains_and_assigns_before_the_step(tiny_gqa_model):
    """llama_sparq_sync (llama-bench calls it before each timed run) trains the index and puts every
    used cell in its nearest list, so the next step assigns only the new cell."""
    from sparq_lab.capture import Capture, stream0
    from sparq_ctx import Ctx, Model, prefill, step

    m = Model(tiny_gqa_model)
    c = Ctx(m)
    c.sparq(enabled=True, selector=4, k=32, l=8, min_kv=0, index_lists=8, index_probe=2)
    prefill(c, 0, np.random.default_rng(6).integers(3, m.n_vocab, 400).tolist())
    c.sync()
    with Capture(c.ctx) as cap:
        step(c, 0, 7)
    for call in cap.calls:
        x = stream0(call)
        valid = np.isfinite(x["mask"][0])
        before = x["ivf"]["lists_before"][:, valid]
        assert np.all(before[:, :-1] >= 0) and np.all(before[:, -1] == -1), "sync left cells out of the index"
        d2 = ((x["K"][valid][:, :, None, :] - x["ivf"]["cent"][None]) ** 2).sum(-1)
        assert np.array_equal(x["ivf"]["lists"][:, valid].T, d2.argmin(-1))
    c.free()


def test_h2o_is_refused_where_its_scores_cannot_follow(tiny_gqa_model):
    """H2O's scores follow one sequence's prompt and steps: several sequences and all-rows
    evaluation are refused with the reason, never run with wrong scores."""
    from sparq_ctx import Ctx, Model

    m = Model(tiny_gqa_model)
    c = Ctx(m, n_seq=2)
    with pytest.raises(RuntimeError, match=r"SparQ: selector h2o needs a context for one sequence \(n_seq_max = 1, here 2\)"):
        c.sparq(enabled=True, selector=3, k=32)
    c.free()
    c = Ctx(m)
    with pytest.raises(ValueError, match="SparQ: all_rows = 1 does not apply to selector h2o"):
        c.sparq(enabled=True, selector=3, k=32, all_rows=True)
    c.sparq(enabled=True, selector=3, k=32)  # one sequence: fine
    c.free()


def test_h2o_scores_survive_removal_and_restart_for_new_cells(tiny_gqa_model):
    """A rebuild after removing the tail keeps the scores of the cells still in use (their
    history) and zeroes the removed ones; the cells written next start at 0."""
    from sparq_lab.capture import Capture
    from sparq_ctx import Ctx, Model, prefill, step

    m = Model(tiny_gqa_model)
    c = Ctx(m)
    c.sparq(enabled=True, selector=3, k=64, l=16, min_kv=0)
    rng = np.random.default_rng(4)
    prefill(c, 0, rng.integers(3, m.n_vocab, 500).tolist())
    with Capture(c.ctx) as cap:
        step(c, 0, 5)
    after = {x["layer"]: x["h2o"][0, 0].astype(np.float64) for x in cap.calls}  # (hkv, S) over the view
    c.seq_rm(0, 400, -1)
    with Capture(c.ctx) as cap:
        step(c, 0, 6)
    assert c.stats()["n_rebuilds"] >= 1
    for x in cap.calls:
        hkv = x["h2o"].shape[-2]
        before = x["h2o_before"].reshape(hkv, -1)
        old = after[x["layer"]]
        # cells 0..399 keep their scores; 400.. were removed (the new token took cell 400: 0 before the op)
        assert np.array_equal(before[:, :400], old[:, :400].astype(np.float32))
        assert np.all(before[:, 400:] == 0.0)
        assert np.all(old[:, 400:501] > 0.0)


@pytest.mark.real_model
def test_gemma_op_equals_reference_on_its_tensors(gemma_model):
    """Gemma 3 270M (head size 256, 4 query heads on 1 KV head), ~1.2K tokens, k = 128 < S:
    the fork's op on the real q, K, V of its global layers equals the NumPy reference,
    for the paper's setting and the scaled basis."""
    from sparq_lab.capture import Capture

    for extra in (dict(sparq_basis="model"), dict(sparq_basis="scaled")):
        settings = dict(sparq_r=64, sparq_k=128, sparq_l=32, sparq_min_kv=0, **extra)
        llm = make_llm(gemma_model, n_ctx=2048, **settings)
        text = b"The river carried the lantern past the market and the copper window. " * 90
        toks = llm.tokenize(text)
        llm.reset()
        llm.eval(toks)
        with Capture(llm) as cap:
            for t in toks[5:8]:
                llm.eval([t])
        check_calls_against_reference(cap.calls, settings, min_calls=3 * 3)


@pytest.mark.real_model
def test_eval_subset_runs_and_keeps_answers(gemma_model, tmp_path):
    """A small subset of `python -m llama_sparq.eval` (the retrieval suite): files written,
    every SparQ run proven by its counters, and the default SparQ settings find what dense
    finds."""
    from llama_sparq import eval as ev

    out = tmp_path / "eval_subset"
    rc = ev.main(["--contexts", "2048", "--tasks", "passkey,niah_multikey", "--depths", "0.3,0.7",
                  "--variants", "dense,default,default_kt16,oracle", "--compressions", "8", "--threads", str(N_THREADS),
                  "--out", str(out), "--no-progress"])
    assert rc == 0
    res = json.loads(out.with_suffix(".json").read_text())
    acc = {(e["variant"]): e["accuracy"] for e in res["summary"]}
    # the 270M model itself misses some needles: the defaults must keep what dense finds
    assert acc["dense"] >= 50.0, acc
    assert acc["default"] >= acc["dense"], acc
    assert acc["default_kt16"] >= acc["dense"], acc
    rows = out.with_suffix(".csv").read_text().splitlines()
    assert len(rows) == 1 + 4 * 4
    import csv

    comp = {}
    for r in csv.DictReader(rows):
        comp.setdefault(r["variant"], []).append(float(r["compression"]))
    # the default 4-bit K^T reads 0.47 of the 16-bit one's step 1 bytes (r 3/8 of d against 1/4, 0.625
    # bytes an element against 2): below it on every sample
    assert all(a < b for a, b in zip(comp["default"], comp["default_kt16"])), comp

    commits = {r["commit"] for r in csv.DictReader(rows)}
    assert len(commits) == 1 and commits == {res["meta"]["commit"]} and "not recorded" not in commits, commits
    assert out.with_suffix(".md").exists()
