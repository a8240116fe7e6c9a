"""Argument checks of the NumPy reference (sparq_lab.reference): shapes, dtypes and counts,
and sparq_attention's options (the selector and its state). ValueError names what is wrong."""

from __future__ import annotations

import dataclasses
import operator

import numpy as np


def as_int(name, value):
    """Return ``value`` as a Python int, or raise ValueError naming ``name``."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def float_dtype(dtype):
    dt = np.dtype(dtype)
    if not np.issubdtype(dt, np.floating):
        raise ValueError(f"dtype must be a floating-point type (float16/32/64), got {dt}")
    return dt


def check_real_array(name, arr):
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"{name} must hold real numbers, got dtype {arr.dtype}")


def prepare(q, K, V, mask, scale, vbar=None):
    """Check shapes of the inputs; return them as arrays (not yet cast) plus the dims.

    V may be None (combined_scores needs no values).
    """
    q = np.asarray(q)
    K = np.asarray(K)
    if q.ndim != 3:
        raise ValueError(f"q must have shape (n_rows, n_head, d), got shape {q.shape}")
    if K.ndim != 3:
        raise ValueError(f"K must have shape (S, n_head_kv, d), got shape {K.shape}")
    check_real_array("q", q)
    check_real_array("K", K)
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
        check_real_array("V", V)
        if V.ndim != 3 or V.shape[0] != S or V.shape[1] != n_head_kv:
            raise ValueError(
                f"V must have shape (S={S}, n_head_kv={n_head_kv}, dv), got shape {V.shape}"
            )
        dv = V.shape[2]
    if mask is not None:
        mask = np.asarray(mask)
        check_real_array("mask", mask)
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
        check_real_array("vbar", vbar)
        if vbar.shape not in ((n_head_kv, dv), (n_rows, n_head_kv, dv)):
            raise ValueError(
                f"vbar must have shape (n_head_kv={n_head_kv}, dv={dv}) or "
                f"(n_rows={n_rows}, n_head_kv={n_head_kv}, dv={dv}), got shape {vbar.shape}"
            )
    dims = dict(n_rows=n_rows, n_head=n_head, d=d, S=S, n_head_kv=n_head_kv, dv=dv,
                g=n_head // n_head_kv)
    return q, K, V, mask, scale, vbar, dims


def check_r(r, d):
    r = as_int("r", r)
    if not 1 <= r <= d:
        raise ValueError(f"r must be in [1, d] = [1, {d}], got {r}")
    return r


def check_k_l(k, l):
    k = as_int("k", k)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    l = as_int("l", l)
    if not 0 <= l <= k:
        raise ValueError(f"l must be in [0, k] = [0, {k}], got {l}")
    return k, l


# --------------------------------------------------------------------------------------
# sparq_attention's options
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class IvfIndex:
    """The index selector's state: centroids (n_head_kv, n_list, d) and lists (n_head_kv, S),
    float64 copies (the lists gain the unassigned cells), n_probe, and the keys scored per row
    and KV head (-1: the row ran dense)."""
    centroids: np.ndarray
    lists: np.ndarray
    n_probe: int
    reads: np.ndarray


@dataclasses.dataclass
class SparqOptions:
    """sparq_attention's checked options. selector: "sparq" (steps 2-3 and mean-V), or one of
    the selectors without approximate scores: "streaming", "h2o", "index"."""
    r: int
    k: int
    l: int
    mean_v: bool
    selector: str
    q_sel: np.ndarray
    K_sel: np.ndarray
    comp_w: np.ndarray | None
    h2o_new: np.ndarray | None = None  # the H2O scores, accumulated over the rows
    h2o_in: np.ndarray | None = None  # the H2O scores every row chooses on
    ivf: IvfIndex | None = None
    topk_buckets: int = 0  # the approximate bucketed top-k's buckets, 0: exact


def sparq_options(dims, dt, q, K, *, r, k, l, i2, per_head, mean_v, oracle, q_sel, K_sel, comp_w,
                  streaming, h2o_scores, ivf, coverage=None, topk_buckets=0):
    """Check sparq_attention's options against each other and the inputs' dims (in this order,
    so the first problem is the one reported); return them as SparqOptions."""
    n_kv, d = dims["n_head_kv"], dims["d"]
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
    r = d if oracle else check_r(r, d)
    k, l = check_k_l(k, l)
    h2o_in = h2o_new = ivf_index = None
    if h2o:
        h2o_in = np.asarray(h2o_scores, dtype=np.float64)
        if h2o_in.shape != (dims["n_head_kv"], dims["S"]):
            raise ValueError(f"h2o_scores must have shape (n_head_kv, S) = {(dims['n_head_kv'], dims['S'])}")
        h2o_new = h2o_in.copy()
    if index:
        ivf_index = check_ivf(ivf, dims)
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
    selector = "streaming" if streaming else "h2o" if h2o else "index" if index else "sparq"
    topk_buckets = as_int("topk_buckets", topk_buckets)
    if topk_buckets:
        if topk_buckets < k:
            raise ValueError(f"topk_buckets must be 0 (the exact top-k) or >= k = {k}, got {topk_buckets}")
        if selector != "sparq":
            raise ValueError(f"topk_buckets ranks approximate scores: the {selector} selector takes none")
        if coverage is not None:
            raise ValueError("topk_buckets needs a fixed k: no coverage")
    return SparqOptions(r=r, k=k, l=l, mean_v=mean_v, selector=selector, q_sel=q_sel, K_sel=K_sel,
                        comp_w=comp_w, h2o_new=h2o_new, h2o_in=h2o_in, ivf=ivf_index, topk_buckets=topk_buckets)


def check_ivf(ivf, dims):
    """The index selector's argument (centroids, lists, n_probe) checked, as an IvfIndex."""
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
    return IvfIndex(centroids=cent, lists=lists, n_probe=n_probe, reads=ivf_reads)
