"""Position selection without approximate scores in the NumPy reference (sparq_lab.reference):
the paper's baselines (streaming, H2O) and the vector-index selector, one row at a time."""

from __future__ import annotations

import numpy as np

from ._reference_steps import window_cells


def baseline_positions(o, window, row, cells, valid_row, qr, K, scale, per_head):
    """The cells of one row under o.selector ("streaming", "h2o" or "index"): per KV head, the
    local window plus what the selector chooses (see sparq_attention)."""
    n_kv = qr.shape[0]
    streaming = o.selector == "streaming"
    win_r, sinks = window_cells(window, row, o.l, o.k if streaming else o.l, cells, valid_row)
    if streaming:
        return streaming_positions(win_r, sinks, n_kv)
    if o.selector == "index":
        return index_positions(o.ivf, row, qr, K, valid_row, win_r, o.k, scale, per_head, window is None)
    return h2o_positions(o.h2o_in, valid_row, win_r, o.k)


def streaming_positions(win_r, sinks, n_kv):
    """LM-Infinite / StreamingLLM: the window and the attention sinks, the same for every KV head."""
    u = np.union1d(win_r, sinks)
    return np.broadcast_to(u, (n_kv, u.size))


def h2o_positions(h2o_in, valid_row, win_r, k):
    """H2O: the window and the k - l cells of largest accumulated score outside it (ties to the
    lower index), per KV head."""
    w = win_r.size
    cand = h2o_in.copy()
    cand[:, ~valid_row] = -np.inf
    cand[:, win_r] = -np.inf
    top = np.argsort(-cand, axis=-1, kind="stable")[:, : k - w]
    return [np.union1d(top[j][np.isfinite(cand[j, top[j]])], win_r) for j in range(h2o_in.shape[0])]


def index_positions(ivf, row, qr, K, valid_row, win_r, k, scale, per_head, tail_window):
    """The vector-index selector, per KV head: the unassigned valid cells join their nearest list,
    the group's summed query (per_head: each head's) probes the n_probe best lists, and the best
    k - l of their cells outside the window join it. Records the keys scored in ivf.reads[row]."""
    cent, lists, n_probe = ivf.centroids, ivf.lists, ivf.n_probe
    S = valid_row.size
    w = win_r.size
    sel = []
    for j in range(qr.shape[0]):
        Kj = K[:, j, :].astype(np.float64)
        todo = np.flatnonzero(valid_row & (lists[j] < 0))
        if todo.size:
            dist = np.sum(cent[j] ** 2, axis=1)[None, :] - 2.0 * Kj[todo] @ cent[j].T
            lists[j, todo] = np.argmin(dist, axis=1)  # first minimum: the lower list
        chosen = win_r
        reach = np.zeros(S, dtype=bool)  # the valid cells of any search's probed lists
        for qv in (qr[j] if per_head else [np.sum(qr[j], axis=0)]):
            probed = np.argsort(-(cent[j] @ qv), kind="stable")[:n_probe]
            cand = np.full(S, -np.inf)
            ok = valid_row & np.isin(lists[j], probed)
            reach |= ok
            ok[win_r] = False
            cand[ok] = (Kj[ok] @ qv) * scale
            top = np.argsort(-cand, kind="stable")[: k - w]
            chosen = np.union1d(chosen, top[np.isfinite(cand[top])])
        sel.append(chosen)
        # the keys scored: with the window as the tail of the cells (no window list) it is
        # left out of the scan, with a window list it is scanned like any cell
        ivf.reads[row, j] = np.sum(reach) - (np.sum(reach[win_r]) if tail_window else 0)
    return sel
