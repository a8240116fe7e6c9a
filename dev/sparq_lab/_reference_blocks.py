"""ggml's quantized block formats of a K/V cache in NumPy: q8_0, q4_0, q4_1, q5_0, q5_1 and iq4_nl.

Each block holds 32 values. ``quantize_blocks`` makes a block array (..., n / 32, bytes per block,
uint8, ggml's memory layout) from float values along the last axis; ``dequantize_blocks`` gives their
values as ggml's ``dequantize_row_*`` does (float32: the same products and sums in f32).

The quantizers of q8_0, q4_0, q4_1, q5_0 and q5_1 are ggml's reference ones (``quantize_row_*_ref``,
byte for byte). iq4_nl's is simpler than ggml's (which searches the scale): the scale is the block's
signed extreme over the table's -127 and each value takes the nearest table entry, so its blocks are
valid iq4_nl blocks though not always the ones ggml would make.
"""

from __future__ import annotations

import numpy as np

QK = 32
# bytes per block of each type (ggml's block_* structs)
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24, "iq4_nl": 18}
BLOCK_TYPES = tuple(BLOCK_BYTES)
IQ4_NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)


def _check_type(kv_type):
    if kv_type not in BLOCK_BYTES:
        raise ValueError(f"kv_quant must be None or one of {BLOCK_TYPES}, got {kv_type!r}")


def _blocks_of(x, kv_type):
    x = np.asarray(x, dtype=np.float32)
    if x.ndim < 1 or x.shape[-1] % QK:
        raise ValueError(f"{kv_type}: the last axis must be a multiple of {QK} values, got shape {x.shape}")
    return x.reshape(*x.shape[:-1], x.shape[-1] // QK, QK)


def _f16_bytes(v):
    return np.asarray(v, np.float32).astype(np.float16)[..., None].view(np.uint8)


def _inv(d):
    with np.errstate(divide="ignore"):
        return np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)


def _signed_extreme(b):
    """Per block the value of largest magnitude, with its sign (the first such, as ggml's loop)."""
    i = np.argmax(np.abs(b), axis=-1)
    return np.take_along_axis(b, i[..., None], axis=-1)[..., 0]


def _pack_nibbles(q):
    """32 values of 0..15 per block: byte j holds value j (low nibble) and value j + 16 (high)."""
    q = q.astype(np.uint8)
    return (q[..., :16] & 0x0F) | ((q[..., 16:] & 0x0F) << 4)


def _fifth_bits(q):
    """The fifth bits of 32 values of 0..31 as ggml's qh: bit j of a little-endian u32 is value j's."""
    bits = ((q.astype(np.uint32) >> 4) & 1) << np.arange(QK, dtype=np.uint32)
    return np.bitwise_or.reduce(bits, axis=-1).astype("<u4")[..., None].view(np.uint8)


def _trunc_i8(v):
    """C's (int8_t) of a float: toward zero."""
    return np.trunc(v).astype(np.int32)


def quantize_blocks(x, kv_type):
    """ggml's blocks of ``x`` along its last axis (a multiple of 32): uint8 (..., n / 32, bytes per block)."""
    _check_type(kv_type)
    b = _blocks_of(x, kv_type)
    if kv_type == "q8_0":
        d = (np.max(np.abs(b), axis=-1) / np.float32(127)).astype(np.float32)
        x0 = (b * _inv(d)[..., None]).astype(np.float32).astype(np.float64)
        qs = (np.sign(x0) * np.floor(np.abs(x0) + 0.5)).astype(np.int8)
        return np.concatenate([_f16_bytes(d), qs.view(np.uint8)], axis=-1)
    if kv_type in ("q4_0", "q5_0"):
        n = 8 if kv_type == "q4_0" else 16
        d = (_signed_extreme(b) / np.float32(-n)).astype(np.float32)
        v = (b * _inv(d)[..., None]).astype(np.float32) + np.float32(n + 0.5)
        q = np.minimum(2 * n - 1, _trunc_i8(v.astype(np.float32)))
        parts = [_f16_bytes(d)] + ([_fifth_bits(q)] if kv_type == "q5_0" else []) + [_pack_nibbles(q)]
        return np.concatenate(parts, axis=-1)
    if kv_type in ("q4_1", "q5_1"):
        top = 15 if kv_type == "q4_1" else 31
        mn, mx = b.min(axis=-1), b.max(axis=-1)
        d = ((mx - mn) / np.float32(top)).astype(np.float32)
        v = ((b - mn[..., None]).astype(np.float32) * _inv(d)[..., None]).astype(np.float32) + np.float32(0.5)
        q = _trunc_i8(v.astype(np.float32))
        q = np.minimum(top, q) if kv_type == "q4_1" else q.astype(np.uint8).astype(np.int32)
        parts = [_f16_bytes(d), _f16_bytes(mn)] + ([_fifth_bits(q)] if kv_type == "q5_1" else []) + [_pack_nibbles(q)]
        return np.concatenate(parts, axis=-1)
    # iq4_nl: d = signed extreme / -127 (the table's end), each value the nearest entry of d * table
    d = (_signed_extreme(b) / np.float32(-127)).astype(np.float32)
    d16 = d.astype(np.float16).astype(np.float32)
    grid = d16[..., None, None] * IQ4_NL_VALUES.astype(np.float32)  # (..., nb, 1, 16)
    q = np.argmin(np.abs(b[..., None] - grid), axis=-1)
    return np.concatenate([_f16_bytes(d), _pack_nibbles(q)], axis=-1)


def _f16_at(blocks, o):
    return blocks[..., o:o + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs):
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int32)


def _with_fifth(blocks, o, q):
    qh = blocks[..., o:o + 4].copy().view("<u4")[..., 0].astype(np.uint32)
    return q | (((qh[..., None] >> np.arange(QK, dtype=np.uint32)) & 1) << 4).astype(np.int32)


def dequantize_blocks(blocks, kv_type):
    """The values of ggml blocks (uint8 (..., nb, bytes per block)) as float32 (..., nb * 32)."""
    _check_type(kv_type)
    blocks = np.asarray(blocks, np.uint8)
    if blocks.shape[-1] != BLOCK_BYTES[kv_type]:
        raise ValueError(f"{kv_type}: blocks of {BLOCK_BYTES[kv_type]} bytes expected, got {blocks.shape[-1]}")
    d = _f16_at(blocks, 0)[..., None]
    if kv_type == "q8_0":
        y = blocks[..., 2:].view(np.int8).astype(np.float32) * d
    elif kv_type == "q4_0":
        y = (_nibbles(blocks[..., 2:]) - 8).astype(np.float32) * d
    elif kv_type == "q4_1":
        y = _nibbles(blocks[..., 4:]).astype(np.float32) * d + _f16_at(blocks, 2)[..., None]
    elif kv_type == "q5_0":
        y = (_with_fifth(blocks, 2, _nibbles(blocks[..., 6:])) - 16).astype(np.float32) * d
    elif kv_type == "q5_1":
        y = _with_fifth(blocks, 4, _nibbles(blocks[..., 8:])).astype(np.float32) * d + _f16_at(blocks, 2)[..., None]
    else:
        y = d * IQ4_NL_VALUES[_nibbles(blocks[..., 2:])].astype(np.float32)
    y = y.astype(np.float32)
    return y.reshape(*y.shape[:-2], y.shape[-2] * QK)
