// llama-sparq: the 4-bit K^T's blocks and the one write that keeps them (kt_bits = 4). Plain C with
// <stdint.h> only, so that the CPU kernels, CUDA (host and device), the CUDA emulator and the llama
// upkeep share it.
#pragma once

#include <stdint.h>

#if !defined(GGML_SPARQ_HD)
#if defined(__CUDACC__)
#define GGML_SPARQ_HD __host__ __device__
#else
#define GGML_SPARQ_HD
#endif
#endif

// A 4-bit K^T (GGML_TYPE_Q4_1) cuts each of its rows (one component of one KV head, over the cells)
// into blocks of 32 cells from cell 0. A block has one scale s = 2^e, the smallest power of two with
// every value x of the block in [-8 s, 8 s) (e in E_MIN..E_MAX); x is kept as its bin
// k = floor(x / s) in -8..7 and reads as the bin's midpoint (k + 1/2) s. The block is ggml's q4_1
// (f16 d = s, f16 m = -7.5 s, nibble q = k + 8: value q d + m), so any q4_1 reader reads it.
//
// Why these bins: the bins of 2 s are unions of two bins of s (floor(floor(x / s) / 2) ==
// floor(x / 2s)). A write whose value needs a larger scale shifts the block's other bins right and
// gets exactly the bins that rounding the whole block at the new scale gives, so the row never
// depends on the order its cells were written in: an append one cell at a time, a ubatch's append
// and a rebuild of the block from the keys agree bit for bit (and the scale is never too small for
// a value the block holds). A block of zero bytes (d == 0) is one no write has reached yet.
// A value is rounded to f16 first, as an f16 K^T holds it; Inf saturates, NaN reads as the 0 bin.
#define GGML_SPARQ_KT4_CELLS 32
#define GGML_SPARQ_KT4_BYTES 20   // a block: f16 d, f16 m, 16 bytes of nibbles (cell j low, j + 16 high)
#define GGML_SPARQ_KT4_E_MIN (-23) // d and m = -7.5 d stay f16 (subnormal) values
#define GGML_SPARQ_KT4_E_MAX 13    // 8 * 2^13 = 65536 holds every finite f16

// the smallest e (E_MIN..E_MAX) with the f16 h's value in [-8 2^e, 8 2^e)
static inline GGML_SPARQ_HD int ggml_sparq_kt4_exp(uint16_t h) {
    const int ex = (h >> 10) & 0x1F;
    const uint32_t man = h & 0x3FFu;
    if (ex == 0x1F || (ex == 0 && man == 0)) {
        return GGML_SPARQ_KT4_E_MIN; // Inf and NaN take the block's scale; zeros the smallest
    }
    int fl = ex - 15;    // floor(log2 |x|)
    int pow2 = man == 0; // |x| a power of two
    if (ex == 0) {       // a subnormal: man * 2^-24
        fl = -24;
        for (uint32_t m = man >> 1; m; m >>= 1) {
            ++fl;
        }
        pow2 = (man & (man - 1)) == 0;
    }
    // x > 0 needs 2^(e+3) > x, x < 0 needs 2^(e+3) >= -x
    const int e = (h & 0x8000) && pow2 ? fl - 3 : fl - 2;
    return e < GGML_SPARQ_KT4_E_MIN ? GGML_SPARQ_KT4_E_MIN : e > GGML_SPARQ_KT4_E_MAX ? GGML_SPARQ_KT4_E_MAX : e;
}

// the bin floor(x / 2^e) of the f16 h (e no smaller than ggml_sparq_kt4_exp(h)), -8..7, in integers
static inline GGML_SPARQ_HD int ggml_sparq_kt4_bin(uint16_t h, int e) {
    const int ex = (h >> 10) & 0x1F;
    const uint32_t man = h & 0x3FFu;
    if (ex == 0x1F) {
        return man ? 0 : (h & 0x8000) ? -8 : 7;
    }
    const uint32_t M = ex ? (man | 0x400u) : man;   // |x| = M 2^E
    const int sh = e - (ex ? ex - 25 : -24);         // > 0: |x| < 8 2^e and M >= 2^10 for a normal
    const int k = (h & 0x8000) ? (sh >= 16 ? -(int) (M != 0) : -(int) ((M + (1u << sh) - 1u) >> sh))
                               : (sh >= 16 ? 0 : (int) (M >> sh));
    return k < -8 ? -8 : k > 7 ? 7 : k;
}

// the f16 bits of 2^e and of -7.5 * 2^e (E_MIN <= e <= E_MAX)
static inline GGML_SPARQ_HD uint16_t ggml_sparq_kt4_d(int e) {
    return (uint16_t) (e >= -14 ? (e + 15) << 10 : 1 << (e + 24));
}
static inline GGML_SPARQ_HD uint16_t ggml_sparq_kt4_m(int e) {
    return (uint16_t) (0x8000 | (e >= -16 ? ((e + 17) << 10) | 0x380 : 15 << (e + 23)));
}

// the e of a block's d (the f16 bits of 2^e, not 0)
static inline GGML_SPARQ_HD int ggml_sparq_kt4_exp_of_d(uint16_t d) {
    if (d & 0x7C00) {
        return ((d >> 10) & 0x1F) - 15;
    }
    int e = -24;
    for (uint32_t m = d >> 1; m; m >>= 1) {
        ++e;
    }
    return e;
}

// floor(k / 2^sh) for a bin k in -8..7
static inline GGML_SPARQ_HD int ggml_sparq_kt4_shift(int k, int sh) {
    return sh >= 4 ? (k < 0 ? -1 : 0) : (k >= 0 ? k >> sh : -((-k + (1 << sh) - 1) >> sh));
}

// cell c of a 4-bit K^T row (its blocks from `row`) set to the f16 h: the block's scale raised to
// h's where h needs more (the block's other bins shifted to it), then h's bin written. One writer
// per block at a time
static inline GGML_SPARQ_HD void ggml_sparq_kt4_put(uint8_t * row, int64_t c, uint16_t h) {
    uint8_t * b = row + (c / GGML_SPARQ_KT4_CELLS) * GGML_SPARQ_KT4_BYTES;
    uint8_t * qs = b + 4;
    const int j = (int) (c % GGML_SPARQ_KT4_CELLS);
    const uint16_t d = (uint16_t) (b[0] | (b[1] << 8));
    int e = ggml_sparq_kt4_exp(h);
    if (d == 0) {
        for (int i = 0; i < 16; ++i) {
            qs[i] = 0x88; // the bins of the block's unwritten cells: 0, as a rebuild of zero keys gives
        }
    } else {
        const int e0 = ggml_sparq_kt4_exp_of_d(d);
        if (e > e0) {
            for (int i = 0; i < 16; ++i) {
                const int lo = ggml_sparq_kt4_shift((qs[i] & 0x0F) - 8, e - e0) + 8;
                const int hi = ggml_sparq_kt4_shift((qs[i] >> 4) - 8, e - e0) + 8;
                qs[i] = (uint8_t) (lo | (hi << 4));
            }
        } else {
            e = e0;
        }
    }
    const uint16_t nd = ggml_sparq_kt4_d(e), nm = ggml_sparq_kt4_m(e);
    b[0] = (uint8_t) nd; b[1] = (uint8_t) (nd >> 8);
    b[2] = (uint8_t) nm; b[3] = (uint8_t) (nm >> 8);
    const uint8_t q = (uint8_t) (ggml_sparq_kt4_bin(h, e) + 8);
    qs[j & 15] = j < 16 ? (uint8_t) ((qs[j & 15] & 0xF0) | q) : (uint8_t) ((qs[j & 15] & 0x0F) | (q << 4));
}

// a whole block from the f16 values h[0..31] of its cells: the bytes the puts of those values leave,
// in any order, in a block no put had reached (a rebuild's write)
static inline GGML_SPARQ_HD void ggml_sparq_kt4_block(uint8_t * b, const uint16_t * h) {
    int e = GGML_SPARQ_KT4_E_MIN;
    for (int i = 0; i < GGML_SPARQ_KT4_CELLS; ++i) {
        const int ei = ggml_sparq_kt4_exp(h[i]);
        e = ei > e ? ei : e;
    }
    const uint16_t nd = ggml_sparq_kt4_d(e), nm = ggml_sparq_kt4_m(e);
    b[0] = (uint8_t) nd; b[1] = (uint8_t) (nd >> 8);
    b[2] = (uint8_t) nm; b[3] = (uint8_t) (nm >> 8);
    for (int i = 0; i < 16; ++i) {
        b[4 + i] = (uint8_t) ((ggml_sparq_kt4_bin(h[i], e) + 8) | ((ggml_sparq_kt4_bin(h[i + 16], e) + 8) << 4));
    }
}

// the bin (q, 0..15) of cell c of a 4-bit K^T row, and its block's d and m bits: the value is q d + m
static inline GGML_SPARQ_HD int ggml_sparq_kt4_q(const uint8_t * row, int64_t c, uint16_t * d, uint16_t * m) {
    const uint8_t * b = row + (c / GGML_SPARQ_KT4_CELLS) * GGML_SPARQ_KT4_BYTES;
    const int j = (int) (c % GGML_SPARQ_KT4_CELLS);
    *d = (uint16_t) (b[0] | (b[1] << 8));
    *m = (uint16_t) (b[2] | (b[3] << 8));
    return j < 16 ? b[4 + j] & 0x0F : b[4 + j - 16] >> 4;
}
