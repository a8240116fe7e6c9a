// llama-sparq: the vector layer of the SIMD ISA files: the primitives' loop skeletons written once
// against a per-ISA set of inline wrappers (a struct V each ISA file defines), and the exp they share.
// Each ISA file instantiates them with its V and names the results in its sparq_isa table.
//
// V (see sparq-cpu-avx2.cpp for one):
//   vf, vmask            a vector of W floats, and a per-lane flag vector (or mask register)
//   W                    lanes;  REGS: the ISA's vector registers (the register tiles' sizes)
//   zero(), set1(x)      broadcasts
//   load(const float *), load(const uint16_t *)   W floats, or W halves to f32; store(float *, vf)
//   load(const uint8_t *)                         W e5m2 bytes to f32 (each the upper byte of an f16)
//   add, sub, mul, min, max;  round(x): to the nearest integer, ties to even
//   fmadd(a, b, c)       a * b + c, fused;  fnmadd(a, b, c): c - a * b, fused
//   pow2i(n)             2^n for integral n in the exponent's range (n + 127 into the exponent bits)
//   lt(a, b)             lanes with a < b (ordered);  zero_where(m, x): x with those lanes 0
//   hsum(v), hmax(v)     horizontal sum and maximum (each ISA's own order)
//   prefetch(p)          into L1;  half(h): one f16 (a block's scale) to f32
//   load_q8(qs, x)       a q8_0 block's 32 int8 values into 32 / W vectors x[] of floats
//   kt4_block(blk, x)    a 4-bit K^T block's 32 values into 32 / W vectors, cells in order: exactly q d + m
//                        (simd_kt4_q4_block, from load_q4); KT4_GROUPS, kt4_group(blk, grp, x): the same in
//                        groups of vectors (a load of nibbles each), vector v of group grp from kt4_cell(grp, v)
//
// The skeletons below are the "full vectors, then a scalar tail" family (AVX2, NEON). AVX-512's
// reductions run masked tails instead (different lanes, so different sums): they stay in its
// file; it shares simd_exp, the head passes and the approximate scores, whose per-lane operations
// (and scalar tail) give the same bits whatever W. Elsewhere the numerics are each ISA's own: the
// same operations per lane, the same accumulation and reduction order.
#pragma once

#include "sparq-cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stddef.h>
#include <type_traits>
#include <utility>

// Everything here has internal linkage: each ISA file compiles its own copy with its own flags
// (-mavx2, -mavx512f, ...), and the linker must never pick one file's copy for another.
namespace {

inline float simd_elem(const float * p)    { return *p; }
inline float simd_elem(const uint16_t * p) { return sparq_fp16_to_fp32(*p); }
inline float simd_elem(const uint8_t * p)  { return sparq_e5m2_to_fp32(*p); }

// exp(x) for x <= 88.37; lanes below -87.33 (including -INF) give 0.
// Cephes-style: x = n*ln2 + t, |t| <= ln2/2, exp(t) by a degree-7 polynomial.
template <class V>
inline typename V::vf simd_exp(typename V::vf x) {
    typedef typename V::vf vf;
    const typename V::vmask tiny = V::lt(x, V::set1(-87.33654f));
    x = V::min(x, V::set1(88.37626f));
    x = V::max(x, V::set1(-87.33654f));
    const vf n = V::round(V::mul(x, V::set1(1.44269504088896341f)));
    vf t = V::fnmadd(n, V::set1(0.693359375f), x);
    t = V::fnmadd(n, V::set1(-2.12194440e-4f), t);
    vf p = V::set1(1.9875691500e-4f);
    p = V::fmadd(p, t, V::set1(1.3981999507e-3f));
    p = V::fmadd(p, t, V::set1(8.3334519073e-3f));
    p = V::fmadd(p, t, V::set1(4.1665795894e-2f));
    p = V::fmadd(p, t, V::set1(1.6666665459e-1f));
    p = V::fmadd(p, t, V::set1(5.0000001201e-1f));
    p = V::fmadd(p, V::mul(t, t), V::add(t, V::set1(1.0f)));
    return V::zero_where(tiny, V::mul(p, V::pow2i(n)));
}

// f(h0, std::integral_constant<int, G>()) for g heads in passes of up to GMAX (h0 the pass's first):
// more accumulators than the registers hold would spill.
template <int GMAX, class F>
inline void simd_head_passes_of(int g, F && f) {
    static_assert(GMAX >= 1 && GMAX <= 4, "passes of 1 to 4 heads");
    for (int h0 = 0; h0 < g; h0 += GMAX) {
        switch (std::min(GMAX, g - h0)) {
            case 4:  if constexpr (GMAX >= 4) { f(h0, std::integral_constant<int, 4>()); } break;
            case 3:  if constexpr (GMAX >= 3) { f(h0, std::integral_constant<int, 3>()); } break;
            case 2:  if constexpr (GMAX >= 2) { f(h0, std::integral_constant<int, 2>()); } break;
            default: f(h0, std::integral_constant<int, 1>()); break;
        }
    }
}

// The approximate scores' tile: NV vectors of cells (from s) of G heads held in registers over
// all r rows of K^T, so each output is written once and each row's vectors are converted once
// for the G heads. Per lane: 0, then fused w_j x_j + acc for j = 0..r-1 (the scalar tail's order
// too, so the results do not depend on W). The rows' next block (n cells on, where the caller
// goes next) is prefetched on the way.
template <class V, class T, int G, int NV>
inline void simd_approx_tile(const T * const * rows, int r, const float * qs, int n, int s, float * out) {
    typedef typename V::vf vf;
    constexpr size_t span = (size_t) NV * V::W * sizeof(T);
    vf acc[G][NV];
    for (int h = 0; h < G; ++h) {
        for (int v = 0; v < NV; ++v) {
            acc[h][v] = V::zero();
        }
    }
    for (int j = 0; j < r; ++j) {
        const T * x = rows[j] + s;
        for (size_t b = 0; b < span; b += 64) {
            V::prefetch((const char *) (x + n) + b);
        }
        vf xv[NV];
        for (int v = 0; v < NV; ++v) {
            xv[v] = V::load(x + v * V::W);
        }
        for (int h = 0; h < G; ++h) {
            const vf w = V::set1(qs[h * r + j]);
            for (int v = 0; v < NV; ++v) {
                acc[h][v] = V::fmadd(w, xv[v], acc[h][v]);
            }
        }
    }
    for (int h = 0; h < G; ++h) {
        for (int v = 0; v < NV; ++v) {
            V::store(out + (size_t) h * n + s + v * V::W, acc[h][v]);
        }
    }
}

template <class V, class T, int G>
void simd_approx_heads(const T * const * rows, int r, const float * qs, int n, float * out) {
    constexpr int NVMAX = std::max(1, std::min(8, (V::REGS - 2) / (G + 1)));
    int s = 0;
    for (; s + NVMAX * V::W <= n; s += NVMAX * V::W) {
        simd_approx_tile<V, T, G, NVMAX>(rows, r, qs, n, s, out);
    }
    for (; s + V::W <= n; s += V::W) {
        simd_approx_tile<V, T, G, 1>(rows, r, qs, n, s, out);
    }
    for (; s < n; ++s) {
        for (int h = 0; h < G; ++h) {
            float o = 0.0f;
            for (int j = 0; j < r; ++j) {
                o = std::fma(qs[h * r + j], simd_elem(rows[j] + s), o);
            }
            out[(size_t) h * n + s] = o;
        }
    }
}

// out (g x n) = the approximate logits of g query heads over n cells from r rows of K^T
// (sparq_isa::approx_*): heads in passes of up to 4, each pass a run of register tiles.
// T: float, uint16_t (f16) or uint8_t (e5m2).
template <class V, class T>
void simd_approx(const T * const * rows, int r, const float * qs, int g, int n, float * out) {
    simd_head_passes_of<4>(g, [&](int h0, auto G) {
        simd_approx_heads<V, T, decltype(G)::value>(rows, r, qs + (size_t) h0 * r, n, out + (size_t) h0 * n);
    });
}

// V::kt4_block from nibbles: V::load_q4 (16 bytes of nibbles, byte j holding cell j low and j + 16
// high, as 32 / W vectors of the values 0..15, cells in order), times d plus m (exact: d a power of two)
template <class V>
inline void simd_kt4_q4_block(const uint8_t * blk, typename V::vf * x) {
    uint16_t dh, mh;
    memcpy(&dh, blk, 2);
    memcpy(&mh, blk + 2, 2);
    const typename V::vf vd = V::set1(V::half(dh)), vm = V::set1(V::half(mh));
    V::load_q4(blk + 4, x);
    for (int i = 0; i < GGML_SPARQ_KT4_CELLS / V::W; ++i) {
        x[i] = V::fmadd(x[i], vd, vm);
    }
}

// simd_approx_tile over 4-bit K^T rows: NB whole blocks of 32 cells (block b0 on, at out + s) of G
// heads in registers over all r rows, a group of each block's vectors (V::kt4_group) at a time, decoded
// once for the G heads; each row's next NPF blocks prefetched (the hardware's prefetch falls behind
// that many rows of short blocks), a whole tile's after a call's last tiles too (the next call's)
template <class V, int G, int NB, int NPF = NB>
inline void simd_approx_kt4_tile(const uint8_t * const * rows, int r, const float * qs, int n, int b0, int s,
                                 float * out) {
    typedef typename V::vf vf;
    constexpr int NVG = GGML_SPARQ_KT4_CELLS / V::W / V::KT4_GROUPS;
    constexpr size_t span = (size_t) NB * GGML_SPARQ_KT4_BYTES, ahead = (size_t) NPF * GGML_SPARQ_KT4_BYTES;
    for (int grp = 0; grp < V::KT4_GROUPS; ++grp) {
        vf acc[G][NB * NVG];
        for (int h = 0; h < G; ++h) {
            for (int v = 0; v < NB * NVG; ++v) {
                acc[h][v] = V::zero();
            }
        }
        for (int j = 0; j < r; ++j) {
            const uint8_t * x = rows[j] + (size_t) b0 * GGML_SPARQ_KT4_BYTES;
            if (grp == 0) {
                for (size_t o = 0; o < ahead; o += 64) {
                    V::prefetch(x + span + o);
                }
            }
            vf xv[NB * NVG];
            for (int b = 0; b < NB; ++b) {
                V::kt4_group(x + b * GGML_SPARQ_KT4_BYTES, grp, xv + b * NVG);
            }
            for (int h = 0; h < G; ++h) {
                const vf w = V::set1(qs[h * r + j]);
                for (int v = 0; v < NB * NVG; ++v) {
                    acc[h][v] = V::fmadd(w, xv[v], acc[h][v]);
                }
            }
        }
        for (int h = 0; h < G; ++h) {
            for (int v = 0; v < NB * NVG; ++v) {
                V::store(out + (size_t) h * n + s + v / NVG * GGML_SPARQ_KT4_CELLS + V::kt4_cell(grp, v % NVG),
                         acc[h][v]);
            }
        }
    }
}

// the cells c0 + s .. c0 + s + m of one block (a block the range cuts: the chunk's ends), per cell
// the tile's order
template <class V, int G>
inline void simd_approx_kt4_part(const uint8_t * const * rows, int r, const float * qs, int n, int c0, int s, int m,
                                 float * out) {
    constexpr int NVB = GGML_SPARQ_KT4_CELLS / V::W;
    const int c = c0 + s, o = c % GGML_SPARQ_KT4_CELLS;
    const size_t off = (size_t) (c / GGML_SPARQ_KT4_CELLS) * GGML_SPARQ_KT4_BYTES;
    float acc[G][GGML_SPARQ_KT4_CELLS] = {};
    for (int j = 0; j < r; ++j) {
        typename V::vf xv[NVB];
        float xb[GGML_SPARQ_KT4_CELLS];
        V::kt4_block(rows[j] + off, xv);
        for (int v = 0; v < NVB; ++v) {
            V::store(xb + v * V::W, xv[v]);
        }
        for (int h = 0; h < G; ++h) {
            for (int t = 0; t < m; ++t) {
                acc[h][t] = std::fma(qs[h * r + j], xb[o + t], acc[h][t]);
            }
        }
    }
    for (int h = 0; h < G; ++h) {
        memcpy(out + (size_t) h * n + s, acc[h], m * sizeof(float));
    }
}

template <class V, int G>
void simd_approx_kt4_heads(const uint8_t * const * rows, int c0, int r, const float * qs, int n, float * out) {
    constexpr int NVG = GGML_SPARQ_KT4_CELLS / V::W / V::KT4_GROUPS;
    constexpr int NB = std::max(1, std::min(8, (V::REGS - 2) / ((G + 1) * NVG)));
    int s = 0;
    const int o = c0 % GGML_SPARQ_KT4_CELLS;
    if (o != 0) {
        const int m = std::min(GGML_SPARQ_KT4_CELLS - o, n);
        simd_approx_kt4_part<V, G>(rows, r, qs, n, c0, 0, m, out);
        s = m;
    }
    for (; s + NB * GGML_SPARQ_KT4_CELLS <= n; s += NB * GGML_SPARQ_KT4_CELLS) {
        simd_approx_kt4_tile<V, G, NB>(rows, r, qs, n, (c0 + s) / GGML_SPARQ_KT4_CELLS, s, out);
    }
    for (; s + GGML_SPARQ_KT4_CELLS <= n; s += GGML_SPARQ_KT4_CELLS) {
        simd_approx_kt4_tile<V, G, 1, NB>(rows, r, qs, n, (c0 + s) / GGML_SPARQ_KT4_CELLS, s, out);
    }
    if (s < n) {
        simd_approx_kt4_part<V, G>(rows, r, qs, n, c0, s, n - s, out);
    }
}

// simd_approx over 4-bit K^T rows (sparq_isa::approx_kt4): the cells c0 .. c0 + n, their blocks
// from each row's start; heads in passes as many as the registers hold beside a block's vectors
template <class V>
void simd_approx_kt4(const uint8_t * const * rows, int c0, int r, const float * qs, int g, int n, float * out) {
    constexpr int NVG = GGML_SPARQ_KT4_CELLS / V::W / V::KT4_GROUPS;
    constexpr int GMAX = std::max(1, std::min(4, (V::REGS - 2 - NVG) / NVG));
    simd_head_passes_of<GMAX>(g, [&](int h0, auto G) {
        simd_approx_kt4_heads<V, decltype(G)::value>(rows, c0, r, qs + (size_t) h0 * r, n, out + (size_t) h0 * n);
    });
}

// sum_i exp(x[i] - m): one vector accumulator, reduced, then the tail
template <class V>
float simd_expsum(const float * x, int n, float m) {
    typedef typename V::vf vf;
    const vf vm = V::set1(m);
    vf acc = V::zero();
    int i = 0;
    for (; i + V::W <= n; i += V::W) {
        acc = V::add(acc, simd_exp<V>(V::sub(V::load(x + i), vm)));
    }
    float sum = V::hsum(acc);
    for (; i < n; ++i) {
        sum += expf(x[i] - m);
    }
    return sum;
}

template <class V>
float simd_expsum_store(const float * x, int n, float m, float * y) {
    typedef typename V::vf vf;
    const vf vm = V::set1(m);
    vf acc = V::zero();
    int i = 0;
    for (; i + V::W <= n; i += V::W) {
        const vf e = simd_exp<V>(V::sub(V::load(x + i), vm));
        V::store(y + i, e);
        acc = V::add(acc, e);
    }
    float sum = V::hsum(acc);
    for (; i < n; ++i) {
        y[i] = expf(x[i] - m);
        sum += y[i];
    }
    return sum;
}

// y[i] += a * exp(x[i] - m)
template <class V>
void simd_exp_acc(const float * x, int n, float m, float a, float * y) {
    typedef typename V::vf vf;
    const vf vm = V::set1(m), va = V::set1(a);
    int i = 0;
    for (; i + V::W <= n; i += V::W) {
        const vf e = simd_exp<V>(V::sub(V::load(x + i), vm));
        V::store(y + i, V::fmadd(va, e, V::load(y + i)));
    }
    for (; i < n; ++i) {
        y[i] += a * expf(x[i] - m);
    }
}

template <class V>
float simd_max(const float * x, int n) {
    typename V::vf acc = V::set1(-INFINITY);
    int i = 0;
    for (; i + V::W <= n; i += V::W) {
        acc = V::max(acc, V::load(x + i));
    }
    float m = V::hmax(acc);
    for (; i < n; ++i) {
        m = x[i] > m ? x[i] : m;
    }
    return m;
}

// two vector accumulators (2W elements a step), their sum reduced, then the tail
template <class V, class T>
float simd_dot(const float * a, const T * b, int n) {
    typename V::vf acc0 = V::zero(), acc1 = V::zero();
    int i = 0;
    for (; i + 2 * V::W <= n; i += 2 * V::W) {
        acc0 = V::fmadd(V::load(a + i),        V::load(b + i),        acc0);
        acc1 = V::fmadd(V::load(a + i + V::W), V::load(b + i + V::W), acc1);
    }
    float sum = V::hsum(V::add(acc0, acc1));
    for (; i < n; ++i) {
        sum += a[i] * simd_elem(b + i);
    }
    return sum;
}

// y[i] += a * x[i]
template <class V, class T>
void simd_axpy(float * y, const T * x, float a, int n) {
    const typename V::vf va = V::set1(a);
    int i = 0;
    for (; i + V::W <= n; i += V::W) {
        V::store(y + i, V::fmadd(va, V::load(x + i), V::load(y + i)));
    }
    for (; i < n; ++i) {
        y[i] += a * simd_elem(x + i);
    }
}

// The exact attention's two passes over a selection of K or V rows (row t at base + idx[t] * stride
// bytes), without a call per row. out[t] = q . row(idx[t]), simd_dot inlined per row.
template <class V, class T>
void simd_gather_dot(const float * q, const void * base, size_t stride, const int32_t * idx, int n, int d,
                     float * out) {
    const char * b = (const char *) base;
    for (int t = 0; t < n; ++t) {
        out[t] = simd_dot<V, T>(q, (const T *) (b + (size_t) idx[t] * stride), d);
    }
}

// NV vectors of y (from element off) held in registers over every row: row after row the same
// operations per lane as simd_axpy
template <class V, class T, int NV>
inline void simd_gather_axpy_tile(float * y, const char * b, size_t stride, const int32_t * idx, const float * p,
                                  int n, int off) {
    typename V::vf acc[NV];
    for (int v = 0; v < NV; ++v) {
        acc[v] = V::load(y + off + v * V::W);
    }
    for (int t = 0; t < n; ++t) {
        const T * x = (const T *) (b + (size_t) idx[t] * stride) + off;
        const typename V::vf a = V::set1(p[t]);
        for (int v = 0; v < NV; ++v) {
            acc[v] = V::fmadd(a, V::load(x + v * V::W), acc[v]);
        }
    }
    for (int v = 0; v < NV; ++v) {
        V::store(y + off + v * V::W, acc[v]);
    }
}

// y[0..dv) += sum_t p[t] * row(idx[t]): tiles of up to 8 vectors, then the scalar tail
template <class V, class T>
void simd_gather_axpy(float * y, const void * base, size_t stride, const int32_t * idx, const float * p, int n,
                      int dv) {
    const char * b = (const char *) base;
    int off = 0;
    for (; off + 8 * V::W <= dv; off += 8 * V::W) {
        simd_gather_axpy_tile<V, T, 8>(y, b, stride, idx, p, n, off);
    }
    switch ((dv - off) / V::W) {
        case 7: simd_gather_axpy_tile<V, T, 7>(y, b, stride, idx, p, n, off); break;
        case 6: simd_gather_axpy_tile<V, T, 6>(y, b, stride, idx, p, n, off); break;
        case 5: simd_gather_axpy_tile<V, T, 5>(y, b, stride, idx, p, n, off); break;
        case 4: simd_gather_axpy_tile<V, T, 4>(y, b, stride, idx, p, n, off); break;
        case 3: simd_gather_axpy_tile<V, T, 3>(y, b, stride, idx, p, n, off); break;
        case 2: simd_gather_axpy_tile<V, T, 2>(y, b, stride, idx, p, n, off); break;
        case 1: simd_gather_axpy_tile<V, T, 1>(y, b, stride, idx, p, n, off); break;
        default: break;
    }
    off += (dv - off) / V::W * V::W;
    for (int i = off; i < dv; ++i) {
        for (int t = 0; t < n; ++t) {
            y[i] += p[t] * simd_elem((const T *) (b + (size_t) idx[t] * stride) + i);
        }
    }
}

// the g-head gathers of every ISA run their heads in passes of up to 4
template <class F>
inline void simd_head_passes(int g, F && f) {
    simd_head_passes_of<4>(g, std::forward<F>(f));
}

// gather_dot and gather_axpy for G query heads of a KV head at once: each row loaded (and converted)
// once for all of them; per head the operations of simd_dot and simd_gather_axpy, in their order.
template <class V, class T, int G>
inline void simd_dot_heads(const float * const * q, const T * b, int n, float * out) {
    typename V::vf acc0[G], acc1[G];
    for (int h = 0; h < G; ++h) {
        acc0[h] = V::zero();
        acc1[h] = V::zero();
    }
    int i = 0;
    for (; i + 2 * V::W <= n; i += 2 * V::W) {
        const typename V::vf k0 = V::load(b + i), k1 = V::load(b + i + V::W);
        for (int h = 0; h < G; ++h) {
            acc0[h] = V::fmadd(V::load(q[h] + i), k0, acc0[h]);
            acc1[h] = V::fmadd(V::load(q[h] + i + V::W), k1, acc1[h]);
        }
    }
    for (int h = 0; h < G; ++h) {
        float sum = V::hsum(V::add(acc0[h], acc1[h]));
        for (int j = i; j < n; ++j) {
            sum += q[h][j] * simd_elem(b + j);
        }
        out[h] = sum;
    }
}

template <class V, class T, int G>
inline void simd_gather_dot_heads(const float * const * q, const char * b, size_t stride, const int32_t * idx, int n,
                                  int d, float * out, size_t ostride) {
    float o[G];
    for (int t = 0; t < n; ++t) {
        simd_dot_heads<V, T, G>(q, (const T *) (b + (size_t) idx[t] * stride), d, o);
        for (int h = 0; h < G; ++h) {
            out[(size_t) h * ostride + t] = o[h];
        }
    }
}

template <class V, class T>
void simd_gather_dot_g(const float * const * q, int g, const void * base, size_t stride, const int32_t * idx, int n,
                       int d, float * out, size_t ostride) {
    simd_head_passes(g, [&](int h0, auto G) {
        simd_gather_dot_heads<V, T, decltype(G)::value>(q + h0, (const char *) base, stride, idx, n, d,
                                                         out + (size_t) h0 * ostride, ostride);
    });
}

// NV vectors of each of G heads' y (from element off) held in registers over every row
template <class V, class T, int G, int NV>
inline void simd_gather_axpy_heads_tile(float * y, size_t ystride, const char * b, size_t stride, const int32_t * idx,
                                        const float * p, size_t pstride, int n, int off) {
    typename V::vf acc[G][NV];
    for (int h = 0; h < G; ++h) {
        for (int v = 0; v < NV; ++v) {
            acc[h][v] = V::load(y + (size_t) h * ystride + off + v * V::W);
        }
    }
    for (int t = 0; t < n; ++t) {
        const T * x = (const T *) (b + (size_t) idx[t] * stride) + off;
        typename V::vf xv[NV];
        for (int v = 0; v < NV; ++v) {
            xv[v] = V::load(x + v * V::W);
        }
        for (int h = 0; h < G; ++h) {
            const typename V::vf a = V::set1(p[(size_t) h * pstride + t]);
            for (int v = 0; v < NV; ++v) {
                acc[h][v] = V::fmadd(a, xv[v], acc[h][v]);
            }
        }
    }
    for (int h = 0; h < G; ++h) {
        for (int v = 0; v < NV; ++v) {
            V::store(y + (size_t) h * ystride + off + v * V::W, acc[h][v]);
        }
    }
}

// tiles of as many whole vectors as the registers hold for G heads (V::REGS: the ISA's vector
// registers), then the scalar tail
template <class V, class T, int G>
void simd_gather_axpy_heads(float * y, size_t ystride, const char * b, size_t stride, const int32_t * idx,
                            const float * p, size_t pstride, int n, int dv) {
    constexpr int NVMAX = std::max(1, std::min(8, (V::REGS - 1) / (G + 1)));
    int off = 0;
    while (off + V::W <= dv) {
        const int nv = std::min(NVMAX, (dv - off) / V::W);
        switch (nv) {
            case 8: if constexpr (NVMAX >= 8) { simd_gather_axpy_heads_tile<V, T, G, 8>(y, ystride, b, stride, idx, p, pstride, n, off); } break;
            case 7: if constexpr (NVMAX >= 7) { simd_gather_axpy_heads_tile<V, T, G, 7>(y, ystride, b, stride, idx, p, pstride, n, off); } break;
            case 6: if constexpr (NVMAX >= 6) { simd_gather_axpy_heads_tile<V, T, G, 6>(y, ystride, b, stride, idx, p, pstride, n, off); } break;
            case 5: if constexpr (NVMAX >= 5) { simd_gather_axpy_heads_tile<V, T, G, 5>(y, ystride, b, stride, idx, p, pstride, n, off); } break;
            case 4: if constexpr (NVMAX >= 4) { simd_gather_axpy_heads_tile<V, T, G, 4>(y, ystride, b, stride, idx, p, pstride, n, off); } break;
            case 3: if constexpr (NVMAX >= 3) { simd_gather_axpy_heads_tile<V, T, G, 3>(y, ystride, b, stride, idx, p, pstride, n, off); } break;
            case 2: if constexpr (NVMAX >= 2) { simd_gather_axpy_heads_tile<V, T, G, 2>(y, ystride, b, stride, idx, p, pstride, n, off); } break;
            default: simd_gather_axpy_heads_tile<V, T, G, 1>(y, ystride, b, stride, idx, p, pstride, n, off); break;
        }
        off += nv * V::W;
    }
    for (int h = 0; h < G; ++h) {
        float * yh = y + (size_t) h * ystride;
        for (int i = off; i < dv; ++i) {
            for (int t = 0; t < n; ++t) {
                yh[i] += p[(size_t) h * pstride + t] * simd_elem((const T *) (b + (size_t) idx[t] * stride) + i);
            }
        }
    }
}

template <class V, class T>
void simd_gather_axpy_g(float * y, size_t ystride, int g, const void * base, size_t stride, const int32_t * idx,
                        const float * p, size_t pstride, int n, int dv) {
    simd_head_passes(g, [&](int h0, auto G) {
        simd_gather_axpy_heads<V, T, decltype(G)::value>(y + (size_t) h0 * ystride, ystride, (const char *) base, stride,
                                                          idx, p + (size_t) h0 * pstride, pstride, n, dv);
    });
}

// q8_0 rows (a quantized cache): per block of 32 the product with the unscaled values in a vector,
// times the block's scale into the accumulator (one multiply per block, not per value)
template <class V>
float simd_dot_q8_0(const float * a, const sparq_block_q8_0 * b, int n) {
    typedef typename V::vf vf;
    constexpr int NV = SPARQ_QK / V::W;
    vf acc = V::zero();
    for (int ib = 0; ib < n / SPARQ_QK; ++ib, a += SPARQ_QK) {
        vf x[NV];
        V::load_q8(b[ib].qs, x);
        vf t = V::mul(V::load(a), x[0]);
        for (int i = 1; i < NV; ++i) {
            t = V::fmadd(V::load(a + i * V::W), x[i], t);
        }
        acc = V::fmadd(V::set1(V::half(b[ib].d)), t, acc);
    }
    return V::hsum(acc);
}

// y[i] += a * x[i] over q8_0 blocks: a times the block's scale, once per block
template <class V>
void simd_axpy_q8_0(float * y, const sparq_block_q8_0 * x, float a, int n) {
    typedef typename V::vf vf;
    constexpr int NV = SPARQ_QK / V::W;
    for (int ib = 0; ib < n / SPARQ_QK; ++ib, y += SPARQ_QK) {
        vf q[NV];
        V::load_q8(x[ib].qs, q);
        const vf s = V::set1(a * V::half(x[ib].d));
        for (int i = 0; i < NV; ++i) {
            V::store(y + i * V::W, V::fmadd(s, q[i], V::load(y + i * V::W)));
        }
    }
}

template <class V>
void simd_f16_to_f32(const uint16_t * x, float * y, int n) {
    int i = 0;
    for (; i + V::W <= n; i += V::W) {
        V::store(y + i, V::load(x + i));
    }
    for (; i < n; ++i) {
        y[i] = sparq_fp16_to_fp32(x[i]);
    }
}

// list_gather after a vector loop that stopped at i with m cells gathered: the reference goes on
// from i (and finds the stop, if any)
inline int simd_list_gather_rest(const float * ids, int n, int i, const int32_t * flag, int n_list, int base,
                                 int32_t * idx, int m, int * stop) {
    int s = 0;
    m += sparq_list_gather_ref(ids + i, n - i, flag, n_list, base + i, idx + m, &s);
    *stop = i + s;
    return m;
}

} // namespace
