"""Tiny random GGUFs of more of the pinned llama.cpp's architectures, one per outcome of the coverage
table (docs/coverage.md): for each, `tests/test_coverage_table.py` decodes a few tokens with SparQ on and
checks the counters against the table's row.

:data:`PROOFS` maps an architecture's name to the generator of its tiny GGUF (the table's "proof"
column reads it as text); the llama, Gemma 2 and Granite iSWA generators live in
:mod:`sparq_lab.models`. Each generator writes ``path`` and returns it; the same arguments give the
same bytes; weights are random (N(0, 0.02), norms 1), f32, with the byte-fallback vocabulary of
:func:`sparq_lab.models.tiny_vocab`.

* :func:`make_tiny_gemma3`: Gemma 3, sliding-window layers and full-attention ones (SparQ runs on
  the full-attention layers).
* :func:`make_tiny_mpt`: MPT with ALiBi position biases.
* :func:`make_tiny_deepseek2`: DeepSeek-V2 with multi-head latent attention (the absorbed decode:
  one latent KV head, K ``kv_lora + rope`` wide, V ``kv_lora`` wide, the first values of K's rows;
  SparQ runs with every query head in one group, then the heads' v_mla projection).
* :func:`make_tiny_minicpm3`: MiniCPM3, low-rank attention decompressed to heads whose K (a
  no-position part and a shared RoPE part) is wider than V (SparQ runs with V of its own size).
* :func:`make_tiny_grok`: Grok, whose attention caps its scaled scores (its own logit multiplier and
  cap), with a mixture of experts.
* gpt-oss (attention sinks, a mixture of experts) and T5 (an encoder-decoder whose decoder adds a KQ
  bias: a proof is decoded after its encoder ran) are :mod:`sparq_lab.models`'s, re-exported.
* :func:`make_tiny_lfm2`: LFM2, a hybrid of short-convolution and attention layers (SparQ runs on the
  attention layers of its hybrid memory).

For timing, :func:`make_mla_shape` (and its cached :func:`mla_shape_path`, ``bench/sweep.py e2e --model
mla``) writes a synthetic model with DeepSeek-V2-Lite's MLA attention shape and a few layers.

Command line (with ``dev/`` on ``sys.path``)::

    python -m sparq_lab.arch_models ARCH OUT.gguf
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from sparq_lab.models import (_add_tiny_shape, _add_tiny_tokenizer, _write_gguf_atomic, make_tiny_gemma2,
                              make_tiny_gpt_oss, make_tiny_granite_swa, make_tiny_llama, make_tiny_t5)

__all__ = ["PROOFS", "make_tiny_gemma3", "make_tiny_mpt", "make_tiny_deepseek2", "make_tiny_minicpm3",
           "make_tiny_lfm2", "make_tiny_grok", "make_tiny_gpt_oss", "make_tiny_t5", "make_mla_shape", "mla_shape_path",
           "MLA_SHAPE", "main"]

_N_VOCAB = 260
_STD = 0.02


class _Tensors:
    """Random tensors drawn in call order from one generator (same seed, same bytes). q8_0: the 2-D
    weights whose input dimension is whole blocks are stored in Q8_0 (timing models), the rest f32."""

    def __init__(self, seed: int, q8_0: bool = False, std: float = _STD):
        import gguf
        import numpy as np

        self.gguf, self.np, self.f32 = gguf, np, gguf.GGMLQuantizationType.F32
        self.q8_0 = q8_0
        self.std = std
        self.rng = np.random.default_rng(seed)
        self.items: list = []

    def mat(self, name: str, *shape: int, std: float | None = None) -> None:
        """A weight of numpy shape ``shape`` (ggml's ne reversed: the input dimension last), N(0, std)
        (default: the generator's)."""
        np = self.np
        w = self.rng.standard_normal(shape, dtype=np.float32) * np.float32(self.std if std is None else std)
        if self.q8_0 and len(shape) == 2 and shape[-1] % 32 == 0:
            q8 = self.gguf.GGMLQuantizationType.Q8_0
            self.items.append((name, (self.gguf.quants.quantize(w, q8), q8)))
            return
        self.items.append((name, (w, self.f32)))

    def ones(self, name: str, n: int) -> None:
        self.items.append((name, (self.np.ones(n, dtype=self.np.float32), self.f32)))

    def zeros(self, name: str, n: int) -> None:
        self.items.append((name, (self.np.zeros(n, dtype=self.np.float32), self.f32)))


def _write_gguf(path: Path, metadata, tensors: list, arch: str) -> Path:
    import gguf

    return _write_gguf_atomic(gguf, path, metadata, tensors, arch=arch)


def _gated_ffn(t: _Tensors, p: str, n_embd: int, n_ff: int) -> None:
    t.ones(p + "ffn_norm.weight", n_embd)
    t.mat(p + "ffn_gate.weight", n_ff, n_embd)
    t.mat(p + "ffn_up.weight", n_ff, n_embd)
    t.mat(p + "ffn_down.weight", n_embd, n_ff)


def _common(w, name: str, n_layer: int, n_embd: int, n_ff: int, n_head: int, n_head_kv: int | list[int]) -> None:
    import gguf

    w.add_name(name)
    w.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    w.add_vocab_size(_N_VOCAB)
    _add_tiny_shape(w, 4096, n_embd, n_layer, n_ff, n_head, n_head_kv)
    _add_tiny_tokenizer(w, _N_VOCAB)


def _attn_qkvo(t, p: str, n_embd: int, n_head: int, n_head_kv: int, hd: int) -> None:
    """A layer's attention norm and Q, K, V, output projections (llama-style names)."""
    t.ones(p + "attn_norm.weight", n_embd)
    t.mat(p + "attn_q.weight", n_head * hd, n_embd)
    t.mat(p + "attn_k.weight", n_head_kv * hd, n_embd)
    t.mat(p + "attn_v.weight", n_head_kv * hd, n_embd)
    t.mat(p + "attn_output.weight", n_embd, n_head * hd)


def make_tiny_gemma3(path: str | os.PathLike[str], *, n_layer: int = 4, seed: int = 0) -> Path:
    """Gemma 3 (architecture ``gemma3``): a 32-cell sliding window on layers 0-2 and full attention on
    layer 3 (the pattern of every 4th layer), Q and K RMS norms, 4 heads of 16, 2 KV heads."""
    n_embd, n_head, n_head_kv, hd, n_ff = 64, 4, 2, 16, 128
    t = _Tensors(seed)
    t.mat("token_embd.weight", _N_VOCAB, n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        _attn_qkvo(t, p, n_embd, n_head, n_head_kv, hd)
        t.ones(p + "attn_q_norm.weight", hd)
        t.ones(p + "attn_k_norm.weight", hd)
        t.ones(p + "post_attention_norm.weight", n_embd)
        _gated_ffn(t, p, n_embd, n_ff)
        t.ones(p + "post_ffw_norm.weight", n_embd)
    t.ones("output_norm.weight", n_embd)

    def metadata(w) -> None:
        _common(w, "llama-sparq-tiny-gemma3", n_layer, n_embd, n_ff, n_head, n_head_kv)
        w.add_key_length(hd)
        w.add_value_length(hd)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_rope_freq_base(10000.0)
        w.add_sliding_window(32)
        w.add_sliding_window_pattern([(i + 1) % 4 != 0 for i in range(n_layer)])

    return _write_gguf(Path(path), metadata, t.items, arch="gemma3")


def make_tiny_mpt(path: str | os.PathLike[str], *, n_layer: int = 2, seed: int = 0) -> Path:
    """MPT (architecture ``mpt``): ALiBi position biases (max bias 8), fused QKV, layer norms, a GELU
    FFN, 4 heads of 16."""
    n_embd, n_head, n_ff = 64, 4, 128
    t = _Tensors(seed)
    t.mat("token_embd.weight", _N_VOCAB, n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        t.ones(p + "attn_norm.weight", n_embd)
        t.mat(p + "attn_qkv.weight", 3 * n_embd, n_embd)
        t.mat(p + "attn_output.weight", n_embd, n_embd)
        t.ones(p + "ffn_norm.weight", n_embd)
        t.mat(p + "ffn_up.weight", n_ff, n_embd)
        t.mat(p + "ffn_down.weight", n_embd, n_ff)
    t.ones("output_norm.weight", n_embd)

    def metadata(w) -> None:
        _common(w, "llama-sparq-tiny-mpt", n_layer, n_embd, n_ff, n_head, n_head)
        w.add_layer_norm_eps(1e-5)
        w.add_max_alibi_bias(8.0)

    return _write_gguf(Path(path), metadata, t.items, arch="mpt")


def _low_rank_qkv(t: _Tensors, p: str, n_embd: int, n_head: int, q_lora: int, kv_lora: int, nope: int,
                  rope: int) -> None:
    """The low-rank Q and compressed KV of DeepSeek-V2-style attention (MLA, MiniCPM3): the attention
    norm, Q down and up (heads of nope + rope), KV down to kv_lora plus the shared RoPE part."""
    t.ones(p + "attn_norm.weight", n_embd)
    t.ones(p + "attn_q_a_norm.weight", q_lora)
    t.ones(p + "attn_kv_a_norm.weight", kv_lora)
    t.mat(p + "attn_q_a.weight", q_lora, n_embd)
    t.mat(p + "attn_q_b.weight", n_head * (nope + rope), q_lora)
    t.mat(p + "attn_kv_a_mqa.weight", kv_lora + rope, n_embd)


def _mla_layers(t: _Tensors, n_layer, n_embd, n_head, n_ff, q_lora, kv_lora, nope, rope, v_head) -> None:
    """deepseek2's layers as converted for MLA's absorbed decode (k_b and v_b per head), each with a
    dense FFN, and the output norm."""
    for i in range(n_layer):
        p = f"blk.{i}."
        _low_rank_qkv(t, p, n_embd, n_head, q_lora, kv_lora, nope, rope)
        t.mat(p + "attn_k_b.weight", n_head, kv_lora, nope)
        t.mat(p + "attn_v_b.weight", n_head, v_head, kv_lora)
        t.mat(p + "attn_output.weight", n_embd, n_head * v_head)
        _gated_ffn(t, p, n_embd, n_ff)
    t.ones("output_norm.weight", n_embd)


def _lora_rope_keys(w, rope, eps, q_lora, kv_lora) -> None:
    """The keys deepseek2 and minicpm3 share: the RoPE part's size and base, the norm's eps, the
    query's and the KV's low ranks."""
    w.add_rope_dimension_count(rope)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(eps)
    w.add_q_lora_rank(q_lora)
    w.add_kv_lora_rank(kv_lora)


def _mla_metadata(w, kv_lora, rope, nope, v_head, q_lora, n_layer, n_ff) -> None:
    """deepseek2's attention keys: the cache's K (latent + RoPE) and V (latent), the heads' sizes for
    MLA, the ranks, every layer a dense FFN."""
    w.add_key_length(kv_lora + rope)
    w.add_value_length(kv_lora)
    w.add_key_length_mla(nope + rope)
    w.add_value_length_mla(v_head)
    _lora_rope_keys(w, rope, 1e-6, q_lora, kv_lora)
    w.add_leading_dense_block_count(n_layer)
    w.add_expert_feed_forward_length(n_ff)
    w.add_expert_shared_count(0)


def make_tiny_deepseek2(path: str | os.PathLike[str], *, n_layer: int = 2, seed: int = 0) -> Path:
    """DeepSeek-V2 (architecture ``deepseek2``) as converted for MLA's absorbed decode: 4 query heads
    over one latent KV head (kv_lora_rank 32 plus a 16-wide RoPE part: K 48 wide, V 32), q_lora_rank
    32; every layer's FFN dense (``leading_dense_block_count`` = n_layer)."""
    n_embd, n_head, n_ff = 64, 4, 128
    q_lora, kv_lora, rope, nope, v_mla = 32, 32, 16, 32, 32
    t = _Tensors(seed)
    t.mat("token_embd.weight", _N_VOCAB, n_embd)
    _mla_layers(t, n_layer, n_embd, n_head, n_ff, q_lora, kv_lora, nope, rope, v_mla)

    def metadata(w) -> None:
        _common(w, "llama-sparq-tiny-deepseek2", n_layer, n_embd, n_ff, n_head, 1)
        _mla_metadata(w, kv_lora, rope, nope, v_mla, q_lora, n_layer, n_ff)

    return _write_gguf(Path(path), metadata, t.items, arch="deepseek2")


def make_tiny_minicpm3(path: str | os.PathLike[str], *, n_layer: int = 2, seed: int = 0) -> Path:
    """MiniCPM3 (architecture ``minicpm3``): low-rank Q and KV (ranks 32) decompressed to 4 heads whose
    K is a 16-wide no-position part and a shared 8-wide RoPE part (24) and whose V is 16 wide."""
    n_embd, n_head, n_ff = 64, 4, 128
    q_lora, kv_lora, rope, nope, dv = 32, 32, 8, 16, 16
    t = _Tensors(seed)
    t.mat("token_embd.weight", _N_VOCAB, n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        _low_rank_qkv(t, p, n_embd, n_head, q_lora, kv_lora, nope, rope)
        t.mat(p + "attn_kv_b.weight", n_head * (nope + dv), kv_lora)
        t.mat(p + "attn_output.weight", n_embd, n_head * dv)
        _gated_ffn(t, p, n_embd, n_ff)
    t.ones("output_norm.weight", n_embd)

    def metadata(w) -> None:
        _common(w, "llama-sparq-tiny-minicpm3", n_layer, n_embd, n_ff, n_head, n_head)
        w.add_key_length(nope + rope)
        w.add_value_length(dv)
        _lora_rope_keys(w, rope, 1e-5, q_lora, kv_lora)

    return _write_gguf(Path(path), metadata, t.items, arch="minicpm3")


# DeepSeek-V2-Lite's attention (MLA): 16 query heads, kv_lora_rank 512, a 64-wide RoPE part, a
# 128-wide no-position part, V heads of 128; with a q_lora_rank (see make_mla_shape), one dense FFN
# as wide as its active experts, and Llama 2's vocabulary size
MLA_SHAPE = dict(n_embd=2048, n_head=16, kv_lora=512, rope=64, nope=128, v_head=128, q_lora=1536, n_ff=11264,
                 n_vocab=32000)


def make_mla_shape(path: str | os.PathLike[str], *, n_layer: int = 4, n_ctx_train: int = 1 << 17,
                   seed: int = 0) -> Path:
    """A synthetic ``deepseek2`` model with DeepSeek-V2-Lite's MLA attention shape (16 query heads over
    one latent KV head: K 576 = kv_lora_rank 512 + RoPE 64, V 512, qk_nope 128, v_head 128, width
    2048) and ``n_layer`` layers, for timing only (random Q8_0 weights, the per-head k_b and v_b f32;
    its text is meaningless).

    Where it is not Lite: Q goes through a q_lora_rank of 1536 (DeepSeek-V2's; llama.cpp reads Lite's
    direct Q only for its own layer counts), every layer's FFN is one dense SwiGLU of 11264 (the
    active weights of Lite's 2 shared and 6 routed experts of 1408), and the vocabulary is 32000
    (Lite's 102400 would make the output projection several layers' weights). The share of decode
    time in attention follows the per-layer weights and cache, so a few layers give Lite's ratios.
    """
    sh = MLA_SHAPE
    n_embd, n_head, n_ff, n_vocab = sh["n_embd"], sh["n_head"], sh["n_ff"], sh["n_vocab"]
    q_lora, kv_lora, rope, nope, v_head = sh["q_lora"], sh["kv_lora"], sh["rope"], sh["nope"], sh["v_head"]
    t = _Tensors(seed, q8_0=True)
    t.mat("token_embd.weight", n_vocab, n_embd)
    _mla_layers(t, n_layer, n_embd, n_head, n_ff, q_lora, kv_lora, nope, rope, v_head)
    t.mat("output.weight", n_vocab, n_embd)

    def metadata(w) -> None:
        import gguf

        w.add_name("llama-sparq synthetic (DeepSeek-V2-Lite MLA attention shape)")
        w.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q8_0))
        w.add_vocab_size(n_vocab)
        _add_tiny_shape(w, n_ctx_train, n_embd, n_layer, n_ff, n_head, 1)
        _add_tiny_tokenizer(w, n_vocab)
        _mla_metadata(w, kv_lora, rope, nope, v_head, q_lora, n_layer, n_ff)

    return _write_gguf(Path(path), metadata, t.items, arch="deepseek2")


def mla_shape_path(n_layer: int = 4) -> Path:
    """The cached MLA-shape model with ``n_layer`` layers (``model_dir()/mla-shape-<n>l.gguf``), written
    by :func:`make_mla_shape` (seed 0, deterministic) on first use."""
    from sparq_lab.models import _cached_synthetic

    return _cached_synthetic("mla-shape", n_layer, make_mla_shape)


def make_tiny_lfm2(path: str | os.PathLike[str], *, n_layer: int = 4, seed: int = 0) -> Path:
    """LFM2 (architecture ``lfm2``), a hybrid: short-convolution layers (0, 2: no KV heads, a recurrent
    state) and attention layers (1, 3: 4 heads of 16 over 2 KV heads, Q and K RMS norms) in
    llama.cpp's hybrid memory."""
    n_embd, n_head, n_head_kv, hd, n_ff, l_cache = 64, 4, 2, 16, 128, 3
    t = _Tensors(seed)
    t.mat("token_embd.weight", _N_VOCAB, n_embd)
    attn = [i % 2 == 1 for i in range(n_layer)]
    for i in range(n_layer):
        p = f"blk.{i}."
        _gated_ffn(t, p, n_embd, n_ff)
        t.ones(p + "attn_norm.weight", n_embd)
        if attn[i]:
            t.ones(p + "attn_q_norm.weight", hd)
            t.ones(p + "attn_k_norm.weight", hd)
            t.mat(p + "attn_q.weight", n_head * hd, n_embd)
            t.mat(p + "attn_k.weight", n_head_kv * hd, n_embd)
            t.mat(p + "attn_v.weight", n_head_kv * hd, n_embd)
            t.mat(p + "attn_output.weight", n_embd, n_embd)
        else:
            t.mat(p + "shortconv.conv.weight", n_embd, l_cache)
            t.mat(p + "shortconv.in_proj.weight", 3 * n_embd, n_embd)
            t.mat(p + "shortconv.out_proj.weight", n_embd, n_embd)
    t.ones("token_embd_norm.weight", n_embd)

    def metadata(w) -> None:
        _common(w, "llama-sparq-tiny-lfm2", n_layer, n_embd, n_ff, n_head, [n_head_kv if a else 0 for a in attn])
        w.add_rope_freq_base(10000.0)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_shortconv_l_cache(l_cache)

    return _write_gguf(Path(path), metadata, t.items, arch="lfm2")


def make_tiny_grok(path: str | os.PathLike[str], *, n_layer: int = 2, std: float = _STD, cap: float = 30.0,
                   out_scale: float = 0.25, seed: int = 0) -> Path:
    """Grok (architecture ``grok``): llama-style attention, 4 heads of 16 over 2 KV heads, whose scores
    are ``cap * tanh(q.k * out_scale / cap)`` (upstream's defaults: cap 30, out_scale 0.0884 for heads of
    128; here 1/sqrt(16)), norms after the attention and after the FFN, and a GELU mixture of 4 experts
    with every expert used (the routing is continuous: a rounding moves the logits by a rounding).
    Weights N(0, ``std``) (larger: the scores spread, and a small ``cap`` bites; a huge one never does),
    the output projection N(0, 1). ``cap`` and ``out_scale`` are written as given (a negative cap or a
    non-finite scale: the GGUFs SparQ refuses, for the tests of those refusals)."""
    for k, v in (("std", std), ("cap", cap), ("out_scale", out_scale)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"{k} must be a number, got {v!r}")
    n_embd, n_head, n_head_kv, hd, n_ff, n_expert = 64, 4, 2, 16, 64, 4
    t = _Tensors(seed, std=std)
    t.mat("token_embd.weight", _N_VOCAB, n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        _attn_qkvo(t, p, n_embd, n_head, n_head_kv, hd)
        t.ones(p + "attn_output_norm.weight", n_embd)
        t.ones(p + "ffn_norm.weight", n_embd)
        t.mat(p + "ffn_gate_inp.weight", n_expert, n_embd)
        t.mat(p + "ffn_gate_exps.weight", n_expert, n_ff, n_embd)
        t.mat(p + "ffn_up_exps.weight", n_expert, n_ff, n_embd)
        t.mat(p + "ffn_down_exps.weight", n_expert, n_embd, n_ff)
        t.ones(p + "post_ffw_norm.weight", n_embd)
    t.ones("output_norm.weight", n_embd)
    t.mat("output.weight", _N_VOCAB, n_embd, std=1.0)

    def metadata(w) -> None:
        _common(w, "llama-sparq-tiny-grok", n_layer, n_embd, n_ff, n_head, n_head_kv)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_freq_base(10000.0)
        w.add_expert_count(n_expert)
        w.add_expert_used_count(n_expert)
        w.add_expert_feed_forward_length(n_ff)
        w.add_attn_logit_softcapping(float(cap))
        w.add_attn_output_scale(float(out_scale))

    return _write_gguf(Path(path), metadata, t.items, arch="grok")


# The tiny GGUF that proves each architecture's row of docs/coverage.md (its name as llama.cpp spells
# it: the GGUF's general.architecture)
PROOFS = {
    "llama": make_tiny_llama,
    "gemma2": make_tiny_gemma2,
    "gemma3": make_tiny_gemma3,
    "granite_swa": make_tiny_granite_swa,
    "mpt": make_tiny_mpt,
    "deepseek2": make_tiny_deepseek2,
    "minicpm3": make_tiny_minicpm3,
    "lfm2": make_tiny_lfm2,
    "grok": make_tiny_grok,
    "gpt-oss": make_tiny_gpt_oss,
    "t5": make_tiny_t5,
}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sparq_lab.arch_models",
                                 description="Write the tiny GGUF of one architecture of the coverage table.")
    ap.add_argument("arch", choices=sorted(PROOFS))
    ap.add_argument("out", help="output .gguf path")
    args = ap.parse_args(argv)
    print(PROOFS[args.arch](args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
