"""The 4-bit K^T (``kt_bits=4``): its rounding and its bytes (ggml-sparq/include/ggml-sparq-kt4.h).

Each K^T row (one component of one KV head, over the cells) is cut into blocks of 32 cells, aligned
at cell 0. A block has one scale s = 2^e, the smallest power of two with every value x of the block
in [-8 s, 8 s) (e in [KT4_E_MIN, KT4_E_MAX]); a value is held as its bin k = floor(x / s) in -8..7
and reads as the bin's midpoint (k + 1/2) s. Because the bins of 2 s are unions of two bins of s,
floor(floor(x / s) / 2) = floor(x / (2 s)): an append that raises a block's scale shifts the block's
other bins right and gets exactly the bins a rounding of the whole block at the new scale gives, so
the row never depends on the order its cells were written in. The block is stored as ggml's q4_1
(f16 d = s, f16 m = -7.5 s, 16 bytes of nibbles q = k + 8: value q d + m), so any q4_1 reader reads it.
"""

from __future__ import annotations

import numpy as np

KT4_BLOCK = 32
KT4_E_MIN = -23  # the smallest scale whose d and m = -7.5 d are still f16 (subnormal) values
KT4_E_MAX = 13   # 8 * 2^13 = 65536 covers every finite f16


def _kt4_exponents(x):
    """Each value's own smallest e with x in [-8 2^e, 8 2^e) (x float32 of f16 values)."""
    ax = np.abs(x).astype(np.float64)
    m, p = np.frexp(ax)                                   # |x| = m 2^p, m in [0.5, 1)
    e = np.where(x < 0, np.where(m == 0.5, p - 1, p), p) - 3
    e = np.where((ax == 0) | ~np.isfinite(ax), KT4_E_MIN, e)
    return np.clip(e, KT4_E_MIN, KT4_E_MAX).astype(np.int32)


def kt4_encode(x, axis=0):
    """x's blocks along ``axis`` (the cells; padded with zeros to a multiple of 32): (e, k), e per
    block (the axis' length / 32 along it) and k per value (-8..7), as the appends and the rebuild
    write them. x is rounded to f16 first, as an f16 K^T and the appends round."""
    x = np.moveaxis(np.asarray(x, np.float32).astype(np.float16).astype(np.float32), axis, 0)
    S = x.shape[0]
    pad = (-S) % KT4_BLOCK
    if pad:
        x = np.concatenate([x, np.zeros((pad,) + x.shape[1:], np.float32)])
    B = x.reshape((-1, KT4_BLOCK) + x.shape[1:])
    e = _kt4_exponents(B).max(axis=1)                     # (n_blocks, ...)
    s = np.ldexp(1.0, e)[:, None]
    with np.errstate(invalid="ignore"):
        k = np.floor(np.nan_to_num(B, nan=0.0) / s)
    k = np.clip(k, -8, 7).astype(np.int8).reshape(x.shape)[:S]
    return np.moveaxis(e, 0, axis), np.moveaxis(k, 0, axis)


def round_kt4(x, axis=0):
    """x as a 4-bit K^T holds it (float32), blocks of 32 along ``axis`` (the cells)."""
    e, k = kt4_encode(x, axis)
    S = np.shape(x)[axis]
    s = np.repeat(np.ldexp(1.0, np.moveaxis(e, axis, 0)), KT4_BLOCK, axis=0)[:S]
    return np.moveaxis((np.moveaxis(k, axis, 0) + 0.5) * s, 0, axis).astype(np.float32)


def kt4_row_bytes(row):
    """One K^T row (n cells, a multiple of 32) as the 4-bit K^T stores it: q4_1 blocks of 20 bytes
    (f16 d, f16 m, 16 bytes: byte j holds cell j in its low nibble and cell j + 16 in its high)."""
    row = np.asarray(row)
    if row.ndim != 1 or row.size % KT4_BLOCK:
        raise ValueError(f"kt4_row_bytes: a row of a multiple of {KT4_BLOCK} cells expected, got {row.shape}")
    e, k = kt4_encode(row)
    s = np.ldexp(1.0, e)
    q = (k.reshape(-1, KT4_BLOCK) + 8).astype(np.uint8)
    out = np.empty((e.size, 20), np.uint8)
    out[:, 0:2] = s.astype(np.float16)[:, None].view(np.uint8)
    out[:, 2:4] = (-7.5 * s).astype(np.float16)[:, None].view(np.uint8)
    out[:, 4:] = q[:, :16] | (q[:, 16:] << 4)
    return out.tobytes()
