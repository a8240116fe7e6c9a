"""NumPy reference for SparQ attention: the oracle every kernel test compares against.

The algorithm is the one of ``SPARQ.md`` (the project's contract), for one KV "stream":

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

``SPARQ.md`` writes the temperature as ``tau_h = sqrt(d * ||q_h[i1]||_1 / ||q_h||_1)`` with
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

import operator

import numpy as np

__all__ = [
    "dense_attention",
    "sparq_attention",
    "combined_scores",
    "selection_matches",
]

# Rows per block in dense_attention: bounds the (rows, g, S) logits buffer for long prefills.
_DENSE_ROW_BLOCK = 64


# --------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------


def _as_int(name, value):
    """Return ``value`` as a Python int, or raise ValueError naming ``name``."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def _float_dtype(dtype):
    dt = np.dtype(dtype)
    if not np.issubdtype(dt, np.floating):
        raise ValueError(f"dtype must be a floating-point type (float16/32/64), got {dt}")
    return dt


def _check_real_array(name, arr):
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"{name} must hold real numbers, got dtype {arr.dtype}")


def _prepare(q, K, V, mask, scale, vbar=None):
    """Check shapes of the inputs; return them as arrays (not yet cast) plus the dims.

    V may be None (combined_scores needs no values).
    """
    q = np.asarray(q)
    K = np.asarray(K)
    if q.ndim != 3:
        raise ValueError(f"q must have shape (n_rows, n_head, d), got shape {q.shape}")
    if K.ndim != 3:
        raise ValueError(f"K must have shape (S, n_head_kv, d), got shape {K.shape}")
    _check_real_array("q", q)
    _check_real_array("K", K)
    n_rows, n_head, d = q.shape
    S, n_head_kv, dk = K.shape
    if d < 1:
        raise ValueError(f"q: head size d must be >= 1, got shape {q.shape}")
    if dk != d:
        raise ValueError(f"K must have shape (S, n_head_kv, d={d}), got shape {K.shape}")
    if n_head < 1 or n_head_kv < 1:
        raise ValueError(
            f"n_head and n_head_kv must be >= 1, got n_head={n_head}, n_head_kv={n_head_kv}"
        )
    if n_head % n_head_kv != 0:
        raise ValueError(
            f"n_head ({n_head}) must be a multiple of n_head_kv ({n_head_kv})"
        )
    dv = None
    if V is not None:
        V = np.asarray(V)
        _check_real_array("V", V)
        if V.ndim != 3 or V.shape[0] != S or V.shape[1] != n_head_kv:
            raise ValueError(
                f"V must have shape (S={S}, n_head_kv={n_head_kv}, dv), got shape {V.shape}"
            )
        dv = V.shape[2]
    if mask is not None:
        mask = np.asarray(mask)
        _check_real_array("mask", mask)
        if mask.shape != (n_rows, S):
            raise ValueError(
                f"mask must have shape (n_rows={n_rows}, S={S}), got shape {mask.shape}"
            )
        if np.any(np.isnan(mask)) or np.any(mask == np.inf):
            raise ValueError("mask must hold finite values or -inf (no NaN, no +inf)")
    if scale is None:
        scale = 1.0 / np.sqrt(d)
    else:
        try:
            scale = float(scale)
        except (TypeError, ValueError):
            raise ValueError(f"scale must be a finite number > 0, got {scale!r}") from None
        if not (np.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be a finite number > 0, got {scale!r}")
    if vbar is not None:
        vbar = np.asarray(vbar)
        _check_real_array("vbar", vbar)
        if vbar.shape not in ((n_head_kv, dv), (n_rows, n_head_kv, dv)):
            raise ValueError(
                f"vbar must have shape (n_head_kv={n_head_kv}, dv={dv}) or "
                f"(n_rows={n_rows}, n_head_kv={n_head_kv}, dv={dv}), got shape {vbar.shape}"
            )
    dims = dict(n_rows=n_rows, n_head=n_head, d=d, S=S, n_head_kv=n_head_kv, dv=dv,
                g=n_head // n_head_kv)
    return q, K, V, mask, scale, vbar, dims


def _check_r(r, d):
    r = _as_int("r", r)
    if not 1 <= r <= d:
        raise ValueError(f"r must be in [1, d] = [1, {d}], got {r}")
    return r


def _check_k_l(k, l):
    k = _as_int("k", k)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    l = _as_int("l", l)
    if not 0 <= l <= k:
        raise ValueError(f"l must be in [0, k] = [0, {k}], got {l}")
    return k, l


# --------------------------------------------------------------------------------------
# math helpers (everything in the dtype of the arguments)
# --------------------------------------------------------------------------------------


def _softmax(x):
    """Softmax over the last axis, in x's dtype.

    -inf entries get exactly 0; a slice that is all -inf (or empty) gives all zeros
    instead of NaN.
    """
    if x.shape[-1] == 0:
        return x.copy()
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, x.dtype.type(0))
    e = np.exp(x - m)
    s = np.sum(e, axis=-1, keepdims=True)
    return np.divide(e, s, out=np.zeros_like(e), where=s > 0)


def _select_components(qg, r, w=None):
    """i1 per (row, KV head): the r largest entries of sum_h |q_h| (times w), ascending.

    qg: (n_rows, n_head_kv, g, d) in the working dtype; w: optional (n_head_kv, d)
    component weights (the keys' spread per component). Ties go to the lower component
    index (stable argsort on the negated values). The returned indices are sorted
    ascending: the set is what matters, and ascending is the order a kernel reading
    K^T rows in memory order would use.
    """
    qabs = np.sum(np.abs(qg), axis=2)  # (n_rows, n_head_kv, d)
    if w is not None:
        qabs = qabs * w.astype(qabs.dtype)[None]
    order = np.argsort(-qabs, axis=-1, kind="stable")[..., :r]
    return np.sort(order, axis=-1)


def _approx_scores(qr, K, i1r, mrow, scale, dt, w=None):
    """shat for one row: (n_head_kv, g, S), softmax of the approximate logits.

    qr: (n_head_kv, g, d) query of this row in dt; K: (S, n_head_kv, d) uncast;
    i1r: (n_head_kv, r); mrow: (S,) mask row in dt or None; w: optional (n_head_kv, d)
    component weights, which weight the L1 norms of the temperature too.
    """
    n_head_kv = qr.shape[0]
    # Gather the r components of the keys first, then cast: K itself may be large.
    # K[:, j, i1r[j, c]] -> (S, n_head_kv, r) -> (n_head_kv, r, S) (the "K^T rows").
    Kt = K[:, np.arange(n_head_kv)[:, None], i1r].astype(dt, copy=False)
    Kt = np.ascontiguousarray(Kt.transpose(1, 2, 0))
    qs = np.take_along_axis(qr, i1r[:, None, :], axis=2)  # (n_head_kv, g, r)
    # Per query head: scale * sqrt(||q_h||_1 / ||q_h[i1]||_1)  (= 1/tau_h for 1/sqrt(d)).
    sc = dt.type(scale)
    aq = np.abs(qr) if w is None else np.abs(qr) * w.astype(dt)[:, None, :]
    n_all = np.sum(aq, axis=-1)  # (n_head_kv, g)
    n_sel = np.sum(np.take_along_axis(aq, i1r[:, None, :], axis=2), axis=-1)
    ratio = np.divide(n_all, n_sel, out=np.ones_like(n_all), where=n_sel > 0)
    factor = np.where(n_sel > 0, sc * np.sqrt(ratio), sc).astype(dt, copy=False)
    logits = np.matmul(qs, Kt) * factor[..., None]  # (n_head_kv, g, S)
    if mrow is not None:
        logits = logits + mrow
    return _softmax(logits)


# --------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------


def dense_attention(q, K, V, mask=None, scale=None, dtype=np.float64):
    """Dense attention, ``softmax(q . K^T * scale + mask) . V`` per query head.

    Shapes as in the module docstring; returns (n_rows, n_head, dv) in ``dtype``.
    """
    q, K, V, mask, scale, _, dims = _prepare(q, K, V, mask, scale)
    dt = _float_dtype(dtype)
    n_rows, n_kv, g, d, dv = (dims[x] for x in ("n_rows", "n_head_kv", "g", "d", "dv"))
    qg = q.astype(dt, copy=False).reshape(n_rows, n_kv, g, d)
    md = None if mask is None else mask.astype(dt, copy=False)
    sc = dt.type(scale)
    out = np.zeros((n_rows, n_kv, g, dv), dt)
    for j in range(n_kv):
        Kj = K[:, j, :].astype(dt)  # (S, d), cast one KV head at a time
        Vj = V[:, j, :].astype(dt)  # (S, dv)
        for r0 in range(0, n_rows, _DENSE_ROW_BLOCK):
            r1 = min(r0 + _DENSE_ROW_BLOCK, n_rows)
            logits = np.matmul(qg[r0:r1, j], Kj.T) * sc  # (b, g, S)
            if md is not None:
                logits = logits + md[r0:r1, None, :]
            out[r0:r1, j] = np.matmul(_softmax(logits), Vj)
    return out.reshape(n_rows, n_kv * g, dv)


def combined_scores(q, K, *, r, mask=None, scale=None, dtype=np.float64, comp_w=None, per_head=False):
    """The position-selection scores: (n_rows, n_head_kv, S) array of ``sum_h shat_h``
    (per_head: (n_rows, n_head_kv, g, S), each head's shat_h).

    The sum runs over the query heads of each KV head group; invalid (-inf) cells score 0.
    Kernel tests use it to judge whether two selections differ only by ties. q and K are
    in the basis of the approximate scores (q_sel and K_sel of sparq_attention).
    """
    q, K, _, mask, scale, _, dims = _prepare(q, K, None, mask, scale)
    dt = _float_dtype(dtype)
    n_rows, n_kv, g, d, S = (dims[x] for x in ("n_rows", "n_head_kv", "g", "d", "S"))
    r = _check_r(r, d)
    qg = q.astype(dt, copy=False).reshape(n_rows, n_kv, g, d)
    md = None if mask is None else mask.astype(dt, copy=False)
    w = None if comp_w is None else np.asarray(comp_w, dtype=dt)
    i1 = _select_components(qg, r, w)
    out = np.zeros((n_rows, n_kv, g, S) if per_head else (n_rows, n_kv, S), dt)
    for row in range(n_rows):
        mrow = None if md is None else md[row]
        sh = _approx_scores(qg[row], K, i1[row], mrow, scale, dt, w)
        out[row] = sh if per_head else np.sum(sh, axis=1)
    return out


def sparq_attention(q, K, V, *, r, k, l=0, mask=None, scale=None, vbar=None,
                    dtype=np.float64, return_info=False, i2=None, per_head=False, mean_v=True,
                    oracle=False, q_sel=None, K_sel=None, comp_w=None, window=None,
                    streaming=False, h2o_scores=None, ivf=None):
    """SparQ attention (SPARQ.md steps 1-5) per row and KV head group.

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

    Selection variants (the op's selectors and flags, ARCHITECTURE.md "Selectors"):
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
    """
    q, K, V, mask, scale, vbar, dims = _prepare(q, K, V, mask, scale, vbar)
    dt = _float_dtype(dtype)
    n_rows, n_kv, g, d, S, dv = (
        dims[x] for x in ("n_rows", "n_head_kv", "g", "d", "S", "dv"))
    h2o = h2o_scores is not None
    index = ivf is not None
    if streaming + h2o + index > 1:
        raise ValueError("streaming, h2o_scores and ivf are three selectors: give one")
    if (streaming or h2o or index) and (oracle or q_sel is not None or comp_w is not None):
        raise ValueError("the streaming, h2o and index selectors take no oracle, q_sel or comp_w")
    if (streaming or h2o) and per_head:
        raise ValueError("the streaming and h2o selectors choose per KV head: per_head does not apply")
    if streaming or h2o or index:
        mean_v = False
        r = 1
    r = d if oracle else _check_r(r, d)
    k, l = _check_k_l(k, l)
    if h2o:
        h2o_in = np.asarray(h2o_scores, dtype=np.float64)
        if h2o_in.shape != (dims["n_head_kv"], dims["S"]):
            raise ValueError(f"h2o_scores must have shape (n_head_kv, S) = {(dims['n_head_kv'], dims['S'])}")
        h2o_new = h2o_in.copy()
    if index:
        cent = np.asarray(ivf[0], dtype=np.float64)
        lists = np.array(ivf[1], dtype=np.float64)
        n_probe = int(ivf[2])
        if cent.ndim != 3 or cent.shape[0] != dims["n_head_kv"] or cent.shape[2] != dims["d"]:
            raise ValueError(f"ivf centroids must have shape (n_head_kv, n_list, d), got {cent.shape}")
        if lists.shape != (dims["n_head_kv"], dims["S"]):
            raise ValueError(f"ivf lists must have shape (n_head_kv, S) = {(dims['n_head_kv'], dims['S'])}")
        if not 1 <= n_probe <= cent.shape[1]:
            raise ValueError(f"ivf n_probe = {n_probe} is out of range: allowed 1..{cent.shape[1]}")
        ivf_reads = np.full((dims["n_rows"], dims["n_head_kv"]), -1, dtype=np.int64)
    if per_head and i2 is not None:
        raise ValueError("i2 (a forced selection) is for the group-shared selection only")
    q_sel = q if q_sel is None else np.asarray(q_sel)
    K_sel = K if K_sel is None else np.asarray(K_sel)
    if q_sel.shape != q.shape or K_sel.shape != K.shape:
        raise ValueError(f"q_sel and K_sel must have the shapes of q {q.shape} and K {K.shape}")
    if comp_w is not None:
        comp_w = np.asarray(comp_w, dtype=dt)
        if comp_w.shape != (n_kv, d):
            raise ValueError(f"comp_w must have shape (n_head_kv={n_kv}, d={d}), got {comp_w.shape}")

    qg = q.astype(dt, copy=False).reshape(n_rows, n_kv, g, d)
    qsg = q_sel.astype(dt, copy=False).reshape(n_rows, n_kv, g, d)
    md = None if mask is None else mask.astype(dt, copy=False)
    valid = np.ones((n_rows, S), bool) if mask is None else np.isfinite(mask)
    n_valid = valid.sum(axis=1)
    dense_rows = n_valid <= k
    vbar_d = None if vbar is None else vbar.astype(dt, copy=False)

    # Step 1: component selection, shared by the query heads of a group.
    i1 = _select_components(qsg, r, comp_w)  # (n_rows, n_kv, r)

    out = np.empty((n_rows, n_kv, g, dv), dt)
    alpha = np.ones((n_rows, n_kv, g), dt)
    i2_info = []
    vbar_cache = {}  # default vbar per distinct set of valid cells

    for row in range(n_rows):
        cells = np.flatnonzero(valid[row])
        nv = cells.size
        mrow = None if md is None else md[row]
        qr = qg[row]  # (n_kv, g, d)

        if dense_rows[row]:
            # Exact dense step: every valid cell, the same for all KV heads.
            sel = np.broadcast_to(cells, (n_kv, nv))
        elif streaming or h2o or index:
            win_r, sinks = _window_cells(window, row, l, k if streaming else l, cells, valid[row])
            w = win_r.size
            if streaming:
                sel = np.broadcast_to(np.union1d(win_r, sinks), (n_kv, np.union1d(win_r, sinks).size))
            elif index:
                sel = []
                for j in range(n_kv):
                    Kj = K[:, j, :].astype(np.float64)
                    todo = np.flatnonzero(valid[row] & (lists[j] < 0))
                    if todo.size:
                        dist = np.sum(cent[j] ** 2, axis=1)[None, :] - 2.0 * Kj[todo] @ cent[j].T
                        lists[j, todo] = np.argmin(dist, axis=1)  # first minimum: the lower list
                    chosen = win_r
                    reach = np.zeros(S, dtype=bool)  # the valid cells of any search's probed lists
                    for qv in (qr[j] if per_head else [np.sum(qr[j], axis=0)]):
                        probed = np.argsort(-(cent[j] @ qv), kind="stable")[:n_probe]
                        cand = np.full(S, -np.inf)
                        ok = valid[row] & np.isin(lists[j], probed)
                        reach |= ok
                        ok[win_r] = False
                        cand[ok] = (Kj[ok] @ qv) * scale
                        top = np.argsort(-cand, kind="stable")[: k - w]
                        chosen = np.union1d(chosen, top[np.isfinite(cand[top])])
                    sel.append(chosen)
                    # the keys scored: with the window as the tail of the cells (no window list) it is
                    # left out of the scan, with a window list it is scanned like any cell
                    ivf_reads[row, j] = np.sum(reach) - (np.sum(reach[win_r]) if window is None else 0)
            else:
                cand = h2o_in.copy()
                cand[:, ~valid[row]] = -np.inf
                cand[:, win_r] = -np.inf
                top = np.argsort(-cand, axis=-1, kind="stable")[:, : k - w]
                sel = [np.union1d(top[j][np.isfinite(cand[j, top[j]])], win_r) for j in range(n_kv)]
        else:
            # Step 2: approximate scores per query head, (n_kv, g, S); 0 at invalid cells.
            shat = _approx_scores(qsg[row], K_sel, i1[row], mrow, scale, dt, comp_w)
            # Step 3: position selection shared by the group (or per query head).
            win_r, _ = _window_cells(window, row, l, l, cells, valid[row])
            w = win_r.size
            cand = np.sum(shat, axis=1) if not per_head else shat.copy()  # (n_kv, S) or (n_kv, g, S)
            cand[..., ~valid[row]] = -np.inf  # never select an invalid cell
            cand[..., win_r] = -np.inf  # the window is added below, not chosen here
            # There are nv - w >= k - w + 1 finite candidates, so no -inf is picked.
            # Stable argsort on negated scores: ties go to the lower cell index.
            top = np.argsort(-cand, axis=-1, kind="stable")[..., : k - w]
            if per_head:
                sel = [np.union1d(top[j].ravel(), win_r) for j in range(n_kv)]
            else:
                sel = np.sort(np.concatenate([top, np.broadcast_to(win_r, (n_kv, w))],
                                             axis=1), axis=1)
            if i2 is not None:
                sel = np.sort(np.asarray(i2[row], dtype=np.int64).reshape(n_kv, k), axis=1)
            # Step 5 (part): alpha_h = sum_{i in i2} shat_h[i].
            for j in range(n_kv):
                alpha[row, j] = np.sum(shat[j][:, sel[j]], axis=-1)

        # Step 4: exact attention over the selected cells, per query head.
        y = np.empty((n_kv, g, dv), dt)
        for j in range(n_kv):
            sj = np.asarray(sel[j], dtype=np.int64)
            Ks = K[sj, j, :].astype(dt, copy=False)  # (m, d)
            Vs = V[sj, j, :].astype(dt, copy=False)  # (m, dv)
            logits = np.matmul(qr[j], Ks.T) * dt.type(scale)  # (g, m)
            if mrow is not None:
                logits = logits + mrow[sj][None, :]
            p = _softmax(logits)
            y[j] = np.matmul(p, Vs)  # (g, dv); zeros if m == 0
            if h2o:
                np.add.at(h2o_new[j], sj, np.sum(p, axis=0))

        if dense_rows[row] or not mean_v:
            out[row] = y
        else:
            # Step 5: mean-value reallocation.
            if vbar_d is None:
                vb = _default_vbar(V, valid[row], cells, dt, vbar_cache)
            elif vbar_d.ndim == 3:
                vb = vbar_d[row]
            else:
                vb = vbar_d
            a = alpha[row][..., None]  # (n_kv, g, 1)
            out[row] = a * y + (dt.type(1) - a) * vb[:, None, :]

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
    if h2o:
        info["h2o"] = h2o_new
    if index:
        info["ivf_lists"] = lists
        info["ivf_reads"] = ivf_reads
    return out, info


def _window_cells(window, row, l, k, cells, valid_row):
    """The local window's cells of one row and, for entries l..k-1 (the streaming selector's sinks,
    k > l), the cells after it; both ascending, valid only. Without a window list: the last l and
    the first k - l valid cells."""
    if window is None:
        w = min(l, cells.size)
        return cells[cells.size - w:], cells[: k - l]
    ent = np.asarray(window[row]).ravel()
    keep = [int(c) for c in ent[:k] if 0 <= c < valid_row.size and valid_row[c]]
    n_win = sum(1 for c in ent[:l] if 0 <= c < valid_row.size and valid_row[c])
    return np.unique(np.asarray(keep[:n_win], dtype=np.int64)), np.asarray(keep[n_win:], dtype=np.int64)


def _default_vbar(V, valid_row, cells, dt, cache):
    """Mean of V over the valid cells of one row, (n_head_kv, dv) in dt (cached)."""
    key = valid_row.tobytes()
    vb = cache.get(key)
    if vb is None:
        nv = cells.size
        if nv == valid_row.size:
            s = np.sum(V, axis=0, dtype=dt)
        elif cells[-1] - cells[0] + 1 == nv:
            s = np.sum(V[cells[0]: cells[-1] + 1], axis=0, dtype=dt)  # a view, no copy
        else:
            s = np.sum(V[cells], axis=0, dtype=dt)
        vb = s / dt.type(nv)
        cache[key] = vb
    return vb


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
