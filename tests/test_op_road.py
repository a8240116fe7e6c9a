"""One road from the settings to the op: for every row of the settings' table, the parameters of the
op nodes the decode graph builds (captured from the graph) equal those of the probe node the
settings' check puts to the devices (llama_sparq_debug_op_params), field for field and part for part
(the feature bits), on a tiny GQA model. Both come from the one resolution (llama-sparq-op.cpp); a
graph that added or changed a parameter after it, as the graph hook once did, fails here."""

from __future__ import annotations

import pytest

from llama_sparq.bindings import settings as table
from sparq_ctx import make_llm, rand_prompt

FIXED = dict(sparq_k=48)
# per row of the table, settings that move it off its default (a row without an entry fails below)
VARIANTS = {
    "enabled": [{}],
    "r": [dict(sparq_r=3)],
    "k": [FIXED],
    "l": [dict(sparq_l=5), dict(FIXED, sparq_l=0)],
    "min_kv": [dict(sparq_min_kv=1)],
    "all_rows": [dict(sparq_all_rows=True)],
    "selector": [dict(FIXED, sparq_selector=s) for s in ("oracle", "streaming", "h2o", "index")],
    "gqa": [dict(FIXED, sparq_gqa="per_head"), dict(sparq_gqa="per_head")],
    "mean_v": [dict(sparq_mean_v=False)],
    "basis": [dict(sparq_basis="model"), dict(FIXED, sparq_basis="pca")],
    "index_lists": [dict(FIXED, sparq_selector="index", sparq_index_lists=32)],
    "index_probe": [dict(FIXED, sparq_selector="index", sparq_index_lists=8, sparq_index_probe=3)],
    "coverage": [dict(sparq_coverage=0.8)],
    "k_min": [dict(sparq_k_min=40)],
    "k_frac": [dict(sparq_k_frac=0.5)],
    "kt_bits": [dict(sparq_kt_bits=16)],
    "topk_buckets": [dict(FIXED, sparq_topk_buckets=96)],
}
CASES = [(name, i, kw) for name, kws in VARIANTS.items() for i, kw in enumerate(kws)]


def test_every_row_of_the_table_has_a_case():
    names = [row.name for row in table.table()]
    assert sorted(VARIANTS) == sorted(names), "give each row of llama-sparq-settings.def a case here"


def _expect_measure(llm, step: int) -> bool:
    """The guard measures a fixed k's coverage at the first SparQ step of settings whose op reports
    (a ranking selector; the cache is in host memory here)."""
    p = llm.sparq_params()
    return step == 0 and p["sparq_k"] > 0 and p["sparq_selector"] in ("sparq", "oracle")


@pytest.mark.parametrize("name,i,kw", CASES, ids=[f"{n}-{i}" for n, i, _ in CASES])
def test_graph_nodes_have_the_probes_parameters(tiny_gqa_model, name, i, kw):
    """tiny GQA model (8 query heads on 2 KV heads, head size 16), a 300-token prompt, 3 decode steps"""
    settings = {"sparq": True, "sparq_min_kv": 0, **kw}
    llm = make_llm(tiny_gqa_model, n_ctx=512, **settings)
    assert _compare_graph_and_probe(llm, i, (name, kw)) >= 2, f"no SparQ node was captured with {kw}"


def _compare_graph_and_probe(llm, i, what) -> int:
    """After a 300-token prompt, 3 decode steps: each captured node's parameters against the probe's
    for its layer; returns the nodes compared."""
    from llama_sparq import _sparq
    from sparq_lab.capture import Capture, decode_op_params

    llm.reset()
    llm.eval(rand_prompt(300, 11 + i, llm.n_vocab()))
    compared = 0
    for step, t in enumerate(rand_prompt(3, 12 + i, llm.n_vocab())):
        with Capture(llm) as cap:
            llm.eval([t])
        for c in cap.calls:
            got = dict(c["params"])
            n_kv = c["K"].shape[2]  # ggml [d, n_kv, n_head_kv, n_stream] in NumPy order
            want = decode_op_params(_sparq.debug_op_params(llm._ctx.ctx, c["layer"], n_kv, _expect_measure(llm, step)),
                                    c["op"])
            got.pop("scale"), want.pop("scale")  # (the model's logit scale; the probe takes 1/sqrt(d))
            assert got == want, (what, c["layer"], step)
            compared += 1
    return compared


@pytest.mark.parametrize("make,kw,bit", [("make_tiny_gemma2", dict(std=0.5, softcap=5.0), "softcap"),
                                         ("make_tiny_gpt_oss", {}, "sinks"), ("make_tiny_bloom", {}, "alibi")])
def test_variant_models_graph_nodes_have_the_probes_parameters(tmp_path, make, kw, bit):
    """The attention variants (soft-capping, sinks, ALiBi) come from the layer by the same road: the
    graph's nodes and the probe carry the same softcap, max_bias and sinks (the feature bits)."""
    from sparq_lab import capture, models

    llm = make_llm(getattr(models, make)(tmp_path / "m.gguf", **kw), n_ctx=512, sparq=True, sparq_min_kv=0,
                   sparq_k=48)
    assert _compare_graph_and_probe(llm, 0, make) >= 2
    with capture.Capture(llm) as cap:
        llm.eval([5])
    feats = {"softcap": 1 << 15, "alibi": 1 << 16, "sinks": 1 << 17}  # ggml-sparq-params.h
    assert cap.calls and all(c["params"]["features"] & feats[bit] for c in cap.calls)


def test_the_probe_refuses_what_the_graph_could_not_build(tiny_gqa_model):
    """A layer without SparQ data and SparQ off are told apart from a node the settings cannot make."""
    from llama_sparq import _sparq

    llm = make_llm(tiny_gqa_model, n_ctx=512, sparq=True)
    with pytest.raises(RuntimeError, match="-1"):
        _sparq.debug_op_params(llm._ctx.ctx, 99, 256)
    llm.set_sparq(sparq=False)
    with pytest.raises(RuntimeError, match="-1"):
        _sparq.debug_op_params(llm._ctx.ctx, 0, 256)
