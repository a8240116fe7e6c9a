// llama-sparq: K and V rows in ggml's 4- and 5-bit blocks (q4_0, q4_1, q5_0, q5_1, iq4_nl). One path
// for all of them: a block's values dequantized into the stack as ggml's dequantize_row_* makes them
// (the same products and sums in f32), a chunk of blocks at a time, then the ISA's f32 primitives.
// Only the chosen rows are read this way, so the dequantization is a small part of a step.

#include "sparq-cpu.h"

#include <algorithm>
#include <cstring>

namespace {

constexpr int H = SPARQ_QK / 2; // a byte of qs holds value j (low nibble) and value j + 16 (high)

inline float f16_at(const uint8_t * p) {
    uint16_t h;
    memcpy(&h, p, sizeof(h));
    return sparq_fp16_to_fp32(h);
}

// q4_0: f16 d, then value j = ((nibble j) - 8) * d
void dequant_q4_0(const void * blk, float * y) {
    const uint8_t * b = (const uint8_t *) blk;
    const float d = f16_at(b);
    const uint8_t * qs = b + 2;
    for (int j = 0; j < H; ++j) {
        y[j]     = (float) ((qs[j] & 0x0F) - 8) * d;
        y[j + H] = (float) ((qs[j] >> 4) - 8) * d;
    }
}

// q4_1: f16 d, f16 m, then value j = nibble j * d + m
void dequant_q4_1(const void * blk, float * y) {
    const uint8_t * b = (const uint8_t *) blk;
    const float d = f16_at(b), m = f16_at(b + 2);
    const uint8_t * qs = b + 4;
    for (int j = 0; j < H; ++j) {
        y[j]     = (float) (qs[j] & 0x0F) * d + m;
        y[j + H] = (float) (qs[j] >> 4) * d + m;
    }
}

// the fifth bits of q5_0 and q5_1: bit j of the 32-bit qh is value j's
inline uint32_t qh_at(const uint8_t * p) {
    uint32_t qh;
    memcpy(&qh, p, sizeof(qh));
    return qh;
}

// q5_0: f16 d, qh, then value j = ((nibble j | fifth bit << 4) - 16) * d
void dequant_q5_0(const void * blk, float * y) {
    const uint8_t * b = (const uint8_t *) blk;
    const float d = f16_at(b);
    const uint32_t qh = qh_at(b + 2);
    const uint8_t * qs = b + 6;
    for (int j = 0; j < H; ++j) {
        const int x0 = (int) ((qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10)) - 16;
        const int x1 = (int) ((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
        y[j]     = (float) x0 * d;
        y[j + H] = (float) x1 * d;
    }
}

// q5_1: f16 d, f16 m, qh, then value j = (nibble j | fifth bit << 4) * d + m
void dequant_q5_1(const void * blk, float * y) {
    const uint8_t * b = (const uint8_t *) blk;
    const float d = f16_at(b), m = f16_at(b + 2);
    const uint32_t qh = qh_at(b + 4);
    const uint8_t * qs = b + 8;
    for (int j = 0; j < H; ++j) {
        const int x0 = (int) ((qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10));
        const int x1 = (int) ((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10));
        y[j]     = (float) x0 * d + m;
        y[j + H] = (float) x1 * d + m;
    }
}

// iq4_nl: f16 d, then value j = d * table[nibble j] (ggml's kvalues_iq4nl, a non-linear grid)
const int8_t IQ4_NL_VALUES[16] = { -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113 };

void dequant_iq4_nl(const void * blk, float * y) {
    const uint8_t * b = (const uint8_t *) blk;
    const float d = f16_at(b);
    const uint8_t * qs = b + 2;
    for (int j = 0; j < H; ++j) {
        y[j]     = d * (float) IQ4_NL_VALUES[qs[j] & 0x0F];
        y[j + H] = d * (float) IQ4_NL_VALUES[qs[j] >> 4];
    }
}

// values dequantized per pass: 8 blocks (1 KiB of stack), a whole row for head sizes up to 256
constexpr int CHUNK = 8 * SPARQ_QK;

// values [i0, i0 + m) of a row of a 4- or 5-bit type into buf
inline void dequant_chunk(sparq_dequant_fn f, size_t bb, const uint8_t * row, int i0, int m, float * buf) {
    for (int b = 0; b < m / SPARQ_QK; ++b) {
        f(row + (size_t) (i0 / SPARQ_QK + b) * bb, buf + b * SPARQ_QK);
    }
}

} // namespace

sparq_dequant_fn sparq_dequant_of(sparq_type t) {
    switch (t) {
        case SPARQ_Q4_0:   return dequant_q4_0;
        case SPARQ_Q4_1:   return dequant_q4_1;
        case SPARQ_Q5_0:   return dequant_q5_0;
        case SPARQ_Q5_1:   return dequant_q5_1;
        case SPARQ_IQ4_NL: return dequant_iq4_nl;
        default:           return nullptr;
    }
}

void sparq_row_to_f32(const sparq_isa * isa, sparq_type t, const void * row, float * y, int n) {
    if (t == SPARQ_F32) {
        memcpy(y, row, (size_t) n * sizeof(float));
    } else if (t == SPARQ_F16) {
        isa->f16_to_f32((const uint16_t *) row, y, n);
    } else if (t == SPARQ_Q8_0) {
        std::fill(y, y + n, 0.0f); // 0 + 1 * value: the dequantized value, exactly
        isa->axpy_q8_0(y, (const sparq_block_q8_0 *) row, 1.0f, n);
    } else {
        const sparq_dequant_fn f = sparq_dequant_of(t);
        const size_t bb = sparq_block_bytes(t);
        for (int b = 0; b < n / SPARQ_QK; ++b) {
            f((const uint8_t *) row + (size_t) b * bb, y + b * SPARQ_QK);
        }
    }
}

// each chunk of a row's values as f32: body(i0, values, m) for the CHUNK-sized pieces in order
template <typename Body>
static void for_each_chunk(sparq_type t, const void * row, int n, Body body) {
    const sparq_dequant_fn f = sparq_dequant_of(t);
    const size_t bb = sparq_block_bytes(t);
    float buf[CHUNK];
    for (int i0 = 0; i0 < n; i0 += CHUNK) {
        const int m = std::min(CHUNK, n - i0);
        dequant_chunk(f, bb, (const uint8_t *) row, i0, m, buf);
        body(i0, buf, m);
    }
}

void sparq_dot_blocks_g(const sparq_isa * isa, sparq_type t, const float * const * q, int g, const void * row, int n,
                        float * out, size_t ostride) {
    for_each_chunk(t, row, n, [&](int i0, const float * buf, int m) {
        for (int h = 0; h < g; ++h) {
            const float s = isa->dot_f32(q[h] + i0, buf, m);
            out[h * ostride] = i0 == 0 ? s : out[h * ostride] + s;
        }
    });
}

void sparq_axpy_blocks_g(const sparq_isa * isa, sparq_type t, float * y, size_t ystride, int g, const void * row,
                         const float * p, size_t pstride, int n) {
    for_each_chunk(t, row, n, [&](int i0, const float * buf, int m) {
        for (int h = 0; h < g; ++h) {
            isa->axpy_f32(y + h * ystride + i0, buf, p[h * pstride], m);
        }
    });
}
