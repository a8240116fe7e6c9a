"""Synthetic GGUF models for the tests and benchmarks: a tiny random llama (and Gemma 2), and
random models with the per-layer shapes of Llama 2 7B and Llama 3 8B for timing.

Deterministic (same arguments, same bytes): tests build them on the fly, and the
paper-shape and GQA-shape models are cached in ``llama_sparq.models.model_dir()``.

* :func:`make_tiny_llama` writes a small llama-architecture GGUF with random
  weights and a byte-fallback SentencePiece vocabulary, in well under a second.
* :func:`make_tiny_gemma2`: the same with Gemma 2's soft-capped attention.
* :func:`make_tiny_granite_swa`: the same as Granite's iSWA architecture, whose every layer has
  attention sinks.
* :func:`make_tiny_gpt_oss` (``gpt-oss``: sinks, GQA, sliding-window layers, a mixture of experts)
  and :func:`make_tiny_bloom` (ALiBi): the attention variants on real architectures;
  :func:`make_tiny_t5`: T5's relative position bias on the scores (a KQ bias, which the op computes).
* :func:`make_paper_shape`, :func:`make_gqa_shape` (cached: :func:`paper_shape_path`,
  :func:`gqa_shape_path`): timing-only models with real models' per-layer shapes.

Command line (with ``dev/`` on ``sys.path``)::

    python -m sparq_lab.models tiny OUT.gguf [--n-layer N --n-head-kv N ...]
    python -m sparq_lab.models paper OUT.gguf [--n-layer N]
    python -m sparq_lab.models gqa OUT.gguf [--n-layer N]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import threading
from itertools import product
from pathlib import Path
from typing import Iterator, Sequence

from llama_sparq.models import model_dir

__all__ = [
    "make_tiny_llama",
    "make_tiny_gemma2",
    "make_tiny_granite_swa",
    "make_tiny_gpt_oss",
    "make_tiny_bloom",
    "make_tiny_t5",
    "tiny_vocab",
    "PAPER_SHAPE",
    "make_paper_shape",
    "paper_shape_path",
    "GQA_SHAPE",
    "make_gqa_shape",
    "gqa_shape_path",
    "main",
]

# --------------------------------------------------------------------------
# tiny random llama
# --------------------------------------------------------------------------

_WEIGHT_TYPES = ("f32", "f16", "q8_0")

# gguf.TokenType values (llama.cpp LLAMA_TOKEN_TYPE_*)
_TT_NORMAL, _TT_UNKNOWN, _TT_CONTROL, _TT_BYTE = 1, 2, 3, 6

_SPECIALS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2: llama.cpp's SPM defaults
_N_FIXED = len(_SPECIALS) + 256       # specials + <0x00>..<0xFF>
_SPACE = "\u2581"                    # SentencePiece's word-boundary mark "▁"


def _extra_pieces() -> Iterator[str]:
    """Endless, duplicate-free stream of plain pieces after the byte tokens.

    "▁" first (so the space llama.cpp prepends to SPM text is one token), then
    a few common English pieces, then every lowercase string by length, each
    both with and without the leading "▁".
    """
    seen: set[str] = set()
    common = [_SPACE, "e", "t", "a", "o", "i", "n", "s", "r", "h", "l",
              _SPACE + "t", _SPACE + "a", "th", "he", "in", "er", "an",
              _SPACE + "the", _SPACE + "of", _SPACE + "and", _SPACE + "to"]
    for p in common:
        seen.add(p)
        yield p
    letters = "abcdefghijklmnopqrstuvwxyz"
    length = 1
    while True:
        for chars in product(letters, repeat=length):
            s = "".join(chars)
            for p in (_SPACE + s, s):
                if p not in seen:
                    seen.add(p)
                    yield p
        length += 1


def tiny_vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token_types) of the tiny model's SPM vocabulary.

    ids 0..2 are <unk>, <s>, </s>; ids 3..258 are the byte tokens <0x00>..<0xFF>
    (so any text tokenizes through byte fallback); the rest are plain pieces
    with decreasing scores (SPM merges higher scores first).
    """
    if n_vocab < _N_FIXED:
        raise ValueError(f"n_vocab must be >= {_N_FIXED} (3 specials + 256 byte tokens), got {n_vocab}")
    tokens = list(_SPECIALS) + [f"<0x{b:02X}>" for b in range(256)]
    scores = [0.0] * _N_FIXED
    types = [_TT_UNKNOWN, _TT_CONTROL, _TT_CONTROL] + [_TT_BYTE] * 256
    pieces = _extra_pieces()
    for i in range(n_vocab - _N_FIXED):
        tokens.append(next(pieces))
        scores.append(-float(i + 1))
        types.append(_TT_NORMAL)
    return tokens, scores, types


def _check_int(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def make_tiny_llama(
    path: str | os.PathLike[str],
    *,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int | None = None,
    head_dim: int | None = None,
    n_ff: int = 128,
    n_vocab: int = 260,
    n_ctx_train: int = 4096,
    seed: int = 0,
    weight_type: str = "f32",
    std: float = 0.02,
    rope_freq_base: float = 10000.0,
    rms_eps: float = 1e-5,
    name: str = "llama-sparq-tiny",
) -> Path:
    """Write a tiny random llama-architecture GGUF to ``path`` and return it.

    Same arguments give the same bytes.  Weights are N(0, std) (norm weights
    are 1).  ``n_head_kv`` defaults to ``n_head`` (no GQA); ``head_dim``
    defaults to ``n_embd // n_head`` (if it differs, attention.key_length and
    attention.value_length are written).  ``weight_type`` is "f32", "f16" or
    "q8_0" for the 2-D weights; norm vectors are always f32.  Raises
    ValueError naming the offending argument.
    """
    import gguf

    n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train, seed = _tiny_llama_checks(
        gguf, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, n_ff=n_ff,
        n_vocab=n_vocab, n_ctx_train=n_ctx_train, seed=seed, weight_type=weight_type, std=std,
        rope_freq_base=rope_freq_base, rms_eps=rms_eps)
    QT = gguf.GGMLQuantizationType
    qtype, ftype = {
        "f32": (QT.F32, gguf.LlamaFileType.ALL_F32),
        "f16": (QT.F16, gguf.LlamaFileType.MOSTLY_F16),
        "q8_0": (QT.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    }[weight_type]
    tensors = _tiny_llama_tensors(gguf, qtype, n_layer=n_layer, n_embd=n_embd, n_q=n_head * head_dim,
                                  n_kv=n_head_kv * head_dim, n_ff=n_ff, n_vocab=n_vocab, seed=seed, std=std)

    def metadata(w) -> None:
        w.add_name(name)
        w.add_file_type(int(ftype))
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        w.add_vocab_size(n_vocab)
        _add_tiny_shape(w, n_ctx_train, n_embd, n_layer, n_ff, n_head, n_head_kv)
        if head_dim * n_head != n_embd:
            w.add_key_length(head_dim)
            w.add_value_length(head_dim)
        w.add_rope_dimension_count(head_dim)
        w.add_rope_freq_base(float(rope_freq_base))
        w.add_layer_norm_rms_eps(float(rms_eps))
        _add_tiny_tokenizer(w, n_vocab)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)

    return _write_gguf_atomic(gguf, Path(path), metadata, tensors)


def _add_tiny_shape(w, n_ctx_train, n_embd, n_layer, n_ff, n_head, n_head_kv) -> None:
    """The tiny models' sizes, as the architecture's keys."""
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)


def _add_tiny_tokenizer(w, n_vocab: int) -> None:
    """The tiny models' SentencePiece vocabulary (:func:`tiny_vocab`) and special tokens."""
    tokens, scores, types = tiny_vocab(n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)


def make_tiny_gemma2(path: str | os.PathLike[str], *, n_layer: int = 2, n_embd: int = 64, n_head: int = 4,
                     n_ff: int = 128, n_vocab: int = 260, seed: int = 0, std: float = 0.02,
                     softcap: float = 50.0) -> Path:
    """Write a tiny random Gemma 2 GGUF: attention with logit soft-capping (``softcap``; a negative one
    makes a GGUF whose cap SparQ refuses) and
    sliding-window layers (every other one). f32 weights of standard deviation ``std`` (larger: the
    attention's scores spread, and a small softcap bites); the llama tokenizer of :func:`make_tiny_llama`."""
    import gguf

    n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train, seed = _tiny_llama_checks(
        gguf, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=None, head_dim=None, n_ff=n_ff,
        n_vocab=n_vocab, n_ctx_train=4096, seed=seed, weight_type="f32", std=std, rope_freq_base=10000.0,
        rms_eps=1e-6)
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not math.isfinite(softcap) or softcap == 0:
        # (a negative cap is written as given: the GGUF SparQ refuses, for the tests of that refusal)
        raise ValueError(f"softcap must be a finite nonzero number, got {softcap!r}")
    import numpy as np

    QT = gguf.GGMLQuantizationType
    tensors = [t for t in _tiny_llama_tensors(gguf, QT.F32, n_layer=n_layer, n_embd=n_embd, n_q=n_head * head_dim,
                                              n_kv=n_head_kv * head_dim, n_ff=n_ff, n_vocab=n_vocab, seed=seed,
                                              std=std) if t[0] != "output.weight"]  # tied to token_embd
    for i in range(n_layer):
        tensors += [(f"blk.{i}.post_attention_norm.weight", (np.ones(n_embd, dtype=np.float32), QT.F32)),
                    (f"blk.{i}.post_ffw_norm.weight", (np.ones(n_embd, dtype=np.float32), QT.F32))]

    def metadata(w) -> None:
        w.add_name("llama-sparq-tiny-gemma2")
        w.add_file_type(int(gguf.LlamaFileType.ALL_F32))
        _add_tiny_shape(w, n_ctx_train, n_embd, n_layer, n_ff, n_head, n_head_kv)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_sliding_window(256)
        w.add_attn_logit_softcapping(float(softcap))
        w.add_final_logit_softcapping(30.0)
        _add_tiny_tokenizer(w, n_vocab)

    return _write_gguf_atomic(gguf, Path(path), metadata, tensors, arch="gemma2")


def make_tiny_granite_swa(path: str | os.PathLike[str], *, n_layer: int = 2, n_embd: int = 64, n_head: int = 4,
                          n_ff: int = 128, n_vocab: int = 260, seed: int = 0) -> Path:
    """Write a tiny random Granite iSWA GGUF (architecture ``granite_swa``): sliding-window and
    full-attention layers alternating (layer 0 sliding), each with attention sinks, which upstream
    passes to every attention call, so no layer runs SparQ. f32 weights; the llama tokenizer of
    :func:`make_tiny_llama`."""
    import gguf
    import numpy as np

    n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train, seed = _tiny_llama_checks(
        gguf, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=None, head_dim=None, n_ff=n_ff,
        n_vocab=n_vocab, n_ctx_train=4096, seed=seed, weight_type="f32", std=0.02, rope_freq_base=10000.0,
        rms_eps=1e-5)
    QT = gguf.GGMLQuantizationType
    tensors = _tiny_llama_tensors(gguf, QT.F32, n_layer=n_layer, n_embd=n_embd, n_q=n_head * head_dim,
                                  n_kv=n_head_kv * head_dim, n_ff=n_ff, n_vocab=n_vocab, seed=seed, std=0.02)
    sinks = np.random.default_rng(seed + 1)
    tensors += [(f"blk.{i}.attn_sinks.weight", (sinks.standard_normal(n_head).astype(np.float32), QT.F32))
                for i in range(n_layer)]

    def metadata(w) -> None:
        w.add_name("llama-sparq-tiny-granite-swa")
        w.add_file_type(int(gguf.LlamaFileType.ALL_F32))
        _add_tiny_shape(w, n_ctx_train, n_embd, n_layer, n_ff, n_head, n_head_kv)
        w.add_rope_dimension_count(head_dim)
        w.add_rope_freq_base(10000.0)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_logit_scale(1.0)
        w.add_sliding_window(32)
        w.add_sliding_window_pattern([i % 2 == 0 for i in range(n_layer)])
        _add_tiny_tokenizer(w, n_vocab)

    return _write_gguf_atomic(gguf, Path(path), metadata, tensors, arch="granite_swa")


def make_tiny_gpt_oss(path: str | os.PathLike[str], *, n_layer: int = 2, n_embd: int = 64, n_head: int = 8,
                      n_head_kv: int = 2, head_dim: int = 16, n_expert: int = 4, n_expert_used: int = 4,
                      n_ff_exp: int = 32, n_swa: int = 32, n_vocab: int = 260, seed: int = 0, std: float = 0.2,
                      sink_shift: float = 0.0, n_ctx_train: int = 4096, name: str = "llama-sparq-tiny-gpt-oss") -> Path:
    """Write a tiny random gpt-oss GGUF (architecture ``gpt-oss``, llama.cpp's ``openai-moe``): GQA
    attention with sinks (a logit per query head), sliding-window (``n_swa``) and full-attention layers
    alternating (layer 0 sliding), biases on q, k, v and the output, and a mixture of ``n_expert`` SwiGLU
    experts with biases (``n_expert_used`` per token; all of them: the routing is continuous, so that
    a rounding moves the logits by a rounding). f32 weights of standard deviation ``std``, the sinks
    N(sink_shift, 2) (a shift of -60 all but removes them); the llama tokenizer of :func:`make_tiny_llama`."""
    import gguf
    import numpy as np

    n_layer, n_embd, n_head, n_head_kv, head_dim, _, n_vocab, n_ctx_train, seed = _tiny_llama_checks(
        gguf, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, n_ff=n_ff_exp,
        n_vocab=n_vocab, n_ctx_train=n_ctx_train, seed=seed, weight_type="f32", std=std, rope_freq_base=10000.0,
        rms_eps=1e-5)
    n_expert, n_expert_used, n_ff_exp, n_swa = (_check_int(k, v) for k, v in (
        ("n_expert", n_expert), ("n_expert_used", n_expert_used), ("n_ff_exp", n_ff_exp), ("n_swa", n_swa)))
    if n_expert_used > n_expert:
        raise ValueError(f"n_expert_used ({n_expert_used}) must be at most n_expert ({n_expert})")
    if isinstance(sink_shift, bool) or not isinstance(sink_shift, (int, float)) or not math.isfinite(sink_shift):
        raise ValueError(f"sink_shift must be a finite number, got {sink_shift!r}")
    QT = gguf.GGMLQuantizationType
    rnd, ones, _ = _f32_tensors(seed, std)

    n_q, n_kv = n_head * head_dim, n_head_kv * head_dim
    tensors = [("token_embd.weight", rnd(n_vocab, n_embd, scale=1.0))]
    for i in range(n_layer):
        p = f"blk.{i}."
        tensors += [
            (p + "attn_norm.weight", ones(n_embd)),
            (p + "attn_q.weight", rnd(n_q, n_embd)), (p + "attn_q.bias", rnd(n_q)),
            (p + "attn_k.weight", rnd(n_kv, n_embd)), (p + "attn_k.bias", rnd(n_kv)),
            (p + "attn_v.weight", rnd(n_kv, n_embd)), (p + "attn_v.bias", rnd(n_kv)),
            (p + "attn_output.weight", rnd(n_embd, n_q)), (p + "attn_output.bias", rnd(n_embd)),
            (p + "attn_sinks.weight", ((rnd(n_head, scale=2.0)[0] + np.float32(sink_shift)).astype(np.float32), QT.F32)),
            (p + "post_attention_norm.weight", ones(n_embd)),
            (p + "ffn_gate_inp.weight", rnd(n_expert, n_embd)), (p + "ffn_gate_inp.bias", rnd(n_expert)),
            (p + "ffn_gate_exps.weight", rnd(n_expert, n_ff_exp, n_embd)), (p + "ffn_gate_exps.bias", rnd(n_expert, n_ff_exp)),
            (p + "ffn_up_exps.weight", rnd(n_expert, n_ff_exp, n_embd)), (p + "ffn_up_exps.bias", rnd(n_expert, n_ff_exp)),
            (p + "ffn_down_exps.weight", rnd(n_expert, n_embd, n_ff_exp)), (p + "ffn_down_exps.bias", rnd(n_expert, n_embd)),
        ]
    tensors += [("output_norm.weight", ones(n_embd)), ("output.weight", rnd(n_vocab, n_embd))]

    def metadata(w) -> None:
        w.add_name(name)
        w.add_file_type(int(gguf.LlamaFileType.ALL_F32))
        _add_tiny_shape(w, n_ctx_train, n_embd, n_layer, n_ff_exp, n_head, n_head_kv)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_rope_dimension_count(head_dim)
        w.add_rope_freq_base(10000.0)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_expert_count(n_expert)
        w.add_expert_used_count(n_expert_used)
        w.add_expert_feed_forward_length(n_ff_exp)
        w.add_sliding_window(n_swa)
        _add_tiny_tokenizer(w, n_vocab)

    return _write_gguf_atomic(gguf, Path(path), metadata, tensors, arch="gpt-oss")


def make_tiny_bloom(path: str | os.PathLike[str], *, n_layer: int = 2, n_embd: int = 64, n_head: int = 4,
                    n_ff: int = 128, n_vocab: int = 260, seed: int = 0, std: float = 0.2) -> Path:
    """Write a tiny random BLOOM GGUF: ALiBi attention (llama.cpp's max_bias 8: a slope per head times
    minus the distance, in the mask), layer norms with biases, a fused QKV with bias, a GELU MLP. f32
    weights of standard deviation ``std``; the llama tokenizer of :func:`make_tiny_llama`."""
    import gguf
    import numpy as np

    n_layer, n_embd, n_head, _, head_dim, n_ff, n_vocab, n_ctx_train, seed = _tiny_llama_checks(
        gguf, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=None, head_dim=None, n_ff=n_ff,
        n_vocab=n_vocab, n_ctx_train=4096, seed=seed, weight_type="f32", std=std, rope_freq_base=10000.0,
        rms_eps=1e-5)
    QT = gguf.GGMLQuantizationType
    rnd, ones, zeros = _f32_tensors(seed, std)

    tensors = [("token_embd.weight", rnd(n_vocab, n_embd, scale=1.0)),
               ("token_embd_norm.weight", ones(n_embd)), ("token_embd_norm.bias", zeros(n_embd))]
    for i in range(n_layer):
        p = f"blk.{i}."
        tensors += [
            (p + "attn_norm.weight", ones(n_embd)), (p + "attn_norm.bias", zeros(n_embd)),
            (p + "attn_qkv.weight", rnd(3 * n_embd, n_embd)), (p + "attn_qkv.bias", rnd(3 * n_embd)),
            (p + "attn_output.weight", rnd(n_embd, n_embd)), (p + "attn_output.bias", rnd(n_embd)),
            (p + "ffn_norm.weight", ones(n_embd)), (p + "ffn_norm.bias", zeros(n_embd)),
            (p + "ffn_up.weight", rnd(n_ff, n_embd)), (p + "ffn_up.bias", rnd(n_ff)),
            (p + "ffn_down.weight", rnd(n_embd, n_ff)), (p + "ffn_down.bias", rnd(n_embd)),
        ]
    tensors += [("output_norm.weight", ones(n_embd)), ("output_norm.bias", zeros(n_embd)),
                ("output.weight", rnd(n_vocab, n_embd))]

    def metadata(w) -> None:
        w.add_name("llama-sparq-tiny-bloom")
        w.add_file_type(int(gguf.LlamaFileType.ALL_F32))
        _add_tiny_shape(w, n_ctx_train, n_embd, n_layer, n_ff, n_head, n_head)
        w.add_layer_norm_eps(1e-5)
        _add_tiny_tokenizer(w, n_vocab)

    return _write_gguf_atomic(gguf, Path(path), metadata, tensors, arch="bloom")


def make_tiny_t5(path: str | os.PathLike[str], *, n_layer: int = 2, n_embd: int = 64, n_head: int = 4,
                 n_ff: int = 128, n_vocab: int = 260, n_buckets: int = 32, seed: int = 0, std: float = 0.2,
                 rel_b_std: float | None = None) -> Path:
    """Write a tiny random T5 GGUF (encoder and decoder of ``n_layer`` layers): the decoder's
    self-attention adds a relative position bias to its scores (upstream's KQ bias, ``attn_rel_b``
    of ``n_buckets`` buckets, of standard deviation ``rel_b_std``, default ``std``; 0: none that
    moves a score). f32 weights of standard deviation ``std``; the llama tokenizer of
    :func:`make_tiny_llama`."""
    import gguf
    import numpy as np

    n_layer, n_embd, n_head, _, _, n_ff, n_vocab, n_ctx_train, seed = _tiny_llama_checks(
        gguf, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=None, head_dim=None, n_ff=n_ff,
        n_vocab=n_vocab, n_ctx_train=512, seed=seed, weight_type="f32", std=std, rope_freq_base=10000.0,
        rms_eps=1e-6)
    n_buckets = _check_int("n_buckets", n_buckets)
    if rel_b_std is not None and not (isinstance(rel_b_std, (int, float)) and np.isfinite(rel_b_std) and rel_b_std >= 0):
        raise ValueError(f"rel_b_std must be a finite number >= 0 or None, got {rel_b_std!r}")
    QT = gguf.GGMLQuantizationType
    rnd, ones, _ = _f32_tensors(seed, std)

    tensors = [("token_embd.weight", rnd(n_vocab, n_embd, scale=1.0))]
    for part in ("enc", "dec"):
        for i in range(n_layer):
            p = f"{part}.blk.{i}."
            tensors += [(p + "attn_norm.weight", ones(n_embd)),
                        (p + "attn_rel_b.weight", rnd(n_buckets, n_head, scale=std if rel_b_std is None else rel_b_std))]
            tensors += [(p + f"attn_{x}.weight", rnd(n_embd, n_embd)) for x in "qkvo"]
            if part == "dec":
                tensors += [(p + "cross_attn_norm.weight", ones(n_embd))]
                tensors += [(p + f"cross_attn_{x}.weight", rnd(n_embd, n_embd)) for x in "qkvo"]
            tensors += [(p + "ffn_norm.weight", ones(n_embd)), (p + "ffn_up.weight", rnd(n_ff, n_embd)),
                        (p + "ffn_down.weight", rnd(n_embd, n_ff))]
        tensors += [(f"{part}.output_norm.weight", ones(n_embd))]
    tensors += [("output.weight", rnd(n_vocab, n_embd))]

    def metadata(w) -> None:
        w.add_name("llama-sparq-tiny-t5")
        w.add_file_type(int(gguf.LlamaFileType.ALL_F32))
        _add_tiny_shape(w, n_ctx_train, n_embd, n_layer, n_ff, n_head, n_head)
        w.add_key_length(n_embd // n_head)
        w.add_value_length(n_embd // n_head)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_relative_attn_buckets_count(n_buckets)
        w.add_decoder_start_token_id(0)
        _add_tiny_tokenizer(w, n_vocab)

    return _write_gguf_atomic(gguf, Path(path), metadata, tensors, arch="t5")


def _f32_tensors(seed: int, std: float):
    """(rnd, ones, zeros): makers of f32 tensors as (array, type) pairs for a GGUF writer; rnd(*shape,
    scale=std) draws from one generator seeded with seed, in call order."""
    import gguf
    import numpy as np

    f32 = gguf.GGMLQuantizationType.F32
    rng = np.random.default_rng(seed)

    def rnd(*shape: int, scale: float = std):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(np.float32), f32

    def ones(n: int):
        return np.ones(n, dtype=np.float32), f32

    def zeros(n: int):
        return np.zeros(n, dtype=np.float32), f32

    return rnd, ones, zeros


def _tiny_llama_checks(gguf, *, n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train, seed,
                       weight_type, std, rope_freq_base, rms_eps) -> tuple[int, ...]:
    """make_tiny_llama's arguments checked (ValueError naming the argument) and defaulted:
    (n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train, seed)."""
    n_layer = _check_int("n_layer", n_layer)
    n_embd = _check_int("n_embd", n_embd)
    n_head = _check_int("n_head", n_head)
    n_head_kv = n_head if n_head_kv is None else _check_int("n_head_kv", n_head_kv)
    n_ff = _check_int("n_ff", n_ff)
    n_vocab = _check_int("n_vocab", n_vocab, _N_FIXED)
    n_ctx_train = _check_int("n_ctx_train", n_ctx_train)
    seed = _check_int("seed", seed, 0)
    if n_head_kv > n_head or n_head % n_head_kv != 0:
        raise ValueError(f"n_head ({n_head}) must be divisible by n_head_kv ({n_head_kv})")
    if head_dim is None:
        if n_embd % n_head != 0:
            raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head}) unless head_dim is given")
        head_dim = n_embd // n_head
    head_dim = _check_int("head_dim", head_dim)
    if head_dim % 2 != 0:
        raise ValueError(f"head_dim must be even (rope rotates pairs), got {head_dim}")
    if weight_type not in _WEIGHT_TYPES:
        raise ValueError(f"weight_type must be one of {_WEIGHT_TYPES}, got {weight_type!r}")
    if weight_type == "q8_0":
        blk = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0][0]
        for arg, v in (("n_embd", n_embd), ("n_ff", n_ff), ("head_dim * n_head", head_dim * n_head)):
            if v % blk != 0:
                raise ValueError(f"{arg} ({v}) must be a multiple of {blk} for weight_type='q8_0'")
    for arg, v in (("std", std), ("rope_freq_base", rope_freq_base), ("rms_eps", rms_eps)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"{arg} must be a positive finite number, got {v!r}")
    return n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train, seed


def _tiny_llama_tensors(gguf, qtype, *, n_layer, n_embd, n_q, n_kv, n_ff, n_vocab, seed, std) -> list:
    """The tiny model's random tensors, [(name, (data, type))], drawn in a fixed order from one
    generator seeded with ``seed`` (so the same arguments give the same bytes)."""
    import numpy as np

    QT = gguf.GGMLQuantizationType
    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int) -> tuple[np.ndarray, QT]:
        # numpy shape (rows, cols) == ggml ne [cols, rows]: cols is the input dim
        w = (rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(std)).astype(np.float32)
        if qtype == QT.F32:
            return w, qtype
        return gguf.quants.quantize(w, qtype), qtype

    def ones(n: int) -> tuple[np.ndarray, QT]:
        return np.ones(n, dtype=np.float32), QT.F32

    # Tensors in the order convert_hf_to_gguf.py writes them; shapes are numpy
    # (reversed ggml ne), e.g. token_embd ne=[n_embd, n_vocab] -> (n_vocab, n_embd).
    tensors: list[tuple[str, tuple[np.ndarray, QT]]] = [
        ("token_embd.weight", matrix(n_vocab, n_embd)),
    ]
    for i in range(n_layer):
        p = f"blk.{i}."
        tensors += [
            (p + "attn_norm.weight", ones(n_embd)),
            (p + "attn_q.weight", matrix(n_q, n_embd)),
            (p + "attn_k.weight", matrix(n_kv, n_embd)),
            (p + "attn_v.weight", matrix(n_kv, n_embd)),
            (p + "attn_output.weight", matrix(n_embd, n_q)),
            (p + "ffn_norm.weight", ones(n_embd)),
            (p + "ffn_gate.weight", matrix(n_ff, n_embd)),
            (p + "ffn_up.weight", matrix(n_ff, n_embd)),
            (p + "ffn_down.weight", matrix(n_embd, n_ff)),
        ]
    tensors += [
        ("output_norm.weight", ones(n_embd)),
        ("output.weight", matrix(n_vocab, n_embd)),
    ]
    return tensors


def _write_gguf_atomic(gguf, out: Path, metadata, tensors: list, arch: str = "llama") -> Path:
    """Write a GGUF of architecture ``arch``: ``metadata(writer)`` adds the key-values, then the
    tensors. Written next to the target and renamed: readers never see a partial file."""
    QT = gguf.GGMLQuantizationType
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        w = gguf.GGUFWriter(tmp, arch)
        metadata(w)
        for tname, (data, dtype) in tensors:
            if dtype in (QT.F32, QT.F16):
                w.add_tensor(tname, data)
            else:
                w.add_tensor(tname, data, raw_dtype=dtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, out)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return out


# --------------------------------------------------------------------------
# timing-only models with real models' per-layer shapes
# --------------------------------------------------------------------------

# Llama 2 7B per-layer shapes (the paper's CPU measurements)
PAPER_SHAPE = dict(n_embd=4096, n_head=32, n_head_kv=32, n_ff=11008, n_vocab=32000)


def make_paper_shape(path: str | os.PathLike[str], *, n_layer: int = 2, n_ctx_train: int = 131072,
                     seed: int = 0) -> Path:
    """A synthetic model with Llama 2 7B's per-layer shapes (width 4096, 32 heads of 128,
    FFN 11008, vocabulary 32000), Q8_0 weights, random values, and ``n_layer`` layers.

    The share of decode time spent in attention depends on the per-layer weight and cache
    sizes and the context length, not on the number of layers (every layer has the same
    weights-to-cache ratio), so a few layers give the paper's attention share while the
    sweep stays fast and within memory. Its text is meaningless: it is for timing only.
    """
    return make_tiny_llama(path, n_layer=n_layer, n_ctx_train=n_ctx_train, seed=seed, weight_type="q8_0",
                           name="llama-sparq synthetic (Llama 2 7B per-layer shapes)", **PAPER_SHAPE)


# Llama 3 8B per-layer shapes (GQA: 8 KV heads of 128 for 32 query heads), with Llama 2's
# vocabulary size: the long-context sweeps (a 1M-token cache fits in memory)
GQA_SHAPE = dict(n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, n_vocab=32000)


def make_gqa_shape(path: str | os.PathLike[str], *, n_layer: int = 1, n_ctx_train: int = 1 << 21,
                   seed: int = 0) -> Path:
    """A synthetic model with Llama 3 8B's per-layer shapes (width 4096, 32 query heads and 8 KV
    heads of 128, FFN 14336), a vocabulary of 32000 (Llama 3's 128256 would make the output
    projection alone 2.4 layers' weights), Q8_0 weights, random values, ``n_layer`` layers.

    Its KV cache is a quarter of the Llama 2 shape's per token, so a million-token context of
    one layer (K, V and K^T in F16: 6 GiB) fits this machine's memory. For timing only, as
    :func:`make_paper_shape`.
    """
    return make_tiny_llama(path, n_layer=n_layer, n_ctx_train=n_ctx_train, seed=seed, weight_type="q8_0",
                           name="llama-sparq synthetic (Llama 3 8B per-layer shapes)", **GQA_SHAPE)


# gpt-oss-20b's attention: width 2880, 64 query heads and 8 KV heads of 64, attention sinks, a
# 128-cell sliding window on alternate layers
GPT_OSS_SHAPE = dict(n_embd=2880, n_head=64, n_head_kv=8, head_dim=64, n_swa=128)


def make_gpt_oss_shape(path: str | os.PathLike[str], *, n_layer: int = 4, n_ctx_train: int = 131072,
                       seed: int = 0) -> Path:
    """A synthetic model with gpt-oss-20b's attention (:data:`GPT_OSS_SHAPE`: 64 query heads on 8 KV
    heads of 64, sinks, sliding-window and full-attention layers alternating), ``n_layer`` layers
    (half of them full attention), f32 attention weights, random values.

    The mixture of experts is cut to 4 experts of 64 (the real model's 32 experts of 2880 in MXFP4 do not
    change what attention costs): a layer's f32 attention weights (106 MB) stand in for the bytes a
    real layer reads per token (bf16 attention 53 MB and 4 active MXFP4 experts 53 MB). The 201K-token
    vocabulary's output projection is left out. For timing only, as :func:`make_paper_shape`.
    """
    return make_tiny_gpt_oss(path, n_layer=n_layer, n_ctx_train=n_ctx_train, seed=seed, n_expert=4,
                             n_expert_used=4, n_ff_exp=64, n_vocab=260, std=0.02,
                             name="llama-sparq synthetic (gpt-oss-20b attention shapes)", **GPT_OSS_SHAPE)


def _cached_synthetic(stem: str, n_layer: int, make) -> Path:
    """``model_dir()/<stem>-<n_layer>l.gguf``, written by ``make(path, n_layer=...)`` on first use."""
    n_layer = _check_int("n_layer", n_layer)
    path = model_dir() / f"{stem}-{n_layer}l.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"writing the synthetic model {path} ...", file=sys.stderr, flush=True)
        make(path, n_layer=n_layer)  # written to a temporary file, then renamed
    return path


def paper_shape_path(n_layer: int = 2) -> Path:
    """The cached paper-shape model with ``n_layer`` layers (``model_dir()/paper-shape-<n>l.gguf``),
    written by :func:`make_paper_shape` (seed 0, deterministic) on first use."""
    return _cached_synthetic("paper-shape", n_layer, make_paper_shape)


def gpt_oss_shape_path(n_layer: int = 4) -> Path:
    """The cached gpt-oss-shape model with ``n_layer`` layers (``model_dir()/gpt-oss-shape-<n>l.gguf``),
    written by :func:`make_gpt_oss_shape` (seed 0, deterministic) on first use."""
    return _cached_synthetic("gpt-oss-shape", n_layer, make_gpt_oss_shape)


def gqa_shape_path(n_layer: int = 1) -> Path:
    """The cached GQA-shape model with ``n_layer`` layers (``model_dir()/gqa-shape-<n>l.gguf``),
    written by :func:`make_gqa_shape` (seed 0, deterministic) on first use."""
    return _cached_synthetic("gqa-shape", n_layer, make_gqa_shape)


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sparq_lab.models",
                                 description="Write the synthetic models llama-sparq tests and benchmarks use.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("tiny", help="write a tiny random llama GGUF")
    t.add_argument("out", help="output .gguf path")
    t.add_argument("--n-layer", type=int, default=2)
    t.add_argument("--n-embd", type=int, default=64)
    t.add_argument("--n-head", type=int, default=4)
    t.add_argument("--n-head-kv", type=int, default=None, help="default: n_head (no GQA)")
    t.add_argument("--head-dim", type=int, default=None, help="default: n_embd // n_head")
    t.add_argument("--n-ff", type=int, default=128)
    t.add_argument("--n-vocab", type=int, default=260)
    t.add_argument("--n-ctx-train", type=int, default=4096)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--weight-type", choices=_WEIGHT_TYPES, default="f32")
    t.add_argument("--std", type=float, default=0.02)

    ps = sub.add_parser("paper", help="write a synthetic model with Llama 2 7B per-layer shapes (Q8_0)")
    ps.add_argument("out", help="output .gguf path")
    ps.add_argument("--n-layer", type=int, default=2)
    ps.add_argument("--n-ctx-train", type=int, default=131072)
    ps.add_argument("--seed", type=int, default=0)

    gs = sub.add_parser("gqa", help="write a synthetic model with Llama 3 8B per-layer shapes (GQA 32/8, Q8_0)")
    gs.add_argument("out", help="output .gguf path")
    gs.add_argument("--n-layer", type=int, default=1)
    gs.add_argument("--n-ctx-train", type=int, default=1 << 21)
    gs.add_argument("--seed", type=int, default=0)

    args = ap.parse_args(argv)
    try:
        if args.cmd == "tiny":
            p = make_tiny_llama(
                args.out, n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head,
                n_head_kv=args.n_head_kv, head_dim=args.head_dim, n_ff=args.n_ff,
                n_vocab=args.n_vocab, n_ctx_train=args.n_ctx_train, seed=args.seed,
                weight_type=args.weight_type, std=args.std)
        elif args.cmd == "paper":
            p = make_paper_shape(args.out, n_layer=args.n_layer, n_ctx_train=args.n_ctx_train, seed=args.seed)
        else:
            p = make_gqa_shape(args.out, n_layer=args.n_layer, n_ctx_train=args.n_ctx_train, seed=args.seed)
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
