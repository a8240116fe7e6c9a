"""NumPy reference for SparQ attention: the oracle every kernel test compares against.

The algorithm is the one of ``docs/algorithm.md`` (the project's contract), for one KV "stream":

    q     (n_rows, n_head, d)      one query token per row (decode) or several (prefill)
    K     (S, n_head_kv, d)        keys of the S cells
    V     (S, n_head_kv, dv)       values of the S cells
    mask  (n_rows, S)              0 for a cell the row may see, -inf for one it may not
                                   (None = every cell valid); other finite values are
                                   added as a bias like ggml does
    vbar  (n_head_kv, dv) or (n_rows, n_head_kv, dv) or None (None = per row, the mean of
                                   V over that row's valid cells)

Query head ``h`` uses KV head ``h // (n_head // n_head_kv)`` (ggml's GQA convention). The
``g = n_head // n_head_kv`` query heads sharing a KV head form a group: they share the
component selection ``i1`` and the position selection ``i2``.

``docs/algorithm.md`` writes the temperature as ``tau_h = sqrt(d * ||q_h[i1]||_1 / ||q_h||_1)`` with
the dense scale ``1/sqrt(d)``. Here it is generalised to any ``scale``: the approximate
logits are ``(q_h[i1] . K[:, i1]^T) * scale * sqrt(||q_h||_1 / ||q_h[i1]||_1)``, which is
exactly ``/ tau_h`` when ``scale = 1/sqrt(d)``.

All arithmetic runs in ``dtype`` (inputs are cast to it): float64 is the exact oracle;
float32 / float16 give "the naive implementation in that precision", which kernel tests
use to measure the naive same-precision error (FlashAttention's way of judging kernels).
For float16 the products, sums and softmax run in float16 as far as NumPy allows. Note that
the default ``vbar`` is then also summed in float16; a kernel that keeps a float32 running
sum should pass its own ``vbar`` when compared with a float16 reference.

A row with no valid cell at all gives an output of zeros (like ggml's guarded 1/sum).
"""

from __future__ import annotations

import numpy as np

from ._reference_blocks import BLOCK_TYPES, dequantize_blocks, quantize_blocks
from ._reference_kt4 import round_kt4
from ._reference_checks import check_r, float_dtype, prepare, sparq_options
from ._reference_selectors import baseline_positions
from ._reference_steps import (Variants, alibi_slopes, approx_scores, bucket_winners, exact_attention,
                               mean_value_reallocation, row_vbar, select_components, selected_mass, softmax,
                               sparq_positions)

__all__ = [
    "dense_attention",
    "sparq_attention",
    "alibi_slopes",
    "bucket_winners",
    "combined_scores",
    "selection_matches",
    "quantize_q8_0",
    "dequantize_q8_0",
    "q8_0_bytes",
    "quantize_blocks",
    "dequantize_blocks",
    "round_kv",
    "round_e5m2",
    "round_kt4",
    "coverage_cap",
]

# Values per block of ggml's q8_0 (and the cache types' quantized blocks generally).
QK8_0 = 32
# The K/V cache types the reference rounds through (kv_quant): a quantized cache holds K and V
# rows as blocks (_reference_blocks); SparQ's K^T keeps the dequantized keys in f16.
KV_QUANT_TYPES = BLOCK_TYPES

# Rows per block in dense_attention: bounds the (rows, g, S) logits buffer for long prefills.
_DENSE_ROW_BLOCK = 64

# The argument checks are in _reference_checks, the steps of the algorithm in _reference_steps,
# the selectors without approximate scores (streaming, H2O, index) in _reference_selectors.


def coverage_cap(k, k_min, k_frac, n_valid):
    """The calibrated k's cap of a row with n_valid valid cells in its stream (the op's
    ggml_sparq_attn_set_coverage_cap): min(k, max(k_min, ceil(k_frac * n_valid))); k without k_frac.
    ``sparq_attention(k=coverage_cap(...), coverage=(p, k_min))`` is the op's choice for that row."""
    if k_frac <= 0.0:
        return k
    return min(k, max(k_min, int(np.ceil(np.float64(k_frac) * n_valid))))


def quantize_q8_0(x):
    """ggml's q8_0 blocks of ``x`` along its last axis (a multiple of 32), as ggml's reference
    quantizer (``quantize_row_q8_0_ref``) makes them: per block of 32 values, ``d = max|x| / 127``
    in f32, stored as f16; each value ``x * (1 / d)`` in f32, rounded to the nearest integer
    (halves away from zero) as int8. Returns ``(d, qs)``: float16 (..., n / 32) and int8 (..., n).
    """
    x = np.asarray(x, dtype=np.float32)
    if x.ndim < 1 or x.shape[-1] % QK8_0:
        raise ValueError(f"q8_0: the last axis must be a multiple of {QK8_0} values, got shape {x.shape}")
    b = x.reshape(*x.shape[:-1], x.shape[-1] // QK8_0, QK8_0)
    amax = np.max(np.abs(b), axis=-1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    x0 = (b * inv[..., None]).astype(np.float32).astype(np.float64)  # the f32 product, then rounded exactly
    qs = (np.sign(x0) * np.floor(np.abs(x0) + 0.5)).astype(np.int8)
    return d.astype(np.float16), qs.reshape(x.shape)


def dequantize_q8_0(d, qs):
    """The values of q8_0 blocks: ``qs * d`` per block, float32 (exact: an f16 times an int8)."""
    d = np.asarray(d, dtype=np.float16).astype(np.float32)
    qs = np.asarray(qs, dtype=np.int8)
    b = qs.reshape(*qs.shape[:-1], qs.shape[-1] // QK8_0, QK8_0).astype(np.float32)
    return (b * d[..., None]).reshape(qs.shape)


def q8_0_bytes(x):
    """``x`` (last axis a multiple of 32) as ggml lays q8_0 out in memory: per block of 32 values
    an f16 scale and 32 int8 (34 bytes), blocks in order."""
    d, qs = quantize_q8_0(x)
    blocks = np.empty(d.shape + (34,), np.uint8)
    blocks[..., :2] = d[..., None].view(np.uint8).reshape(d.shape + (2,))
    blocks[..., 2:] = qs.reshape(d.shape + (QK8_0,)).view(np.uint8)
    return blocks.tobytes()


def round_kv(x, kv_quant):
    """``x`` as a K/V cache of type ``kv_quant`` holds it: ``None`` as it is, else rounded through
    that type's blocks along the last axis (float32; ``KV_QUANT_TYPES``)."""
    if kv_quant is None:
        return x
    return dequantize_blocks(quantize_blocks(x, kv_quant), kv_quant)


def round_e5m2(x):
    """``x`` as an 8-bit K^T holds it (float32): rounded to f16 (from f32, as the fork rounds), then to
    e5m2, f16's upper byte, to nearest even on the f16 bits; a finite value beyond the largest finite
    e5m2 saturates at +-57344, Inf and NaN are kept (``ggml-sparq/include/ggml-sparq-e5m2.h``)."""
    h = np.asarray(x, dtype=np.float32).astype(np.float16).view(np.uint16).astype(np.uint32)
    b = ((h + 0x7F + ((h >> 8) & 1)) >> 8) & 0xFF
    b = np.where((b & 0x7F) == 0x7C, b - 1, b)
    b = np.where((h & 0x7C00) == 0x7C00, (h >> 8) | np.where(h & 0x3FF, 2, 0), b)
    return (b.astype(np.uint16) << 8).view(np.float16).astype(np.float32)


def dense_attention(q, K, V, mask=None, scale=None, dtype=np.float64, kv_quant=None, softcap=0.0, max_bias=0.0,
                    sinks=None, kq_b=None):
    """Dense attention, ``softmax(q . K^T * scale + mask) . V`` per query head.

    Shapes as in the module docstring; returns (n_rows, n_head, dv) in ``dtype``. kv_quant:
    K and V as a cache of that type holds them (``round_kv``). softcap, max_bias, sinks (n_head,), kq_b
    (n_rows, n_head, S): the attention variants (sparq_attention).
    """
    K, V = round_kv(K, kv_quant), round_kv(V, kv_quant)
    q, K, V, mask, scale, _, dims = prepare(q, K, V, mask, scale)
    dt = float_dtype(dtype)
    n_rows, n_kv, g, d, dv = (dims[x] for x in ("n_rows", "n_head_kv", "g", "d", "dv"))
    qg = q.astype(dt, copy=False).reshape(n_rows, n_kv, g, d)
    md = None if mask is None else mask.astype(dt, copy=False)
    sc = dt.type(scale)
    var = check_variants(n_kv, g, softcap, max_bias, sinks, kq_b, scale, (n_rows, n_kv * g, K.shape[0]))
    out = np.zeros((n_rows, n_kv, g, dv), dt)
    for j in range(n_kv):
        Kj = K[:, j, :].astype(dt)  # (S, d), cast one KV head at a time
        Vj = V[:, j, :].astype(dt)  # (S, dv)
        for r0 in range(0, n_rows, _DENSE_ROW_BLOCK):
            r1 = min(r0 + _DENSE_ROW_BLOCK, n_rows)
            logits = np.matmul(qg[r0:r1, j], Kj.T) * sc  # (b, g, S)
            if var is not None:
                p = var.softmax(var.logits(logits, None if md is None else md[r0:r1], j, dt, var.bias(slice(r0, r1), j)),
                                j, dt)[0]
            else:
                p = softmax(logits if md is None else logits + md[r0:r1, None, :])
            out[r0:r1, j] = np.matmul(p, Vj)
    return out.reshape(n_rows, n_kv * g, dv)


def check_variants(n_kv, g, softcap, max_bias, sinks, kq_b=None, scale=1.0, bias_shape=None):
    """The Variants of a call, or None for plain attention; ValueError names a bad one. bias_shape:
    (n_rows, n_head, S), the shape kq_b must have."""
    for name, v in (("softcap", softcap), ("max_bias", max_bias)):
        if not (np.isfinite(v) and v >= 0):
            raise ValueError(f"{name} must be 0 (none) or finite and > 0, got {v!r}")
    if sinks is not None and np.asarray(sinks).shape != (n_kv * g,):
        raise ValueError(f"sinks must have shape (n_head={n_kv * g},), got {np.asarray(sinks).shape}")
    if kq_b is not None and np.asarray(kq_b).shape != tuple(bias_shape):
        raise ValueError(f"kq_b must have shape (n_rows, n_head, S)={tuple(bias_shape)}, got {np.asarray(kq_b).shape}")
    if not softcap and not max_bias and sinks is None and kq_b is None:
        return None
    return Variants(n_kv, g, softcap, max_bias, sinks, kq_b, scale)


def combined_scores(q, K, *, r, mask=None, scale=None, dtype=np.float64, comp_w=None, per_head=False,
                    softcap=0.0, max_bias=0.0, sinks=None, kq_b=None):
    """The position-selection scores: (n_rows, n_head_kv, S) array of ``sum_h shat_h``
    (per_head: (n_rows, n_head_kv, g, S), each head's shat_h).

    The sum runs over the query heads of each KV head group; invalid (-inf) cells score 0.
    Kernel tests use it to judge whether two selections differ only by ties. q and K are
    in the basis of the approximate scores (q_sel and K_sel of sparq_attention).
    """
    q, K, _, mask, scale, _, dims = prepare(q, K, None, mask, scale)
    dt = float_dtype(dtype)
    n_rows, n_kv, g, d, S = (dims[x] for x in ("n_rows", "n_head_kv", "g", "d", "S"))
    r = check_r(r, d)
    qg = q.astype(dt, copy=False).reshape(n_rows, n_kv, g, d)
    md = None if mask is None else mask.astype(dt, copy=False)
    w = None if comp_w is None else np.asarray(comp_w, dtype=dt)
    i1 = select_components(qg, r, w)
    var = check_variants(n_kv, g, softcap, max_bias, sinks, kq_b, scale, (n_rows, n_kv * g, S))
    out = np.zeros((n_rows, n_kv, g, S) if per_head else (n_rows, n_kv, S), dt)
    for row in range(n_rows):
        mrow = None if md is None else md[row]
        sh = approx_scores(qg[row], K, i1[row], mrow, scale, dt, w, var, row=row)
        out[row] = sh if per_head else np.sum(sh, axis=1)
    return out


def sparq_attention(q, K, V, *, r, k, l=0, mask=None, scale=None, vbar=None,
                    dtype=np.float64, return_info=False, i2=None, per_head=False, mean_v=True,
                    oracle=False, q_sel=None, K_sel=None, comp_w=None, window=None,
                    streaming=False, h2o_scores=None, ivf=None, coverage=None, kv_quant=None, kt_bits=16,
                    topk_buckets=0, softcap=0.0, max_bias=0.0, sinks=None, kq_b=None):
    """SparQ attention (docs/algorithm.md steps 1-5) per row and KV head group.

    r: components kept in step 1, in [1, d].  k: positions kept in step 3, >= 1.
    l: local window (most recent valid cells, always kept, counted in k), in [0, k].
    Rows with at most k valid cells are exact dense attention (alpha = 1).

    Returns out (n_rows, n_head, dv), or (out, info) with return_info=True, where info is
      "i1":         int array (n_rows, n_head_kv, r), the selected components, ascending
      "i2":         list per row of list per KV head of int arrays, the selected cells,
                    ascending
      "alpha":      (n_rows, n_head), the approximate-score mass on the selected cells
      "dense_rows": bool array (n_rows,), True where the row had n_valid <= k

    i2: optional forced position selection (n_rows, n_head_kv, k) used instead of step 3
    on the rows that are not dense (kernel tests use it to check a kernel's output on the
    kernel's own selection when the two selections differ only by ties).

    Selection variants (the op's selectors and flags, docs/architecture.md "Selectors"):
    per_head: each query head takes its own k - l best cells by its own shat_h; the group
      attends over the union of those plus the window (up to g*(k-l)+l cells).
    mean_v: False turns the mean-value reallocation off (out_h = y_h).
    oracle: exact scores (r = d, the oracle top-k).
    q_sel, K_sel: the query (n_rows, n_head, d) and keys (S, n_head_kv, d) in the basis
      the approximate scores use (K^T stored rotated); default q and K. Step 4 always uses
      q and K.
    comp_w: (n_head_kv, d) weights of the components in step 1 (and in tau's norms).
    window: optional list per row of the local window's cells (the cells of the l most
      recent positions, which need not be the last cells by index); the first l entries
      that are valid cells are used. Default: the last l valid cells.

    The paper's baselines (Appendix G; no approximate scores, no mean-V, one choice per group):
    streaming: LM-Infinite / StreamingLLM: the window and the k - l earliest cells (attention
      sinks): entries l..k-1 of ``window`` (the earliest positions' cells), or the first k - l
      valid cells.
    h2o_scores: H2O: (n_head_kv, S) accumulated attention per cell. The window and the k - l
      cells of largest score outside it (ties to the lower index). Every row chooses on these
      scores; then each row's attention weights over its cells (summed over the group's heads)
      are added: info["h2o"] holds the new scores.
    coverage: (p, k_min), the calibrated k (the sparq and oracle selectors; the op's coverage
      target, ggml_sparq_attn_set_coverage with apply): of the k - l best cells, the fewest whose
      estimated weights (shat: the group's mean, or per_head each head's own), with the window's,
      reach p, at least k_min - l (all k - l where they fall short: a diffuse head keeps the cap's
      best, the rest to the mean of V); i2 and info["i2"] are then lists per KV head (-1 entries of a
      given i2 are dropped).
    ivf: the vector-index selector (top-k over an inverted-file index of the keys), a tuple
      (centroids (n_head_kv, n_list, d), lists (n_head_kv, S) with -1 for an unassigned cell,
      n_probe). An unassigned valid cell first joins its nearest centroid (L2, ties to the lower
      list); info["ivf_lists"] holds the lists after. Per row and KV head the group's summed
      query ranks the lists by q . centroid; the valid cells of the n_probe best lists outside
      the window are ranked by (sum_h q_h) . k * scale, and the best k - l (or fewer) kept. With
      per_head each query head ranks the lists and the cells with its own q_h; the group attends
      over the union of the heads' choices and the window. info["ivf_reads"] (n_rows, n_head_kv)
      counts the keys scored: the valid cells of the lists any search probed, less the window when
      it is the tail of the cells (no window list); -1 for a row that runs dense.
    kv_quant: a quantized cache, one of ``KV_QUANT_TYPES``: K and V as it holds them (``round_kv``; steps 4-5 use
      those), and by default K_sel the f16 of those keys (the K^T the fork keeps for such a cache).
      A given vbar is used as it is (the fork's V sums are of the rounded values).
    kt_bits: 8 reads K^T in e5m2 (``round_e5m2`` of K_sel, or of K) in steps 1-3 (the oracle's scores
      too: it reads K^T); 4 in the 4-bit K^T (``round_kt4``: blocks of 32 cells, a power-of-two
      scale each); steps 4-5 still read K and V at full precision. 16 (default): as given.
    topk_buckets: B > 0 makes step 3's ranking the approximate bucketed top-k (Key et al. 2024,
      one cell per bucket): the cells outside the window split into B buckets by cell index
      modulo B, each bucket's best by the ranking key (ties to the lower cell), then the k - l
      best of those. B >= k; with a fixed k only (no coverage), the sparq and oracle selectors.
      i2 (given or in info) is then a list per KV head: fewer than k - l cells where fewer than
      k - l buckets hold a candidate. 0 (default): the exact top-k.

    The attention variants (docs/algorithm.md), in every logit of steps 2 and 4 (the baselines' choice
    ignores them): softcap > 0 caps a logit x (scale included) to softcap * tanh(x / softcap) before
    the mask; max_bias > 0 adds the mask times each head's ALiBi slope (ggml's); sinks (n_head,): a
    logit per query head with a zero value row in every softmax's denominator; alpha counts its
    weight, as the calibrated k's cut does (both as the window's: always attended); kq_b (n_rows,
    n_head, S): a bias added times scale after the cap, before the mask (upstream's kq_b, added
    before soft_max_ext's scale), finite at the valid cells.
    """
    if kt_bits not in (4, 8, 16) or isinstance(kt_bits, bool):
        raise ValueError(f"kt_bits must be 4, 8 (e5m2) or 16, got {kt_bits!r}")
    if kv_quant is not None:
        K, V = round_kv(K, kv_quant), round_kv(V, kv_quant)
        if K_sel is None:
            K_sel = np.asarray(K).astype(np.float16)
    if kt_bits == 8:
        K_sel = round_e5m2(K if K_sel is None else K_sel)
    elif kt_bits == 4:
        K_sel = round_kt4(K if K_sel is None else K_sel)  # K (S, n_head_kv, d): blocks along the cells
    q, K, V, mask, scale, vbar, dims = prepare(q, K, V, mask, scale, vbar)
    dt = float_dtype(dtype)
    n_rows, n_kv, g, d, S, dv = (
        dims[x] for x in ("n_rows", "n_head_kv", "g", "d", "S", "dv"))
    o = sparq_options(dims, dt, q, K, r=r, k=k, l=l, i2=i2, per_head=per_head, mean_v=mean_v, oracle=oracle,
                      q_sel=q_sel, K_sel=K_sel, comp_w=comp_w, streaming=streaming, h2o_scores=h2o_scores,
                      ivf=ivf, coverage=coverage, topk_buckets=topk_buckets)

    qg = q.astype(dt, copy=False).reshape(n_rows, n_kv, g, d)
    qsg = o.q_sel.astype(dt, copy=False).reshape(n_rows, n_kv, g, d)
    md = None if mask is None else mask.astype(dt, copy=False)
    valid = np.ones((n_rows, S), bool) if mask is None else np.isfinite(mask)
    n_valid = valid.sum(axis=1)
    dense_rows = n_valid <= o.k
    vbar_d = None if vbar is None else vbar.astype(dt, copy=False)

    var = check_variants(n_kv, g, softcap, max_bias, sinks, kq_b, scale, (n_rows, n_kv * g, S))

    # Step 1: component selection, shared by the query heads of a group.
    i1 = select_components(qsg, o.r, o.comp_w)  # (n_rows, n_kv, r)

    out = np.empty((n_rows, n_kv, g, dv), dt)
    alpha = np.ones((n_rows, n_kv, g), dt)
    i2_info = []
    vbar_cache = {}  # default vbar per distinct set of valid cells

    for row in range(n_rows):
        cells = np.flatnonzero(valid[row])
        mrow = None if md is None else md[row]

        if dense_rows[row]:
            # Exact dense step: every valid cell, the same for all KV heads.
            sel = np.broadcast_to(cells, (n_kv, cells.size))
        elif o.selector != "sparq":
            sel = baseline_positions(o, window, row, cells, valid[row], qg[row], K, scale, per_head)
        else:
            # Step 2: approximate scores per query head, (n_kv, g, S); 0 at invalid cells.
            shat, ssink = approx_scores(qsg[row], o.K_sel, i1[row], mrow, scale, dt, o.comp_w, var, with_sink=True,
                                        row=row)
            # Step 3: position selection shared by the group (or per query head).
            sel = sparq_positions(shat, window, row, o.l, o.k, cells, valid[row], per_head, coverage, o.topk_buckets,
                                  ssink)
            if i2 is not None:
                sel = ([np.sort(x[x >= 0]) for x in (np.asarray(y, dtype=np.int64).ravel() for y in i2[row])]
                       if coverage is not None or o.topk_buckets
                       else np.sort(np.asarray(i2[row], dtype=np.int64).reshape(n_kv, o.k), axis=1))
            # Step 5 (part): alpha_h = sum_{i in i2} shat_h[i].
            selected_mass(shat, sel, alpha[row], ssink)

        # Step 4: exact attention over the selected cells, per query head.
        y = exact_attention(qg[row], K, V, sel, mrow, scale, dt, o.h2o_new, var, row=row)

        if dense_rows[row] or not o.mean_v:
            out[row] = y
        else:
            # Step 5: mean-value reallocation.
            vb = row_vbar(vbar_d, row, V, valid[row], cells, dt, vbar_cache)
            out[row] = mean_value_reallocation(y, alpha[row], vb, dt)

        i2_info.append([np.array(sel[j], dtype=np.int64) for j in range(n_kv)])

    out = out.reshape(n_rows, n_kv * g, dv)
    if not return_info:
        return out
    info = {
        "i1": i1.astype(np.int64),
        "i2": i2_info,
        "alpha": alpha.reshape(n_rows, n_kv * g),
        "dense_rows": dense_rows,
    }
    if o.selector == "h2o":
        info["h2o"] = o.h2o_new
    if o.selector == "index":
        info["ivf_lists"] = o.ivf.lists
        info["ivf_reads"] = o.ivf.reads
    return out, info


def selection_matches(ref_sorted_idx, got_idx, scores, atol, forced=None):
    """True if a kernel's selection ``got_idx`` is the reference one up to ties.

    ref_sorted_idx: the reference's selected positions (e.g. info["i2"][row][j]).
    got_idx:        the positions the kernel selected (any order).
    scores:         1-D scores the selection ranks on (e.g. combined_scores(...)[row, j]).
    atol:           tie tolerance on those scores.
    forced:         optional positions that must be selected whatever their score (the
                    local window); they are required in got_idx and do not set the
                    boundary.

    The sets must have the same size and no duplicates. They may differ only in positions
    whose scores lie within ``atol`` of the selection boundary (the lowest score among
    the reference's non-forced selected positions). Invalid cells score 0, so a test with
    a large atol should also check separately that no invalid cell was selected.
    """
    ref = np.asarray(ref_sorted_idx, dtype=np.int64).ravel()
    got = np.asarray(got_idx, dtype=np.int64).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    if got.size != ref.size or np.unique(got).size != got.size:
        return False
    ref_set, got_set = set(ref.tolist()), set(got.tolist())
    if ref_set == got_set:
        return True
    if got.min() < 0 or got.max() >= scores.size:
        return False
    forced_set = set() if forced is None else set(
        np.asarray(forced, dtype=np.int64).ravel().tolist())
    if not forced_set <= got_set:
        return False
    free = [i for i in ref_set if i not in forced_set]
    if not free:
        return False  # everything was forced, yet the sets differ
    boundary = scores[free].min()
    diff = np.array(sorted(ref_set ^ got_set), dtype=np.int64)
    return bool(np.all(np.abs(scores[diff] - boundary) <= atol))
