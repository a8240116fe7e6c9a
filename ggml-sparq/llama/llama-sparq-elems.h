// llama-sparq: the elements of the cache and of K^T on the host: their types and conversions
// (inline: the rebuild's, calibration's and training's loops use them).
#pragma once

#include "ggml-sparq-e5m2.h"
#include "ggml.h"

#include <cstdint>
#include <cstring>

// K^T's type for a K cache of type k with kt_bits bits: e5m2 in i8 for 8, the 4-bit K^T's q4_1 blocks
// along the cells for 4 (ggml-sparq-kt4.h), else the cache's (f16 for a quantized cache: its keys
// dequantized)
inline ggml_type sparq_kt_type(ggml_type k, int32_t kt_bits) {
    if (kt_bits == 8) {
        return GGML_TYPE_I8;
    }
    if (kt_bits == 4) {
        return GGML_TYPE_Q4_1;
    }
    return ggml_is_quantized(k) ? GGML_TYPE_F16 : k;
}

// one element of an f16 or f32 tensor row, or of an e5m2 K^T (i8), as f32
inline float sparq_elem_f32(const uint8_t * p, ggml_type t) {
    if (t == GGML_TYPE_I8) {
        return ggml_fp16_to_fp32(ggml_sparq_e5m2_to_f16(*p));
    }
    return t == GGML_TYPE_F16 ? ggml_fp16_to_fp32(*(const ggml_fp16_t *) p) : *(const float *) p;
}

// element o of a K^T row of type t set to x (e5m2: x rounded to f16, then to e5m2, as the appends do)
inline void sparq_kt_put(uint8_t * row, ggml_type t, size_t o, float x) {
    if (t == GGML_TYPE_I8) {
        row[o] = ggml_sparq_f16_to_e5m2(ggml_fp32_to_fp16(x));
    } else if (t == GGML_TYPE_F16) {
        ((ggml_fp16_t *) row)[o] = ggml_fp32_to_fp16(x);
    } else {
        ((float *) row)[o] = x;
    }
}

// n values of a cache row (f32, f16, or quantized blocks: dequantized) as f32 into out; a
// quantized row starts at a block (the offset of value i is ggml_row_size(t, i))
inline void sparq_row_f32(const void * row, ggml_type t, int64_t n, float * out) {
    if (t == GGML_TYPE_F32) {
        memcpy(out, row, (size_t) n * sizeof(float));
    } else {
        ggml_get_type_traits(t)->to_float(row, out, n);
    }
}
