"""The SparQ cost model of ``docs/algorithm.md``: what one decode step moves per KV head.

In elements (an f16 cache):

    dense:  M_dense = 2*S*d + 2*d            read K and V, write the new k and v
    SparQ:  M_sparq = S*r + 2*k*d + 4*d      read r rows of K^T, read k rows of K and of V,
                                             write k and v, read and write vbar
            (M_sparq = M_dense when S <= k: that step is exact dense attention)

In bytes, for a cache type (``kv_type``): a K or V element costs b_kv bytes (f16 2, f32 4, q8_0
34/32: a block of 32 int8 and an f16 scale), a K^T element b_t (2; 4 for an f32 cache: a q8_0
cache keeps K^T in f16; 1 with ``kt_bits=8``, an e5m2 K^T, whatever the cache; 20/32 with ``kt_bits=4``, a block of 32 cells in
20 bytes), vbar's 2*d at 2 bytes
each (the f16 element the model counted first):

    B_dense = (S + 1)*d*2*b_kv
    B_sparq = S*r*b_t + (k + 1)*d*2*b_kv + 4*d

``compression`` is B_sparq / B_dense, which for an f16 cache is M_sparq / M_dense exactly. With V's
head size ``dv`` unlike K's ``d`` (DeepSeek's heads, MLA's latent: K 576, V 512, V read again from K's
rows), each ``2*d`` above is ``d + dv`` and vbar's ``4*d`` is ``4*dv`` (``dv=None``: d).

``S`` may be a scalar or a NumPy array (e.g. a sweep over context lengths); the other
arguments are scalars. Scalars in give Python numbers out, arrays give arrays.
Report ``compression`` with every quality or speed figure.
"""

from __future__ import annotations

import operator

import numpy as np

# the package's own (the eval sets r and the cache type with them); re-exported here
from llama_sparq._sparq import cache_type_id, default_r

__all__ = [
    "m_dense",
    "m_sparq",
    "b_dense",
    "b_sparq",
    "compression",
    "attention_bound",
    "amdahl_bound",
    "bytes_moved",
    "CACHE_TYPES",
    "cache_type_id",
    "default_r",
]

# The K/V cache types SparQ runs on: ggml's type id, the bytes of a K or V element, of a K^T element.
CACHE_TYPES = {"f16": (cache_type_id("f16"), 2.0, 2.0), "f32": (cache_type_id("f32"), 4.0, 4.0),
               **{t: (cache_type_id(t), b / 32.0, 2.0) for t, b in
                  (("q8_0", 34), ("q4_0", 18), ("q4_1", 20), ("q5_0", 22), ("q5_1", 24), ("iq4_nl", 18))}}


# A 4-bit K^T element's bytes: a block of 32 cells is an f16 scale, an f16 offset and 16 bytes.
KT4_BYTES = 20.0 / 32.0


def _kv_type(kv_type, kt_bits=16):
    if kv_type not in CACHE_TYPES:
        raise ValueError(f"kv_type must be one of {', '.join(CACHE_TYPES)}, got {kv_type!r}")
    if kt_bits not in (4, 8, 16) or isinstance(kt_bits, bool):
        raise ValueError(f"kt_bits must be 4, 8 (e5m2) or 16, got {kt_bits!r}")
    type_id, b_kv, b_t = CACHE_TYPES[kv_type]
    return type_id, b_kv, {4: KT4_BYTES, 8: 1.0}.get(kt_bits, b_t)


def _int_param(name, value, lo, hi=None, hi_name=None):
    """Validate an integer parameter in [lo, hi]; raise ValueError naming it."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi_name or hi}] = [{lo}, {hi}]"
        raise ValueError(f"{name} must be {rng}, got {v}")
    return v


def _S_param(S):
    """S as an array (int or float) of finite values >= 0, and whether it was a scalar."""
    arr = np.asarray(S)
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer)
                                 or np.issubdtype(arr.dtype, np.floating)):
        raise ValueError(f"S must be a number or an array of numbers >= 0, got {S!r}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError("S must be finite and >= 0")
    return arr, arr.ndim == 0


def _out(x, scalar):
    return x.item() if scalar else x


def _dense(S, d):
    return 2 * S * d + 2 * d


def _sparq(S, d, r, k):
    return np.where(S <= k, _dense(S, d), S * r + 2 * k * d + 4 * d)


def m_dense(S, d):
    """Elements moved per KV head by one dense decode step: 2*S*d + 2*d."""
    S, scalar = _S_param(S)
    d = _int_param("d", d, 1)
    return _out(np.asarray(_dense(S, d)), scalar)


def m_sparq(S, d, r, k):
    """Elements moved per KV head by one SparQ decode step: S*r + 2*k*d + 4*d.

    Equal to m_dense(S, d) where S <= k (the step is then exact dense attention).
    """
    S, scalar = _S_param(S)
    d = _int_param("d", d, 1)
    r = _int_param("r", r, 1, d, "d")
    k = _int_param("k", k, 1)
    return _out(np.asarray(_sparq(S, d, r, k)), scalar)


def _b_dense(S, d, b_kv, dv):
    return (S + 1) * (d + dv) * b_kv


def _b_sparq(S, d, r, k, b_kv, b_t, dv):
    return np.where(S <= k, _b_dense(S, d, b_kv, dv), S * r * b_t + (k + 1) * (d + dv) * b_kv + 4 * dv)


def _dv_param(dv, d):
    return d if dv is None else _int_param("dv", dv, 1)


def b_dense(S, d, kv_type="f16", dv=None):
    """Bytes moved per KV head by one dense decode step with a ``kv_type`` cache: (S + 1)*(d + dv)*b_kv."""
    S, scalar = _S_param(S)
    d = _int_param("d", d, 1)
    dv = _dv_param(dv, d)
    _, b_kv, _ = _kv_type(kv_type)
    return _out(np.asarray(_b_dense(S, d, b_kv, dv), dtype=np.float64), scalar)


def b_sparq(S, d, r, k, kv_type="f16", kt_bits=16, dv=None):
    """Bytes moved per KV head by one SparQ decode step with a ``kv_type`` cache:
    S*r*b_t + (k + 1)*(d + dv)*b_kv + 4*dv (b_dense where S <= k); kt_bits=8: b_t = 1 (e5m2), 4: 20/32."""
    S, scalar = _S_param(S)
    d = _int_param("d", d, 1)
    r = _int_param("r", r, 1, d, "d")
    k = _int_param("k", k, 1)
    dv = _dv_param(dv, d)
    _, b_kv, b_t = _kv_type(kv_type, kt_bits)
    return _out(np.asarray(_b_sparq(S, d, r, k, b_kv, b_t, dv), dtype=np.float64), scalar)


def compression(S, d, r, k, kv_type="f16", kt_bits=16, dv=None):
    """Compression ratio B_sparq / B_dense, the bytes of a ``kv_type`` cache (1.0 where S <= k); for
    f16 it is M_sparq / M_dense. kt_bits=8: K^T in e5m2, 1 byte an element; 4: 20/32. dv: V's head size (d)."""
    S, scalar = _S_param(S)
    d = _int_param("d", d, 1)
    r = _int_param("r", r, 1, d, "d")
    k = _int_param("k", k, 1)
    dv = _dv_param(dv, d)
    _, b_kv, b_t = _kv_type(kv_type, kt_bits)
    return _out(np.asarray(_b_sparq(S, d, r, k, b_kv, b_t, dv) / _b_dense(S, d, b_kv, dv), dtype=np.float64),
                scalar)


def attention_bound(S, d, r, k, kv_type="f16", kt_bits=16, dv=None):
    """Bound on the attention speedup when bandwidth bound: B_dense / B_sparq."""
    c = compression(S, d, r, k, kv_type, kt_bits, dv)
    return 1.0 / c if np.ndim(c) == 0 else 1.0 / np.asarray(c)


def amdahl_bound(z, compression):
    """End-to-end speedup bound 1 / ((1 - z) + z * compression).

    z: share of decode time spent in attention, in [0, 1] (scalar or array).
    compression: M_sparq / M_dense, > 0 (scalar or array).
    """
    za = np.asarray(z, dtype=np.float64)
    ca = np.asarray(compression, dtype=np.float64)
    if not np.all(np.isfinite(za)) or np.any(za < 0) or np.any(za > 1):
        raise ValueError(f"z must be in [0, 1], got {z!r}")
    if not np.all(np.isfinite(ca)) or np.any(ca <= 0):
        raise ValueError(f"compression must be a finite number > 0, got {compression!r}")
    res = 1.0 / ((1.0 - za) + za * ca)
    return _out(res, res.ndim == 0)


def bytes_moved(S, d, r, k, elem_bytes, n_head_kv, sparq=True):
    """Bytes moved by one decode step of one layer for one sequence.

    = elements per KV head (m_sparq if sparq else m_dense) * elem_bytes * n_head_kv.
    elem_bytes may be fractional (e.g. 34/32 for Q8_0 blocks); it must be > 0.
    """
    try:
        eb = float(elem_bytes)
    except (TypeError, ValueError):
        raise ValueError(f"elem_bytes must be a number > 0, got {elem_bytes!r}") from None
    if not (np.isfinite(eb) and eb > 0):
        raise ValueError(f"elem_bytes must be a number > 0, got {elem_bytes!r}")
    n_head_kv = _int_param("n_head_kv", n_head_kv, 1)
    if not isinstance(sparq, (bool, np.bool_)):
        raise ValueError(f"sparq must be a bool, got {sparq!r}")
    m_s = m_sparq(S, d, r, k)  # validates S, d, r and k in both cases
    m = m_s if sparq else m_dense(S, d)
    return m * eb * n_head_kv
