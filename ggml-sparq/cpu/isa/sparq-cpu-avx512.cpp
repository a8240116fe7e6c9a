// llama-sparq: AVX-512 (F, BW, VL, DQ) + F16C SparQ primitives. The loops with a reduction run
// masked tails (no scalar remainder; other lanes, so other sums) and are AVX-512's own, as are the
// compress-based filter and the gather; the exp, the approximate scores (per lane the same
// operations whatever W) and the g-head gathers' passes over the heads come from the vector layer
// (sparq-isa-simd.h).
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c; only
// called when the CPU has them (sparq_isa_select).

#include "sparq-cpu.h"

#if defined(__x86_64__) || defined(_M_X64)

#include "sparq-isa-simd.h"

#include <immintrin.h>
#include <algorithm>
#include <cmath>

namespace {

inline __mmask16 tail_mask(int rem) {
    return rem >= 16 ? (__mmask16) 0xffff : rem > 0 ? (__mmask16) ((1u << rem) - 1) : (__mmask16) 0;
}

// the lanes of mask m of 16 floats or 16 halves (to f32); the others 0
inline __m512 load(const uint16_t * p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

// 16 e5m2 bytes: each the upper byte of an f16
inline __m512 load(const uint8_t * p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, p)), 8));
}

inline __m512 load(const float * p, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, p);
}

// 16 whole lanes (the halves through the same masked load)
inline __m512 load_full(const uint16_t * p) { return load(p, 0xffff); }
inline __m512 load_full(const float * p)    { return _mm512_loadu_ps(p); }

// the vector layer's wrappers that simd_exp and the approximate scores need (16 floats, a mask
// register per compare)
struct avx512_vec {
    typedef __m512 vf;
    typedef __mmask16 vmask;
    static constexpr int W = 16;
    static constexpr int REGS = 32; // vector registers
    static inline vf zero()                              { return _mm512_setzero_ps(); }
    static inline vf set1(float x)                       { return _mm512_set1_ps(x); }
    static inline vf load(const float * p)               { return _mm512_loadu_ps(p); }
    static inline vf load(const uint16_t * p)            { return load_full(p); }
    static inline vf load(const uint8_t * p)             { return ::load(p, (__mmask16) 0xffff); }
    static inline void prefetch(const void * p)          { _mm_prefetch((const char *) p, _MM_HINT_T0); }
    static inline void store(float * p, vf v)            { _mm512_storeu_ps(p, v); }
    static inline float half(uint16_t h)                 { return _cvtsh_ss(h); }
    // a block's 16 bin midpoints (q - 7.5) d, exact as q d + m is (d a power of two), looked up by
    // nibble: one permute per 16 cells instead of simd_kt4_q4_block's conversion and multiply-add
    static inline void kt4_block(const uint8_t * blk, vf * x) {
        const vf mid = _mm512_setr_ps(-7.5f, -6.5f, -5.5f, -4.5f, -3.5f, -2.5f, -1.5f, -0.5f,
                                      0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f, 6.5f, 7.5f);
        // d (with m beside it) loaded as 8 pairs and converted at once: d in the even lanes
        const vf dm = _mm512_cvtph_ps(_mm256_castps_si256(_mm256_broadcast_ss((const float *) blk)));
        const vf tbl = _mm512_mul_ps(mid, _mm512_moveldup_ps(dm));
        const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *) (blk + 4)));
        x[0] = _mm512_permutexvar_ps(q, tbl); // (the permute reads an index's low 4 bits)
        x[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), tbl);
    }
    static constexpr int KT4_GROUPS = 1;
    static inline void kt4_group(const uint8_t * blk, int, vf * x) { kt4_block(blk, x); }
    static constexpr int kt4_cell(int, int v) { return v * W; }
    static inline vf add(vf a, vf b)                     { return _mm512_add_ps(a, b); }
    static inline vf mul(vf a, vf b)                     { return _mm512_mul_ps(a, b); }
    static inline vf min(vf a, vf b)                     { return _mm512_min_ps(a, b); }
    static inline vf max(vf a, vf b)                     { return _mm512_max_ps(a, b); }
    static inline vf fmadd(vf a, vf b, vf c)             { return _mm512_fmadd_ps(a, b, c); }
    static inline vf fnmadd(vf a, vf b, vf c)            { return _mm512_fnmadd_ps(a, b, c); }
    static inline vf round(vf x)                         { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
    static inline vf pow2i(vf n) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
    }
    static inline vmask lt(vf a, vf b)                   { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
    static inline vf zero_where(vmask m, vf x)           { return _mm512_maskz_mov_ps((__mmask16) ~m, x); }
};

inline __m512 exp_ps(__m512 x) { return simd_exp<avx512_vec>(x); }

void avx512_approx_f16(const uint16_t * const * rows, int r, const float * qs, int g, int n, float * out) {
    simd_approx<avx512_vec>(rows, r, qs, g, n, out);
}

void avx512_approx_f32(const float * const * rows, int r, const float * qs, int g, int n, float * out) {
    simd_approx<avx512_vec>(rows, r, qs, g, n, out);
}

void avx512_approx_e5m2(const uint8_t * const * rows, int r, const float * qs, int g, int n, float * out) {
    simd_approx<avx512_vec>(rows, r, qs, g, n, out);
}

void avx512_approx_kt4(const uint8_t * const * rows, int c0, int r, const float * qs, int g, int n, float * out) {
    simd_approx_kt4<avx512_vec>(rows, c0, r, qs, g, n, out);
}

float avx512_expsum(const float * x, int n, float m) {
    const __m512 vm = _mm512_set1_ps(m);
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        const __mmask16 mk = tail_mask(n - i);
        const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), mk, x + i);
        acc = _mm512_add_ps(acc, exp_ps(_mm512_sub_ps(v, vm)));
    }
    return _mm512_reduce_add_ps(acc);
}

float avx512_expsum_store(const float * x, int n, float m, float * y) {
    const __m512 vm = _mm512_set1_ps(m);
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        const __mmask16 mk = tail_mask(n - i);
        const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), mk, x + i);
        const __m512 e = exp_ps(_mm512_sub_ps(v, vm));
        _mm512_mask_storeu_ps(y + i, mk, e);
        acc = _mm512_add_ps(acc, e);
    }
    return _mm512_reduce_add_ps(acc);
}

void avx512_exp_acc(const float * x, int n, float m, float a, float * y) {
    const __m512 vm = _mm512_set1_ps(m), va = _mm512_set1_ps(a);
    for (int i = 0; i < n; i += 16) {
        const __mmask16 mk = tail_mask(n - i);
        const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), mk, x + i);
        const __m512 r = _mm512_fmadd_ps(va, exp_ps(_mm512_sub_ps(v, vm)), _mm512_maskz_loadu_ps(mk, y + i));
        _mm512_mask_storeu_ps(y + i, mk, r);
    }
}

float avx512_max(const float * x, int n) {
    __m512 acc = _mm512_set1_ps(-INFINITY);
    for (int i = 0; i < n; i += 16) {
        const __mmask16 mk = tail_mask(n - i);
        acc = _mm512_max_ps(acc, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), mk, x + i));
    }
    return _mm512_reduce_max_ps(acc);
}

// two accumulators over 32 elements a step, then the masked tail into the first
template <class T>
float dot(const float * a, const T * b, int n) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i),      load_full(b + i),      acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), load_full(b + i + 16), acc1);
    }
    for (; i < n; i += 16) {
        const __mmask16 mk = tail_mask(n - i);
        acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, a + i), load(b + i, mk), acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

float avx512_dot_f16(const float * a, const uint16_t * b, int n) { return dot(a, b, n); }
float avx512_dot_f32(const float * a, const float * b, int n)    { return dot(a, b, n); }

template <class T>
void axpy(float * y, const T * x, float a, int n) {
    const __m512 va = _mm512_set1_ps(a);
    for (int i = 0; i < n; i += 16) {
        const __mmask16 mk = tail_mask(n - i);
        const __m512 r = _mm512_fmadd_ps(va, load(x + i, mk), _mm512_maskz_loadu_ps(mk, y + i));
        _mm512_mask_storeu_ps(y + i, mk, r);
    }
}

void avx512_axpy_f16(float * y, const uint16_t * x, float a, int n) { axpy(y, x, a, n); }
void avx512_axpy_f32(float * y, const float * x, float a, int n)    { axpy(y, x, a, n); }

// q8_0 rows: a block's 32 int8 values as two vectors, their product with a times the block's scale
inline void load_q8(const int8_t * qs, __m512 * x0, __m512 * x1) {
    *x0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *) qs)));
    *x1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *) (qs + 16))));
}

float avx512_dot_q8_0(const float * a, const sparq_block_q8_0 * b, int n) {
    __m512 acc = _mm512_setzero_ps();
    for (int ib = 0; ib < n / SPARQ_QK; ++ib, a += SPARQ_QK) {
        __m512 x0, x1;
        load_q8(b[ib].qs, &x0, &x1);
        const __m512 t = _mm512_fmadd_ps(_mm512_loadu_ps(a + 16), x1, _mm512_mul_ps(_mm512_loadu_ps(a), x0));
        acc = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(b[ib].d)), t, acc);
    }
    return _mm512_reduce_add_ps(acc);
}

void avx512_axpy_q8_0(float * y, const sparq_block_q8_0 * x, float a, int n) {
    for (int ib = 0; ib < n / SPARQ_QK; ++ib, y += SPARQ_QK) {
        __m512 x0, x1;
        load_q8(x[ib].qs, &x0, &x1);
        const __m512 s = _mm512_set1_ps(a * _cvtsh_ss(x[ib].d));
        _mm512_storeu_ps(y, _mm512_fmadd_ps(s, x0, _mm512_loadu_ps(y)));
        _mm512_storeu_ps(y + 16, _mm512_fmadd_ps(s, x1, _mm512_loadu_ps(y + 16)));
    }
}

void avx512_f16_to_f32(const uint16_t * x, float * y, int n) {
    for (int i = 0; i < n; i += 16) {
        const __mmask16 mk = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, mk, load(x + i, mk));
    }
}

void avx512_gather_dot_f16(const float * q, const void * base, size_t stride, const int32_t * idx, int n, int d,
                           float * out) {
    for (int t = 0; t < n; ++t) {
        out[t] = dot(q, (const uint16_t *) ((const char *) base + (size_t) idx[t] * stride), d);
    }
}

void avx512_gather_dot_f32(const float * q, const void * base, size_t stride, const int32_t * idx, int n, int d,
                           float * out) {
    for (int t = 0; t < n; ++t) {
        out[t] = dot(q, (const float *) ((const char *) base + (size_t) idx[t] * stride), d);
    }
}

// NV vectors of y (from element off, the last one masked by last) held in registers over every
// row: row after row the same operations per lane as axpy
template <class T, int NV>
inline void gather_axpy_tile(float * y, const char * b, size_t stride, const int32_t * idx, const float * p, int n,
                             int off, __mmask16 last) {
    __m512 acc[NV];
    for (int v = 0; v < NV; ++v) {
        acc[v] = _mm512_maskz_loadu_ps(v == NV - 1 ? last : (__mmask16) 0xffff, y + off + 16 * v);
    }
    for (int t = 0; t < n; ++t) {
        const T * x = (const T *) (b + (size_t) idx[t] * stride) + off;
        const __m512 a = _mm512_set1_ps(p[t]);
        for (int v = 0; v < NV; ++v) {
            acc[v] = _mm512_fmadd_ps(a, load(x + 16 * v, v == NV - 1 ? last : (__mmask16) 0xffff), acc[v]);
        }
    }
    for (int v = 0; v < NV; ++v) {
        _mm512_mask_storeu_ps(y + off + 16 * v, v == NV - 1 ? last : (__mmask16) 0xffff, acc[v]);
    }
}

// y[0..dv) += sum_t p[t] * row(idx[t]), tiles of up to 8 vectors (128 values)
template <class T>
void gather_axpy(float * y, const void * base, size_t stride, const int32_t * idx, const float * p, int n, int dv) {
    const char * b = (const char *) base;
    for (int off = 0; off < dv; off += 128) {
        const int rem = std::min(128, dv - off);
        const int nv = (rem + 15) / 16;
        const __mmask16 last = tail_mask(rem - 16 * (nv - 1));
        switch (nv) {
            case 8: gather_axpy_tile<T, 8>(y, b, stride, idx, p, n, off, last); break;
            case 7: gather_axpy_tile<T, 7>(y, b, stride, idx, p, n, off, last); break;
            case 6: gather_axpy_tile<T, 6>(y, b, stride, idx, p, n, off, last); break;
            case 5: gather_axpy_tile<T, 5>(y, b, stride, idx, p, n, off, last); break;
            case 4: gather_axpy_tile<T, 4>(y, b, stride, idx, p, n, off, last); break;
            case 3: gather_axpy_tile<T, 3>(y, b, stride, idx, p, n, off, last); break;
            case 2: gather_axpy_tile<T, 2>(y, b, stride, idx, p, n, off, last); break;
            default: gather_axpy_tile<T, 1>(y, b, stride, idx, p, n, off, last); break;
        }
    }
}

void avx512_gather_axpy_f16(float * y, const void * b, size_t st, const int32_t * idx, const float * p, int n, int dv) {
    gather_axpy<uint16_t>(y, b, st, idx, p, n, dv);
}

void avx512_gather_axpy_f32(float * y, const void * b, size_t st, const int32_t * idx, const float * p, int n, int dv) {
    gather_axpy<float>(y, b, st, idx, p, n, dv);
}

// gather_dot and gather_axpy for G query heads of a KV head at once: each row loaded (and
// converted) once for all of them; per head the operations of dot() and gather_axpy(), in their
// order, so the same results
template <class T, int G>
inline void dot_heads(const float * const * q, const T * b, int n, float * out) {
    __m512 acc0[G], acc1[G];
    for (int h = 0; h < G; ++h) {
        acc0[h] = _mm512_setzero_ps();
        acc1[h] = _mm512_setzero_ps();
    }
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512 k0 = load_full(b + i), k1 = load_full(b + i + 16);
        for (int h = 0; h < G; ++h) {
            acc0[h] = _mm512_fmadd_ps(_mm512_loadu_ps(q[h] + i), k0, acc0[h]);
            acc1[h] = _mm512_fmadd_ps(_mm512_loadu_ps(q[h] + i + 16), k1, acc1[h]);
        }
    }
    for (; i < n; i += 16) {
        const __mmask16 mk = tail_mask(n - i);
        const __m512 k0 = load(b + i, mk);
        for (int h = 0; h < G; ++h) {
            acc0[h] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, q[h] + i), k0, acc0[h]);
        }
    }
    for (int h = 0; h < G; ++h) {
        out[h] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[h], acc1[h]));
    }
}

template <class T, int G>
inline void gather_dot_heads(const float * const * q, const char * b, size_t stride, const int32_t * idx, int n, int d,
                             float * out, size_t ostride) {
    float o[G];
    for (int t = 0; t < n; ++t) {
        dot_heads<T, G>(q, (const T *) (b + (size_t) idx[t] * stride), d, o);
        for (int h = 0; h < G; ++h) {
            out[(size_t) h * ostride + t] = o[h];
        }
    }
}

template <class T>
void gather_dot_g(const float * const * q, int g, const void * base, size_t stride, const int32_t * idx, int n, int d,
                  float * out, size_t ostride) {
    simd_head_passes(g, [&](int h0, auto G) {
        gather_dot_heads<T, decltype(G)::value>(q + h0, (const char *) base, stride, idx, n, d, out + (size_t) h0 * ostride,
                                                ostride);
    });
}

// NV vectors of each of G heads' y (from element off, the last one masked by last) held in
// registers over every row
template <class T, int G, int NV>
inline void gather_axpy_heads_tile(float * y, size_t ystride, const char * b, size_t stride, const int32_t * idx,
                                   const float * p, size_t pstride, int n, int off, __mmask16 last) {
    __m512 acc[G][NV];
    for (int h = 0; h < G; ++h) {
        for (int v = 0; v < NV; ++v) {
            acc[h][v] = _mm512_maskz_loadu_ps(v == NV - 1 ? last : (__mmask16) 0xffff, y + (size_t) h * ystride + off + 16 * v);
        }
    }
    for (int t = 0; t < n; ++t) {
        const T * x = (const T *) (b + (size_t) idx[t] * stride) + off;
        __m512 xv[NV];
        for (int v = 0; v < NV; ++v) {
            xv[v] = load(x + 16 * v, v == NV - 1 ? last : (__mmask16) 0xffff);
        }
        for (int h = 0; h < G; ++h) {
            const __m512 a = _mm512_set1_ps(p[(size_t) h * pstride + t]);
            for (int v = 0; v < NV; ++v) {
                acc[h][v] = _mm512_fmadd_ps(a, xv[v], acc[h][v]);
            }
        }
    }
    for (int h = 0; h < G; ++h) {
        for (int v = 0; v < NV; ++v) {
            _mm512_mask_storeu_ps(y + (size_t) h * ystride + off + 16 * v, v == NV - 1 ? last : (__mmask16) 0xffff, acc[h][v]);
        }
    }
}

// tiles of as many vectors as the 32 registers hold for G heads and the row
template <class T, int G>
void gather_axpy_heads(float * y, size_t ystride, const char * b, size_t stride, const int32_t * idx, const float * p,
                       size_t pstride, int n, int dv) {
    constexpr int NVMAX = std::min(8, 31 / (G + 1));
    for (int off = 0; off < dv; off += 16 * NVMAX) {
        const int rem = std::min(16 * NVMAX, dv - off);
        const int nv = (rem + 15) / 16;
        const __mmask16 last = tail_mask(rem - 16 * (nv - 1));
        switch (nv) {
            case 8: if constexpr (NVMAX >= 8) { gather_axpy_heads_tile<T, G, 8>(y, ystride, b, stride, idx, p, pstride, n, off, last); } break;
            case 7: if constexpr (NVMAX >= 7) { gather_axpy_heads_tile<T, G, 7>(y, ystride, b, stride, idx, p, pstride, n, off, last); } break;
            case 6: if constexpr (NVMAX >= 6) { gather_axpy_heads_tile<T, G, 6>(y, ystride, b, stride, idx, p, pstride, n, off, last); } break;
            case 5: if constexpr (NVMAX >= 5) { gather_axpy_heads_tile<T, G, 5>(y, ystride, b, stride, idx, p, pstride, n, off, last); } break;
            case 4: if constexpr (NVMAX >= 4) { gather_axpy_heads_tile<T, G, 4>(y, ystride, b, stride, idx, p, pstride, n, off, last); } break;
            case 3: if constexpr (NVMAX >= 3) { gather_axpy_heads_tile<T, G, 3>(y, ystride, b, stride, idx, p, pstride, n, off, last); } break;
            case 2: if constexpr (NVMAX >= 2) { gather_axpy_heads_tile<T, G, 2>(y, ystride, b, stride, idx, p, pstride, n, off, last); } break;
            default: gather_axpy_heads_tile<T, G, 1>(y, ystride, b, stride, idx, p, pstride, n, off, last); break;
        }
    }
}

template <class T>
void gather_axpy_g(float * y, size_t ystride, int g, const void * base, size_t stride, const int32_t * idx,
                   const float * p, size_t pstride, int n, int dv) {
    simd_head_passes(g, [&](int h0, auto G) {
        gather_axpy_heads<T, decltype(G)::value>(y + (size_t) h0 * ystride, ystride, (const char *) base, stride, idx,
                                                 p + (size_t) h0 * pstride, pstride, n, dv);
    });
}

void avx512_gather_dot_g_f16(const float * const * q, int g, const void * b, size_t st, const int32_t * idx, int n,
                             int d, float * out, size_t os) {
    gather_dot_g<uint16_t>(q, g, b, st, idx, n, d, out, os);
}
void avx512_gather_dot_g_f32(const float * const * q, int g, const void * b, size_t st, const int32_t * idx, int n,
                             int d, float * out, size_t os) {
    gather_dot_g<float>(q, g, b, st, idx, n, d, out, os);
}
void avx512_gather_axpy_g_f16(float * y, size_t ys, int g, const void * b, size_t st, const int32_t * idx,
                              const float * p, size_t ps, int n, int dv) {
    gather_axpy_g<uint16_t>(y, ys, g, b, st, idx, p, ps, n, dv);
}
void avx512_gather_axpy_g_f32(float * y, size_t ys, int g, const void * b, size_t st, const int32_t * idx,
                              const float * p, size_t ps, int n, int dv) {
    gather_axpy_g<float>(y, ys, g, b, st, idx, p, ps, n, dv);
}

// the hits' indices compressed in a register and stored whole: a compress straight to memory
// (vpcompressd to memory) is microcoded on Zen 4, some hundred cycles a store
int avx512_filter_gt(const float * x, int n, float t, int32_t * idx) {
    const __m512 vt = _mm512_set1_ps(t);
    const __m512i step = _mm512_set1_epi32(16);
    __m512i vi = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int m = 0;
    for (int i = 0; i < n; i += 16) {
        const __mmask16 mk = tail_mask(n - i);
        const __mmask16 gt = _mm512_mask_cmp_ps_mask(mk, _mm512_maskz_loadu_ps(mk, x + i), vt, _CMP_GT_OQ);
        if (gt) {
            _mm512_storeu_si512(idx + m, _mm512_maskz_compress_epi32(gt, vi));
            m += __builtin_popcount((unsigned) gt);
        }
        vi = _mm512_add_epi32(vi, step);
    }
    return m;
}

// 16 ids at a time: converted, range-checked, their flags gathered, the hits' indices compressed
// in a register and stored whole (as in filter_gt)
int avx512_list_gather(const float * ids, int n, const int32_t * flag, int n_list, int base, int32_t * idx, int * stop) {
    const __m512i vn = _mm512_set1_epi32(n_list);
    const __m512i step = _mm512_set1_epi32(16);
    __m512i vi = _mm512_add_epi32(_mm512_set1_epi32(base), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    int m = 0, i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512i li = _mm512_cvttps_epi32(_mm512_loadu_ps(ids + i));
        // outside [0, n_list) as unsigned (NaN and -1 included: cvtt gives INT_MIN or -1)
        if (_mm512_cmpge_epu32_mask(li, vn)) {
            break; // the scalar pass below finds the stop
        }
        const __m512i f = _mm512_i32gather_epi32(li, flag, 4);
        const __mmask16 hit = _mm512_test_epi32_mask(f, f);
        if (hit) {
            _mm512_storeu_si512(idx + m, _mm512_maskz_compress_epi32(hit, vi));
            m += __builtin_popcount((unsigned) hit);
        }
        vi = _mm512_add_epi32(vi, step);
    }
    return simd_list_gather_rest(ids, n, i, flag, n_list, base, idx, m, stop);
}

} // namespace

const struct sparq_isa sparq_isa_avx512 = {
    "avx512",
    avx512_approx_f16, avx512_approx_f32, avx512_approx_e5m2, avx512_approx_kt4,
    avx512_expsum, avx512_expsum_store, avx512_exp_acc, avx512_max,
    avx512_dot_f16, avx512_dot_f32,
    avx512_axpy_f16, avx512_axpy_f32,
    avx512_dot_q8_0, avx512_axpy_q8_0,
    avx512_f16_to_f32,
    avx512_gather_dot_f16, avx512_gather_dot_f32,
    avx512_gather_axpy_f16, avx512_gather_axpy_f32,
    avx512_gather_dot_g_f16, avx512_gather_dot_g_f32,
    avx512_gather_axpy_g_f16, avx512_gather_axpy_g_f32,
    avx512_filter_gt,
    avx512_list_gather,
};

#endif
