"""SparQ on attention whose K and V head sizes differ, and on MLA's absorbed decode, with tiny random
GGUFs of the real architectures: DeepSeek-V2 (``deepseek2`` as converted for MLA: 4 query heads over one
latent KV head, K 48 wide = kv_lora_rank 32 + a 16-wide RoPE part, V the first 32 of each K row, then
the heads' v_mla projection) and MiniCPM3 (``minicpm3``: 4 KV heads, K 24 wide, V 16).

Per model, as test_sparq_variants.py does for the other variants:
- exact settings (r = K's head size, k beyond the context) equal dense within upstream's own spread
  between its two dense paths (flash attention on and off), on the same teacher-forced tokens, with
  every decode step of each layer a SparQ call (the counters);
- approximate settings run SparQ on every layer at every decode step, with the kept data (K^T, the
  V sums: for MLA the sums of the first dv values of K's rows) equal to a recomputation;
- the op's nodes in the model's graph take V of its own head size (for MLA: the first dv values of
  each K row, one KV head for every query head) and their output equals the NumPy reference on the
  captured tensors.
The op against the reference for these shapes on every ISA is in test_kernels.py (the grid of
sparq_cases.py: dk != dv, and MLA's 576/512 latent read through K's rows).
"""

from __future__ import annotations

import numpy as np
import pytest
import sparq_ctx
from sparq_ctx import rand_prompt, teacher_forced

from sparq_lab import arch_models

STEPS = 12
PROMPT = 200

# name: (generator, K's head size, V's head size, KV heads, query heads, full-attention layers)
MODELS = {
    "deepseek2-mla": (arch_models.make_tiny_deepseek2, 48, 32, 1, 4, 2),
    "minicpm3-dk-dv": (arch_models.make_tiny_minicpm3, 24, 16, 4, 4, 2),
}


@pytest.fixture(scope="module")
def model_paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("mla")
    return {name: spec[0](d / f"{name}.gguf") for name, spec in MODELS.items()}


def make_llm(model, flash_attn=True, **kw):
    return sparq_ctx.make_llm(model, 1024, logits_all=True, flash_attn=flash_attn, **kw)


def forced(model, prompt, cont, **kw):
    llm = make_llm(model, **kw)
    return llm, teacher_forced(llm, prompt, cont)


@pytest.mark.parametrize("name", list(MODELS))
def test_exact_settings_equal_dense_within_upstreams_spread(model_paths, name):
    _, dk, _, _, _, n_full = MODELS[name]
    sp, diff, spread, scale = sparq_ctx.exact_against_dense(model_paths[name], dk, PROMPT, STEPS)
    st = sp.sparq_stats()
    assert st["n_sparq"] == n_full * STEPS and st["n_dense"]["attn_variant"] == 0, st
    assert diff <= 1.5 * spread + 1e-4 * scale, (name, diff, spread, scale)


@pytest.mark.parametrize("name", list(MODELS))
def test_approximate_settings_run_sparq_on_every_layer(model_paths, name):
    _, dk, _, _, _, n_full = MODELS[name]
    llm = make_llm(model_paths[name], sparq=True, sparq_r=dk // 4, sparq_k=32, sparq_l=8, sparq_min_kv=0)
    llm.eval(rand_prompt(PROMPT, 5, llm.n_vocab()))
    st0 = llm.sparq_stats()
    for t in range(STEPS):
        llm.eval([3 + t])
        assert np.all(np.isfinite(np.array(llm.scores[llm.n_tokens - 1])))
    st = llm.sparq_stats()
    assert st["n_sparq"] - st0["n_sparq"] == n_full * STEPS, (st0, st)
    assert llm.sparq_debug_check(sync=True) <= 1e-3


@pytest.mark.parametrize("name", list(MODELS))
def test_graph_nodes_take_v_of_its_size_and_equal_the_reference(model_paths, name):
    from test_selectors import check_calls_against_reference

    from sparq_lab.capture import Capture, stream0

    _, dk, dv, hkv, n_head, n_full = MODELS[name]
    settings = dict(sparq=True, sparq_r=dk // 4, sparq_k=48, sparq_l=8, sparq_min_kv=0)
    llm = make_llm(model_paths[name], **settings)
    llm.eval(rand_prompt(PROMPT, 7, llm.n_vocab()))
    with Capture(llm) as cap:
        for t in range(3):
            llm.eval([3 + t])
    for c in cap.calls:
        x = stream0(c)
        assert x["q"].shape[1:] == (n_head, dk) and x["K"].shape[1:] == (hkv, dk) and x["V"].shape[1:] == (hkv, dv)
        if name.endswith("mla"):
            # MLA: V is the latent, the first dv values of each cached K row (one shared KV head)
            assert np.array_equal(x["V"], x["K"][..., :dv])
    check_calls_against_reference(cap.calls, settings, 3 * n_full)


@pytest.mark.parametrize("name", list(MODELS))
def test_kept_data_follow_cache_operations_host_and_graph_rebuild(model_paths, name):
    """Removals, a context shift (MLA's K re-roped in place: its RoPE part), a state load and a synthetic
    fill (which writes no V where the cache holds none), each followed by a rebuild: the kept data
    (K^T and the V sums, MLA's of the first dv values of K's rows) equal a recomputation, by the host
    rebuild and by the device rebuild's graph (on the CPU backend), with the same logits."""
    from test_cuda import _rebuild_args, _rebuild_scenario

    host, checks_host = _rebuild_scenario(_rebuild_args(model_paths[name]))
    graph, checks_graph = _rebuild_scenario(_rebuild_args(model_paths[name]), graph_rebuild=True)
    assert max(checks_host) <= 1e-3 and max(checks_graph) <= 1e-3, (checks_host, checks_graph)
    assert np.all(np.isfinite(host)) and np.abs(graph - host).max() <= 1e-4 * np.abs(host).max()


@pytest.mark.parametrize("name", list(MODELS))
def test_compression_counts_k_and_v_rows_by_their_own_sizes(model_paths, name):
    """The counters' compression of the decode steps equals the cost model's with V's head size
    (cost.compression(..., dv=)), and differs from the one that would count V at K's size."""
    from sparq_lab import cost

    _, dk, dv, _, _, n_full = MODELS[name]
    r, k, n = dk // 4, 32, 8
    llm = make_llm(model_paths[name], sparq=True, sparq_r=r, sparq_k=k, sparq_l=8, sparq_min_kv=0)
    prompt = rand_prompt(PROMPT, 9, llm.n_vocab())
    llm.eval(prompt)
    st0 = llm.sparq_stats()
    for t in range(n):
        llm.eval([3 + t])
    st = llm.sparq_stats()
    assert st["n_sparq"] - st0["n_sparq"] == n_full * n
    S = np.arange(len(prompt) + 1, len(prompt) + n + 1)  # the cells each decode step attends over
    got = (st["compression"] * st["n_sparq"] - st0["compression"] * st0["n_sparq"]) / (st["n_sparq"] - st0["n_sparq"])
    kt_bits = llm.sparq_params()["sparq_kt_bits"]  # the default's
    want = float(np.mean(cost.compression(S, dk, r, k, kt_bits=kt_bits, dv=dv)))
    same_size = float(np.mean(cost.compression(S, dk, r, k, kt_bits=kt_bits)))
    assert abs(got - want) < 2e-3 and abs(got - same_size) > 5e-3, (got, want, same_size)
