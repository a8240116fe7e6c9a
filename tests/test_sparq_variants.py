"""The attention variants SparQ's op computes (soft-capping, ALiBi, attention sinks, a KQ bias), on
tiny random GGUFs of the real architectures that use them: Gemma 2 (soft-capping), Grok (its own
logit multiplier, then a cap: the op's scale and soft-cap), gpt-oss (sinks, with GQA and
sliding-window layers), BLOOM (ALiBi), Granite iSWA (sinks) and T5 (a KQ bias: its decoder's relative
position bias; the T5 tests at the end, which run its encoder first).

Per model:
- exact settings (r = the head size, k beyond the context) equal dense within upstream's own spread
  between its two dense paths (flash attention on and off), on the same teacher-forced tokens, and
  every decode step of each full-attention layer is a SparQ call (the counters);
- the variant matters: the same weights without it (soft-capping, sinks) move the logits far more
  than that spread, so the check above could not pass with the variant left out (ALiBi's: the
  kernels' tests, as BLOOM's max_bias is fixed);
- approximate settings run SparQ on those layers (every decode step counted, none dense), with the
  kept data equal to a recomputation;
- the op's nodes in the model's graph carry the variant (its parameters, the layer's sinks) and
  their output equals the NumPy reference on the captured tensors.
Grok's flash attention is the fork's general fix (patch 0018: upstream forced it off), checked here
against the non-flash path, with Grok's refusals (a cap or a scale the op cannot take).
The op against the reference with each variant on every ISA is in test_kernels.py (the grid of
sparq_cases.py); the parameters' encoding and each backend's support in params-check.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import sparq_ctx
from sparq_ctx import rand_prompt, teacher_forced

from sparq_lab import arch_models, models

STEPS = 12
PROMPT = 200

# name: (generator, its arguments, head size, full-attention layers)
MODELS = {
    "gemma2-softcap": (models.make_tiny_gemma2, dict(std=0.5, softcap=5.0), 16, 1),
    "gpt-oss-sinks": (models.make_tiny_gpt_oss, dict(), 16, 1),
    "bloom-alibi": (models.make_tiny_bloom, dict(), 16, 2),
    "granite-swa-sinks": (models.make_tiny_granite_swa, dict(), 16, 1),
    # (out_scale 0.3: not the 1/sqrt(16) a call's scale would be, so the nodes' scale shows it)
    "grok-softcap": (arch_models.make_tiny_grok, dict(std=0.5, cap=5.0, out_scale=0.3), 16, 2),
}


@pytest.fixture(scope="module")
def model_paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("variants")
    return {name: make(d / f"{name}.gguf", **kw) for name, (make, kw, _, _) in MODELS.items()}


def make_llm(model, flash_attn=True, **kw):
    return sparq_ctx.make_llm(model, 1024, logits_all=True, flash_attn=flash_attn, **kw)


def forced(model, prompt, cont, **kw):
    llm = make_llm(model, **kw)
    lg = teacher_forced(llm, prompt, cont)
    return llm, lg


@pytest.mark.parametrize("name", list(MODELS))
def test_exact_settings_equal_dense_within_upstreams_spread(model_paths, name):
    _, _, head, n_full = MODELS[name]
    sp, diff, spread, scale = sparq_ctx.exact_against_dense(model_paths[name], head, PROMPT, STEPS)
    st = sp.sparq_stats()
    assert st["n_sparq"] == n_full * STEPS, st
    assert diff <= 1.5 * spread + 1e-4 * scale, (name, diff, spread, scale)


@pytest.mark.parametrize("name,without", [
    ("gemma2-softcap", lambda p: models.make_tiny_gemma2(p, std=0.5, softcap=1e6)),  # a cap too large to bite
    ("gpt-oss-sinks", lambda p: models.make_tiny_gpt_oss(p, sink_shift=-60.0)),       # sinks of weight ~0
    ("grok-softcap", lambda p: arch_models.make_tiny_grok(p, std=0.5, cap=1e6, out_scale=0.3)),
])
def test_the_variant_matters(model_paths, tmp_path, name, without):
    """The same weights without the variant: the logits move far beyond the dense paths' spread, so
    leaving the variant out of the op would fail the exactness check."""
    path = model_paths[name]
    other = without(tmp_path / "without.gguf")
    dense = make_llm(path)
    prompt = rand_prompt(PROMPT, 3, dense.n_vocab())
    cont = [5] * 4
    want = teacher_forced(dense, prompt, cont)
    _, nofa = forced(path, prompt, cont, flash_attn=False)
    _, free = forced(other, prompt, cont)
    spread = np.abs(nofa - want).max()
    assert np.abs(free - want).max() > 20 * spread + 1e-3, (np.abs(free - want).max(), spread)


@pytest.mark.parametrize("name", list(MODELS))
def test_approximate_settings_run_sparq_on_the_variant_layers(model_paths, name):
    _, _, head, n_full = MODELS[name]
    path = model_paths[name]
    llm = make_llm(path, sparq=True, sparq_r=head // 4, sparq_k=32, sparq_l=8, sparq_min_kv=0)
    prompt = rand_prompt(PROMPT, 5, llm.n_vocab())
    llm.eval(prompt)
    st0 = llm.sparq_stats()
    for t in range(STEPS):
        llm.eval([3 + t])
        assert np.all(np.isfinite(np.array(llm.scores[llm.n_tokens - 1])))
    st = llm.sparq_stats()
    assert st["n_sparq"] - st0["n_sparq"] == n_full * STEPS, (st0, st)
    assert llm.sparq_debug_check(sync=True) <= 1e-3


# the variant each model's SparQ nodes must carry: softcap, max_bias, sinks, the op's logit scale
CARRIED = {"gemma2-softcap": (5.0, 0.0, False, 1.0), "gpt-oss-sinks": (0.0, 0.0, True, 0.25),
           "bloom-alibi": (0.0, 8.0, False, 0.25), "granite-swa-sinks": (0.0, 0.0, True, 0.25),
           "grok-softcap": (5.0, 0.0, False, 0.3)}  # (Grok: its out_scale times the call's 1)


@pytest.mark.parametrize("name", list(MODELS))
def test_graph_nodes_carry_the_variant_and_equal_the_reference(model_paths, name):
    from test_selectors import check_calls_against_reference

    from sparq_lab.capture import Capture

    _, _, head, n_full = MODELS[name]
    settings = dict(sparq=True, sparq_r=head // 4, sparq_k=48, sparq_l=8, sparq_min_kv=0)
    llm = make_llm(model_paths[name], **settings)
    llm.eval(rand_prompt(PROMPT, 7, llm.n_vocab()))
    with Capture(llm) as cap:
        for t in range(3):
            llm.eval([3 + t])
    softcap, max_bias, sinks, scale = CARRIED[name]
    for c in cap.calls:
        p = c["params"]
        assert (p["softcap"], p["max_bias"], p["scale"]) == pytest.approx((softcap, max_bias, scale)), p
        assert (c["sinks"] is not None) == sinks and (not sinks or np.abs(c["sinks"]).max() > 0)
    check_calls_against_reference(cap.calls, settings, 3 * n_full)


def node_names(llm, tokens):
    """The names of the nodes the graph computes while llm evaluates tokens (an eval callback that
    asks for no data)."""
    import ctypes

    from llama_sparq import _sparq

    from sparq_lab.capture import EVAL_CB

    names = set()

    def cb(tp, ask, _ud):
        names.add(tp.contents.name.decode(errors="replace"))
        return not ask

    fn = EVAL_CB(cb)
    _sparq.set_eval_callback(llm._ctx.ctx, ctypes.cast(fn, ctypes.c_void_p).value)
    try:
        llm.eval(tokens)
    finally:
        _sparq.set_eval_callback(llm._ctx.ctx, None)
    return names


def non_flash_nodes(names):
    return {n for n in names if n.startswith(("kq_soft_max-", "kq_tanh-"))}


def test_grok_flash_attention_equals_the_non_flash_path(model_paths):
    """The fork's fix (patch 0018): with flash attention on, Grok's graph runs ggml's flash attention
    (no softmax or tanh node), whose scale and soft-cap are Grok's out_scale and cap, and its logits
    equal the non-flash path's (upstream's only one for Grok) within a rounding of the largest."""
    path = model_paths["grok-softcap"]
    prompt = rand_prompt(PROMPT, 3, make_llm(path).n_vocab())
    cont = [5] * 4
    got = {}
    for fa in (True, False):
        llm = make_llm(path, flash_attn=fa)
        nodes = non_flash_nodes(node_names(llm, prompt[:8]))
        assert bool(nodes) != fa, (fa, sorted(nodes))
        llm.reset()
        got[fa] = teacher_forced(llm, prompt, cont)
    diff, scale = np.abs(got[True] - got[False]).max(), np.abs(got[False]).max()
    assert diff <= 1e-3 * scale, (diff, scale)


@pytest.mark.parametrize("kw,why", [
    (dict(cap=-5.0), "Grok's attention with a soft-cap that is not finite and > 0"),
    (dict(cap=float("inf")), "Grok's attention with a soft-cap that is not finite and > 0"),
    (dict(out_scale=float("nan")), "Grok's attention with an output scale that is not finite and > 0"),
    (dict(out_scale=0.0), "Grok's attention with an output scale that is not finite and > 0"),
])
def test_grok_attention_the_op_cannot_take_is_refused(tmp_path, kw, why):
    """A Grok GGUF whose cap or output scale the op cannot take: the context runs dense (with flash
    attention asked and a cap flash attention cannot take either, the non-flash nodes), and SparQ
    asked for is refused, naming the reason."""
    from llama_sparq import Llama

    path = arch_models.make_tiny_grok(tmp_path / "grok-bad.gguf", std=0.5, **kw)
    nodes = non_flash_nodes(node_names(make_llm(path), [1, 5, 6]))
    assert bool(nodes) == ("cap" in kw), sorted(nodes)
    with pytest.raises(RuntimeError, match=re.escape(f"can run SparQ (2 attn_variant: {why})")):
        Llama(str(path), n_ctx=256, verbose=False, sparq=True)


# T5 (make_tiny_t5): an encoder and a decoder of 2 layers, heads of 16; the decoder's self-attention adds
# a relative position bias to its scores (upstream's KQ bias), its cross-attention runs dense (no cache)
T5_HEAD, T5_LAYERS, T5_ENC = 16, 2, 24
T5_RELB = 2.0  # the bias's spread: it moves the scores (T5's logit scale is 1)


@pytest.fixture(scope="module")
def t5_path(tmp_path_factory):
    return models.make_tiny_t5(tmp_path_factory.mktemp("t5") / "t5.gguf", rel_b_std=T5_RELB)


def t5_encode(llm, tokens):
    """T5's encoder over tokens (llama_encode): the decoder's cross-attention reads its output."""
    llm._batch.set_batch(tokens, n_past=0, logits_all=False)
    llm._ctx.encode(llm._batch)


def t5_forced(path, enc, prompt, cont, **kw):
    """The encoder over enc, then the decoder teacher-forced (the Llama and the steps' logits)."""
    llm = make_llm(path, **kw)
    t5_encode(llm, enc)
    return llm, teacher_forced(llm, prompt, cont)


def t5_tokens(n_vocab):
    enc = rand_prompt(T5_ENC, 1, n_vocab)
    prompt = [0] + rand_prompt(PROMPT - 1, 3, n_vocab)  # the decoder starts at its start token (0)
    cont = [int(t) for t in np.random.default_rng(4).integers(3, n_vocab, size=STEPS)]
    return enc, prompt, cont


def test_t5_exact_settings_equal_dense_within_the_cache_types_spread(t5_path):
    """SparQ in exact mode (r = the head size, k beyond the context) on T5's decoder self-attention
    equals dense on the same cache. Upstream's two dense paths are one here (flash attention does not
    take a KQ bias: both run the same nodes), so the spread is its dense attention over an f16 cache
    against an f32 one, and SparQ is checked on each."""
    n_vocab = make_llm(t5_path).n_vocab()
    enc, prompt, cont = t5_tokens(n_vocab)
    f32 = dict(type_k=0, type_v=0)  # GGML_TYPE_F32
    _, d16 = t5_forced(t5_path, enc, prompt, cont)
    _, d32 = t5_forced(t5_path, enc, prompt, cont, **f32)
    spread = np.abs(d16 - d32).max()
    scale = np.abs(d16).max()
    exact = dict(sparq_r=T5_HEAD, sparq_k=4096, sparq_min_kv=0)
    for want, kw in ((d16, {}), (d32, f32)):
        sp, got = t5_forced(t5_path, enc, prompt, cont, **exact, **kw)
        st = sp.sparq_stats()
        assert st["n_sparq"] == T5_LAYERS * STEPS, st
        diff = np.abs(got - want).max()
        assert diff <= 1.5 * spread + 1e-4 * scale, (kw, diff, spread, scale)
    # the bias matters: the same weights without it move the logits far beyond that spread
    flat = models.make_tiny_t5(t5_path.parent / "t5-flat.gguf", rel_b_std=0.0)
    _, free = t5_forced(flat, enc, prompt, cont)
    assert np.abs(free - d16).max() > 20 * spread + 1e-3, (np.abs(free - d16).max(), spread)


def test_t5_decoder_self_attention_runs_sparq_and_equals_the_reference(t5_path):
    """Approximate settings: every decode step of each decoder layer is a SparQ call (the counters),
    the kept data equal a recomputation, and each captured node carries the layer's bias (a KQ bias
    of the step's cells) and equals the NumPy reference on its tensors."""
    from test_selectors import check_calls_against_reference

    from sparq_lab.capture import Capture

    settings = dict(sparq=True, sparq_r=T5_HEAD // 4, sparq_k=48, sparq_l=8, sparq_min_kv=0)
    llm = make_llm(t5_path, **settings)
    enc, prompt, _ = t5_tokens(llm.n_vocab())
    t5_encode(llm, enc)
    llm.eval(prompt)
    st0 = llm.sparq_stats()
    with Capture(llm) as cap:
        for t in range(3):
            llm.eval([3 + t])
    for t in range(STEPS - 3):
        llm.eval([7 + t])
        assert np.all(np.isfinite(np.array(llm.scores[llm.n_tokens - 1])))
    st = llm.sparq_stats()
    assert st["n_sparq"] - st0["n_sparq"] == T5_LAYERS * STEPS, (st0, st)
    assert llm.sparq_debug_check(sync=True) <= 1e-3
    for c in cap.calls:
        b = c["kq_b"]
        assert b is not None and b.shape[-1] == c["K"].shape[-2] and np.abs(b).max() > 0, None if b is None else b.shape
    check_calls_against_reference(cap.calls, settings, 3 * T5_LAYERS)
