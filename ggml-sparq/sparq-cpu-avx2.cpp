// llama-sparq: AVX2 + FMA + F16C SparQ primitives.
// Compiled with -mavx2 -mfma -mf16c; only called when the CPU has them.

#include "sparq-cpu.h"

#if defined(__x86_64__) || defined(_M_X64)

#include <immintrin.h>
#include <cmath>

namespace {

inline __m256 load_f16(const uint16_t * p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) p));
}

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

inline float hmax(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// exp(x) for x <= 88.37; lanes below -87.33 (including -INF) give 0 (see the AVX-512 file)
inline __m256 exp_ps(__m256 x) {
    const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.33654f), _CMP_LT_OQ);
    x = _mm256_min_ps(x, _mm256_set1_ps(88.37626f));
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.33654f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 t = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    t = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), t);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(t, t), _mm256_add_ps(t, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

template <bool F16>
inline __m256 load(const void * row, int s) {
    return F16 ? load_f16((const uint16_t *) row + s) : _mm256_loadu_ps((const float *) row + s);
}

template <bool F16>
inline float elem(const void * row, int s) {
    return F16 ? sparq_fp16_to_fp32(((const uint16_t *) row)[s]) : ((const float *) row)[s];
}

// NH query heads, NV vectors of 8 cells per step; the tail is scalar
template <int NH, int NV, bool F16>
void approx_blk(const void * const * rows, int r, const float * qs, int n, float * out) {
    int s = 0;
    for (; s + 8 * NV <= n; s += 8 * NV) {
        __m256 acc[NH][NV];
        for (int h = 0; h < NH; ++h) {
            for (int v = 0; v < NV; ++v) {
                acc[h][v] = _mm256_setzero_ps();
            }
        }
        for (int j = 0; j < r; ++j) {
            __m256 x[NV];
            for (int v = 0; v < NV; ++v) {
                x[v] = load<F16>(rows[j], s + 8 * v);
            }
            for (int h = 0; h < NH; ++h) {
                const __m256 w = _mm256_set1_ps(qs[h * r + j]);
                for (int v = 0; v < NV; ++v) {
                    acc[h][v] = _mm256_fmadd_ps(w, x[v], acc[h][v]);
                }
            }
        }
        for (int h = 0; h < NH; ++h) {
            for (int v = 0; v < NV; ++v) {
                _mm256_storeu_ps(out + (size_t) h * n + s + 8 * v, acc[h][v]);
            }
        }
    }
    for (; s < n; ++s) {
        for (int h = 0; h < NH; ++h) {
            float acc = 0.0f;
            for (int j = 0; j < r; ++j) {
                acc += qs[h * r + j] * elem<F16>(rows[j], s);
            }
            out[(size_t) h * n + s] = acc;
        }
    }
}

template <bool F16>
void approx(const void * const * rows, int r, const float * qs, int g, int n, float * out) {
    if (g == 1) {
        approx_blk<1, 4, F16>(rows, r, qs, n, out);
        return;
    }
    for (int h0 = 0; h0 < g; h0 += 4) {
        const float * q = qs + (size_t) h0 * r;
        float * o = out + (size_t) h0 * n;
        switch (g - h0 >= 4 ? 4 : g - h0) {
            case 1: approx_blk<1, 2, F16>(rows, r, q, n, o); break;
            case 2: approx_blk<2, 2, F16>(rows, r, q, n, o); break;
            case 3: approx_blk<3, 2, F16>(rows, r, q, n, o); break;
            default: approx_blk<4, 2, F16>(rows, r, q, n, o); break;
        }
    }
}

void avx2_approx_f16(const uint16_t * const * rows, int r, const float * qs, int g, int n, float * out) {
    approx<true>((const void * const *) rows, r, qs, g, n, out);
}

void avx2_approx_f32(const float * const * rows, int r, const float * qs, int g, int n, float * out) {
    approx<false>((const void * const *) rows, r, qs, g, n, out);
}

float avx2_expsum(const float * x, int n, float m) {
    const __m256 vm = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        acc = _mm256_add_ps(acc, exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm)));
    }
    float sum = hsum(acc);
    for (; i < n; ++i) {
        sum += expf(x[i] - m);
    }
    return sum;
}

float avx2_max(const float * x, int n) {
    __m256 acc = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        acc = _mm256_max_ps(acc, _mm256_loadu_ps(x + i));
    }
    float m = hmax(acc);
    for (; i < n; ++i) {
        m = x[i] > m ? x[i] : m;
    }
    return m;
}

float avx2_dot_f16(const float * a, const uint16_t * b, int n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i),     load_f16(b + i),     acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load_f16(b + i + 8), acc1);
    }
    float sum = hsum(_mm256_add_ps(acc0, acc1));
    for (; i < n; ++i) {
        sum += a[i] * sparq_fp16_to_fp32(b[i]);
    }
    return sum;
}

float avx2_dot_f32(const float * a, const float * b, int n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i),     _mm256_loadu_ps(b + i),     acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    float sum = hsum(_mm256_add_ps(acc0, acc1));
    for (; i < n; ++i) {
        sum += a[i] * b[i];
    }
    return sum;
}

void avx2_axpy_f16(float * y, const uint16_t * x, float a, int n) {
    const __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load_f16(x + i), _mm256_loadu_ps(y + i)));
    }
    for (; i < n; ++i) {
        y[i] += a * sparq_fp16_to_fp32(x[i]);
    }
}

void avx2_axpy_f32(float * y, const float * x, float a, int n) {
    const __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    }
    for (; i < n; ++i) {
        y[i] += a * x[i];
    }
}

void avx2_f16_to_f32(const uint16_t * x, float * y, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, load_f16(x + i));
    }
    for (; i < n; ++i) {
        y[i] = sparq_fp16_to_fp32(x[i]);
    }
}

} // namespace

const struct sparq_isa sparq_isa_avx2 = {
    "avx2",
    avx2_approx_f16, avx2_approx_f32,
    avx2_expsum, avx2_max,
    avx2_dot_f16, avx2_dot_f32,
    avx2_axpy_f16, avx2_axpy_f32,
    avx2_f16_to_f32,
};

#endif
