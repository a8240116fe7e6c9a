"""The steps of SparQ attention in the NumPy reference (sparq_lab.reference), one row at a
time: component selection (1), approximate scores (2), position selection (3), exact
attention (4), mean-value reallocation (5). Arithmetic in the working dtype ``dt``."""

from __future__ import annotations

import numpy as np


def softmax(x):
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


class Variants:
    """The attention variants of one call (docs/algorithm.md): ``softcap`` > 0 caps every logit x
    (scale included) to ``softcap * tanh(x / softcap)`` before the mask; the mask is added times each
    query head's ALiBi ``slopes`` (ggml's soft_max_ext, from max_bias; 1 without); ``sinks`` a logit per
    query head with a zero value row, in every softmax's denominator. slopes and sinks (n_head_kv, g).
    ``kq_b`` (n_rows, n_head, S): a bias, added times ``scale`` after the cap and before the mask (where
    build_attn_mha adds kq_b: before soft_max_ext's scale)."""

    def __init__(self, n_head_kv, g, softcap=0.0, max_bias=0.0, sinks=None, kq_b=None, scale=1.0):
        self.softcap = float(softcap)
        self.slopes = alibi_slopes(n_head_kv * g, max_bias).reshape(n_head_kv, g)
        self.sinks = None if sinks is None else np.asarray(sinks, dtype=np.float64).reshape(n_head_kv, g)
        self.kq_b = None
        if kq_b is not None:
            b = np.asarray(kq_b, dtype=np.float64)
            self.kq_b = (np.float64(scale) * b).reshape(b.shape[0], n_head_kv, g, b.shape[-1])

    def bias(self, rows, j, cells=None):
        """The scaled bias of rows (an index or a slice) and KV head j, (..., g, S) or at ``cells``; None without."""
        if self.kq_b is None:
            return None
        b = self.kq_b[rows, j]
        return b if cells is None else b[..., cells]

    def logits(self, x, m, j, dt, b=None):
        """Logits x (..., g, n) of KV head j with the mask values m (..., n) or None and the scaled bias b
        (..., g, n) or None: capped, biased, masked."""
        if self.softcap:
            c = dt.type(self.softcap)
            x = c * np.tanh(x / c)
        if b is not None:
            x = x + b.astype(dt)
        if m is not None:
            x = x + self.slopes[j].astype(dt)[:, None] * m[..., None, :]
        return x

    def softmax(self, x, j, dt):
        """Softmax of logits x (..., g, n) of KV head j with its heads' sinks: (weights, the sinks' (..., g))."""
        if self.sinks is None:
            return softmax(x), np.zeros(x.shape[:-1], x.dtype)
        sk = self.sinks[j].astype(dt)
        m = np.max(x, axis=-1) if x.shape[-1] else np.full(x.shape[:-1], -np.inf, x.dtype)
        m = np.maximum(m, sk)
        e = np.exp(x - m[..., None])
        es = np.exp(sk - m)
        z = np.sum(e, axis=-1) + es
        return e / z[..., None], es / z


def alibi_slopes(n_head, max_bias):
    """ALiBi's slope per query head as ggml takes it (soft_max_ext, flash_attn_ext); ones for max_bias 0."""
    h = np.arange(n_head)
    if not max_bias:
        return np.ones(n_head)
    n2 = 1 << int(np.floor(np.log2(n_head)))
    m0 = 2.0 ** (-max_bias / n2)
    m1 = 2.0 ** (-(max_bias / 2.0) / n2)
    return np.where(h < n2, m0 ** (h + 1), m1 ** (2 * (h - n2) + 1))


def select_components(qg, r, w=None):
    """Step 1, i1 per (row, KV head): the r largest entries of sum_h |q_h| (times w), ascending.

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


def approx_scores(qr, K, i1r, mrow, scale, dt, w=None, var=None, with_sink=False, row=0):
    """Step 2, shat for one row: (n_head_kv, g, S), softmax of the approximate logits.

    qr: (n_head_kv, g, d) query of this row in dt; K: (S, n_head_kv, d) uncast;
    i1r: (n_head_kv, r); mrow: (S,) mask row in dt or None; w: optional (n_head_kv, d)
    component weights, which weight the L1 norms of the temperature too. var: the Variants, which
    transform the approximate logits as the exact ones (its bias: of row ``row``); with_sink: (shat,
    each head's sink weight).
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
    if var is None:
        if mrow is not None:
            logits = logits + mrow
        p = softmax(logits)
        return (p, np.zeros(p.shape[:2], dt)) if with_sink else p
    out = [var.softmax(var.logits(logits[j], mrow, j, dt, var.bias(row, j)), j, dt) for j in range(n_head_kv)]
    p, ps = np.stack([o[0] for o in out]), np.stack([o[1] for o in out])
    return (p, ps) if with_sink else p


def window_cells(window, row, l, k, cells, valid_row):
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


def coverage_cut(weights, order, win_mass, p, k_min, w, kk):
    """The calibrated k of one selection list: the fewest of the candidates (``order``, the kk best,
    best first) whose estimated weights, with the window's mass, reach p; at least k_min - w.
    All kk when they fall short (a diffuse head: the cap's best cells, the rest to the mean of V)."""
    need = p - win_mass
    if need <= 0:
        n_cut = 0
    else:
        cum = np.cumsum(weights[order])
        hit = np.flatnonzero(cum >= need)
        n_cut = int(hit[0]) + 1 if hit.size else kk
    return min(kk, max(n_cut, k_min - w))


def bucket_winners(cand, buckets):
    """The approximate bucketed top-k's first stage: cand (..., S) with -inf where a cell may not
    be chosen, returned with every cell but the best of its bucket set to -inf. Bucket b holds the
    cells c with c mod buckets == b (interleaved, so that neighbouring cells, whose scores go
    together, fall in different buckets); its best is the largest key, ties to the lower cell."""
    S = cand.shape[-1]
    n = -(-S // buckets) * buckets
    grid = np.full(cand.shape[:-1] + (n,), -np.inf)
    grid[..., :S] = cand
    grid = grid.reshape(cand.shape[:-1] + (n // buckets, buckets))  # cell = row * buckets + bucket
    best = np.argmax(grid, axis=-2)  # the first of equal maxima: the lower cell
    out = np.full(grid.shape, -np.inf)
    np.put_along_axis(out, best[..., None, :], np.take_along_axis(grid, best[..., None, :], axis=-2), axis=-2)
    return out.reshape(cand.shape[:-1] + (n,))[..., :S]


def sparq_positions(shat, window, row, l, k, cells, valid_row, per_head, coverage=None, topk_buckets=0, ssink=None):
    """Step 3, i2 of one row: the window plus the k - l best cells by the group's summed shat
    (per_head: by each head's own shat_h; the union over the heads). An array (n_head_kv, k),
    or per_head a list per KV head of ascending cells.

    coverage = (p, k_min): the calibrated k (ggml_sparq_attn_set_coverage's cut): of those k - l
    best, the fewest whose estimated attention weights (shat; shared: the mean over the group's
    heads), with the window's, reach p, at least k_min - l: a list per KV head. Where they fall
    short (a diffuse head) all k - l are kept. ssink: (n_head_kv, g) the sinks' weights, always
    attended: counted with the window's."""
    n_kv, g = shat.shape[0], shat.shape[1]
    win_r, _ = window_cells(window, row, l, l, cells, valid_row)
    w = win_r.size
    cand = np.sum(shat, axis=1) if not per_head else shat.copy()  # (n_kv, S) or (n_kv, g, S)
    cand[..., ~valid_row] = -np.inf  # never select an invalid cell
    cand[..., win_r] = -np.inf  # the window is added below, not chosen here
    if topk_buckets:
        # the approximate bucketed top-k: the k - l best of the buckets' best cells, fewer where
        # fewer buckets hold a candidate (a list per KV head)
        cand = bucket_winners(cand, topk_buckets)
        top = np.argsort(-cand, axis=-1, kind="stable")[..., : k - w]
        out = []
        for j in range(n_kv):
            tj = top[j][np.isfinite(np.take_along_axis(cand[j], top[j], axis=-1))]
            out.append(np.union1d(tj.ravel(), win_r))
        return out
    # There are nv - w >= k - w + 1 finite candidates, so no -inf is picked.
    # Stable argsort on negated scores: ties go to the lower cell index.
    top = np.argsort(-cand, axis=-1, kind="stable")[..., : k - w]
    if coverage is not None:
        p, k_min = coverage
        sk = np.zeros(shat.shape[:2]) if ssink is None else ssink
        out = []
        for j in range(n_kv):
            if per_head:
                ns = [coverage_cut(shat[j, h], top[j, h], shat[j, h][win_r].sum() + sk[j, h], p, k_min, w, k - w)
                      for h in range(g)]
                keep = np.concatenate([top[j, h][:n] for h, n in enumerate(ns)])
            else:
                wt = shat[j].sum(axis=0) / g
                keep = top[j][:coverage_cut(wt, top[j], wt[win_r].sum() + sk[j].sum() / g, p, k_min, w, k - w)]
            out.append(np.union1d(keep, win_r))
        return out
    if per_head:
        return [np.union1d(top[j].ravel(), win_r) for j in range(n_kv)]
    return np.sort(np.concatenate([top, np.broadcast_to(win_r, (n_kv, w))], axis=1), axis=1)


def selected_mass(shat, sel, alpha_row, ssink=None):
    """Step 5 (part): alpha_h = sum_{i in i2} shat_h[i] (plus the sink's weight, always attended),
    written into alpha_row (n_head_kv, g)."""
    for j in range(shat.shape[0]):
        alpha_row[j] = np.sum(shat[j][:, sel[j]], axis=-1) + (0 if ssink is None else ssink[j])


def exact_attention(qr, K, V, sel, mrow, scale, dt, h2o_new=None, var=None, row=0):
    """Step 4: exact attention of one row over the selected cells, per query head:
    (n_head_kv, g, dv). h2o_new (n_head_kv, S): the H2O scores, to which each cell's attention
    weights (summed over the group's heads) are added. var: the Variants (a sink's row is zero; the bias
    of row ``row``)."""
    n_kv, g = qr.shape[:2]
    y = np.empty((n_kv, g, V.shape[2]), dt)
    for j in range(n_kv):
        sj = np.asarray(sel[j], dtype=np.int64)
        Ks = K[sj, j, :].astype(dt, copy=False)  # (m, d)
        Vs = V[sj, j, :].astype(dt, copy=False)  # (m, dv)
        logits = np.matmul(qr[j], Ks.T) * dt.type(scale)  # (g, m)
        if var is not None:
            p = var.softmax(var.logits(logits, None if mrow is None else mrow[sj], j, dt, var.bias(row, j, sj)), j, dt)[0]
        else:
            if mrow is not None:
                logits = logits + mrow[sj][None, :]
            p = softmax(logits)
        y[j] = np.matmul(p, Vs)  # (g, dv); zeros if m == 0
        if h2o_new is not None:
            np.add.at(h2o_new[j], sj, np.sum(p, axis=0))
    return y


def row_vbar(vbar_d, row, V, valid_row, cells, dt, cache):
    """The mean value of one row, (n_head_kv, dv): the given vbar (one for all rows, or this
    row's), or the mean of V over the row's valid cells."""
    if vbar_d is None:
        return default_vbar(V, valid_row, cells, dt, cache)
    if vbar_d.ndim == 3:
        return vbar_d[row]
    return vbar_d


def default_vbar(V, valid_row, cells, dt, cache):
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


def mean_value_reallocation(y, alpha_row, vb, dt):
    """Step 5: out_h = alpha_h * y_h + (1 - alpha_h) * vbar, (n_head_kv, g, dv)."""
    a = alpha_row[..., None]  # (n_kv, g, 1)
    return a * y + (dt.type(1) - a) * vb[:, None, :]
