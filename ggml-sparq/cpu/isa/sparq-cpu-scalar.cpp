// llama-sparq: scalar SparQ primitives. The portable fallback and the
// reference the SIMD variants are tested against (GGML_SPARQ_ISA=scalar, or
// ggml's reference mode).

#include "sparq-cpu.h"
#include "sparq-isa-simd.h" // its element loads only (simd_elem): no vectors here

#include <cmath>

// T: float, uint16_t (f16) or uint8_t (e5m2); fused, in the vector ISAs' order per output (the rows
// in turn), so every ISA's scores are the same bits
template <class T>
static void scalar_approx(const T * const * rows, int r, const float * qs, int g, int n, float * out) {
    for (int h = 0; h < g; ++h) {
        float * o = out + (size_t) h * n;
        for (int s = 0; s < n; ++s) {
            o[s] = 0.0f;
        }
        for (int j = 0; j < r; ++j) {
            const float w = qs[h * r + j];
            const T * x = rows[j];
            for (int s = 0; s < n; ++s) {
                o[s] = std::fma(w, simd_elem(x + s), o[s]);
            }
        }
    }
}

static void scalar_approx_f16(const uint16_t * const * rows, int r, const float * qs, int g, int n, float * out) {
    scalar_approx(rows, r, qs, g, n, out);
}

static void scalar_approx_f32(const float * const * rows, int r, const float * qs, int g, int n, float * out) {
    scalar_approx(rows, r, qs, g, n, out);
}

static void scalar_approx_e5m2(const uint8_t * const * rows, int r, const float * qs, int g, int n, float * out) {
    scalar_approx(rows, r, qs, g, n, out);
}

// fused as the vector ISAs' simd_approx_kt4, in the same order per output (the rows in turn)
static void scalar_approx_kt4(const uint8_t * const * rows, int c0, int r, const float * qs, int g, int n, float * out) {
    for (int h = 0; h < g; ++h) {
        float * o = out + (size_t) h * n;
        for (int s = 0; s < n; ++s) {
            o[s] = 0.0f;
        }
        for (int j = 0; j < r; ++j) {
            const float w = qs[h * r + j];
            for (int s = 0; s < n; ++s) {
                o[s] = std::fma(w, sparq_kt4_to_fp32(rows[j], c0 + s), o[s]);
            }
        }
    }
}

static float scalar_expsum(const float * x, int n, float m) {
    double sum = 0.0; // one accumulator: keep the long sum exact enough
    for (int i = 0; i < n; ++i) {
        sum += expf(x[i] - m);
    }
    return (float) sum;
}

static float scalar_expsum_store(const float * x, int n, float m, float * y) {
    double sum = 0.0;
    for (int i = 0; i < n; ++i) {
        y[i] = expf(x[i] - m);
        sum += y[i];
    }
    return (float) sum;
}

static void scalar_exp_acc(const float * x, int n, float m, float a, float * y) {
    for (int i = 0; i < n; ++i) {
        y[i] += a * expf(x[i] - m);
    }
}

static float scalar_max(const float * x, int n) {
    float m = -INFINITY;
    for (int i = 0; i < n; ++i) {
        m = x[i] > m ? x[i] : m;
    }
    return m;
}

// 8 partial sums, as the SIMD variants keep several lanes: shorter rounding chains
template <class T>
static float scalar_dot(const float * a, const T * b, int n) {
    float acc[8] = { 0 };
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int j = 0; j < 8; ++j) {
            acc[j] += a[i + j] * simd_elem(b + i + j);
        }
    }
    for (; i < n; ++i) {
        acc[i & 7] += a[i] * simd_elem(b + i);
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static float scalar_dot_f16(const float * a, const uint16_t * b, int n) { return scalar_dot(a, b, n); }
static float scalar_dot_f32(const float * a, const float * b, int n)    { return scalar_dot(a, b, n); }

template <class T>
static void scalar_axpy(float * y, const T * x, float a, int n) {
    for (int i = 0; i < n; ++i) {
        y[i] += a * simd_elem(x + i);
    }
}

static void scalar_axpy_f16(float * y, const uint16_t * x, float a, int n) { scalar_axpy(y, x, a, n); }
static void scalar_axpy_f32(float * y, const float * x, float a, int n)    { scalar_axpy(y, x, a, n); }

// q8_0 rows: per block the 8-sum product with the unscaled values, times the block's scale (the
// order the vector ISAs follow)
static float scalar_dot_q8_0(const float * a, const sparq_block_q8_0 * b, int n) {
    float sum = 0.0f;
    for (int ib = 0; ib < n / SPARQ_QK; ++ib, a += SPARQ_QK) {
        float acc[8] = { 0 };
        for (int i = 0; i < SPARQ_QK; ++i) {
            acc[i & 7] += a[i] * (float) b[ib].qs[i];
        }
        const float t = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        sum += sparq_fp16_to_fp32(b[ib].d) * t;
    }
    return sum;
}

static void scalar_axpy_q8_0(float * y, const sparq_block_q8_0 * x, float a, int n) {
    for (int ib = 0; ib < n / SPARQ_QK; ++ib, y += SPARQ_QK) {
        const float s = a * sparq_fp16_to_fp32(x[ib].d);
        for (int i = 0; i < SPARQ_QK; ++i) {
            y[i] += s * (float) x[ib].qs[i];
        }
    }
}

static void scalar_f16_to_f32(const uint16_t * x, float * y, int n) {
    for (int i = 0; i < n; ++i) {
        y[i] = sparq_fp16_to_fp32(x[i]);
    }
}

template <class T>
static void scalar_gather_dot(const float * q, const void * base, size_t stride, const int32_t * idx, int n, int d,
                              float * out) {
    for (int t = 0; t < n; ++t) {
        out[t] = scalar_dot(q, (const T *) ((const char *) base + (size_t) idx[t] * stride), d);
    }
}

template <class T>
static void scalar_gather_axpy(float * y, const void * base, size_t stride, const int32_t * idx, const float * p,
                               int n, int dv) {
    for (int t = 0; t < n; ++t) {
        scalar_axpy(y, (const T *) ((const char *) base + (size_t) idx[t] * stride), p[t], dv);
    }
}

static void scalar_gather_dot_f16(const float * q, const void * b, size_t st, const int32_t * idx, int n, int d,
                                  float * out) {
    scalar_gather_dot<uint16_t>(q, b, st, idx, n, d, out);
}
static void scalar_gather_dot_f32(const float * q, const void * b, size_t st, const int32_t * idx, int n, int d,
                                  float * out) {
    scalar_gather_dot<float>(q, b, st, idx, n, d, out);
}
static void scalar_gather_axpy_f16(float * y, const void * b, size_t st, const int32_t * idx, const float * p, int n,
                                   int dv) {
    scalar_gather_axpy<uint16_t>(y, b, st, idx, p, n, dv);
}
static void scalar_gather_axpy_f32(float * y, const void * b, size_t st, const int32_t * idx, const float * p, int n,
                                   int dv) {
    scalar_gather_axpy<float>(y, b, st, idx, p, n, dv);
}

// the g heads row by row (each row read once), per head scalar_dot's and scalar_axpy's operations
template <class T>
static void scalar_gather_dot_g(const float * const * q, int g, const void * base, size_t stride, const int32_t * idx,
                                int n, int d, float * out, size_t ostride) {
    for (int t = 0; t < n; ++t) {
        const T * row = (const T *) ((const char *) base + (size_t) idx[t] * stride);
        for (int h = 0; h < g; ++h) {
            out[(size_t) h * ostride + t] = scalar_dot(q[h], row, d);
        }
    }
}

template <class T>
static void scalar_gather_axpy_g(float * y, size_t ystride, int g, const void * base, size_t stride,
                                 const int32_t * idx, const float * p, size_t pstride, int n, int dv) {
    for (int t = 0; t < n; ++t) {
        const T * row = (const T *) ((const char *) base + (size_t) idx[t] * stride);
        for (int h = 0; h < g; ++h) {
            scalar_axpy(y + (size_t) h * ystride, row, p[(size_t) h * pstride + t], dv);
        }
    }
}

static void scalar_gather_dot_g_f16(const float * const * q, int g, const void * b, size_t st, const int32_t * idx,
                                    int n, int d, float * out, size_t os) {
    scalar_gather_dot_g<uint16_t>(q, g, b, st, idx, n, d, out, os);
}
static void scalar_gather_dot_g_f32(const float * const * q, int g, const void * b, size_t st, const int32_t * idx,
                                    int n, int d, float * out, size_t os) {
    scalar_gather_dot_g<float>(q, g, b, st, idx, n, d, out, os);
}
static void scalar_gather_axpy_g_f16(float * y, size_t ys, int g, const void * b, size_t st, const int32_t * idx,
                                     const float * p, size_t ps, int n, int dv) {
    scalar_gather_axpy_g<uint16_t>(y, ys, g, b, st, idx, p, ps, n, dv);
}
static void scalar_gather_axpy_g_f32(float * y, size_t ys, int g, const void * b, size_t st, const int32_t * idx,
                                     const float * p, size_t ps, int n, int dv) {
    scalar_gather_axpy_g<float>(y, ys, g, b, st, idx, p, ps, n, dv);
}

static int scalar_filter_gt(const float * x, int n, float t, int32_t * idx) {
    int m = 0;
    for (int i = 0; i < n; ++i) {
        if (x[i] > t) {
            idx[m++] = i;
        }
    }
    return m;
}

const struct sparq_isa sparq_isa_scalar = {
    "scalar",
    scalar_approx_f16, scalar_approx_f32, scalar_approx_e5m2, scalar_approx_kt4,
    scalar_expsum, scalar_expsum_store, scalar_exp_acc, scalar_max,
    scalar_dot_f16, scalar_dot_f32,
    scalar_axpy_f16, scalar_axpy_f32,
    scalar_dot_q8_0, scalar_axpy_q8_0,
    scalar_f16_to_f32,
    scalar_gather_dot_f16, scalar_gather_dot_f32,
    scalar_gather_axpy_f16, scalar_gather_axpy_f32,
    scalar_gather_dot_g_f16, scalar_gather_dot_g_f32,
    scalar_gather_axpy_g_f16, scalar_gather_axpy_g_f32,
    scalar_filter_gt,
    sparq_list_gather_ref,
};
