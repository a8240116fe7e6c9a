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

// Row-major accumulation as in the AVX-512 file: out (g x n) += w_j * row_j, two rows
// at a time, with the rows' next block prefetched; the tail (n % 16) is scalar.
template <bool F16>
void approx(const void * const * rows, int r, const float * qs, int g, int n, float * out) {
    const size_t esz = F16 ? 2 : 4;
    for (int i = 0; i < g * n; ++i) {
        out[i] = 0.0f;
    }
    const int nv = n & ~15;
    for (int j = 0; j < r; j += 2) {
        const bool two = j + 1 < r;
        const void * ra = rows[j];
        const void * rb = rows[two ? j + 1 : j];
        for (int s = 0; s < nv; s += 16) {
            _mm_prefetch((const char *) ra + (size_t) (s + n) * esz, _MM_HINT_T0);
            _mm_prefetch((const char *) rb + (size_t) (s + n) * esz, _MM_HINT_T0);
            const __m256 a0 = load<F16>(ra, s), a1 = load<F16>(ra, s + 8);
            const __m256 b0 = two ? load<F16>(rb, s) : _mm256_setzero_ps();
            const __m256 b1 = two ? load<F16>(rb, s + 8) : _mm256_setzero_ps();
            for (int h = 0; h < g; ++h) {
                const __m256 wa = _mm256_set1_ps(qs[h * r + j]);
                const __m256 wb = _mm256_set1_ps(two ? qs[h * r + j + 1] : 0.0f);
                float * o = out + (size_t) h * n + s;
                _mm256_storeu_ps(o,     _mm256_fmadd_ps(wb, b0, _mm256_fmadd_ps(wa, a0, _mm256_loadu_ps(o))));
                _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(wb, b1, _mm256_fmadd_ps(wa, a1, _mm256_loadu_ps(o + 8))));
            }
        }
        for (int s = nv; s < n; ++s) {
            const float xa = elem<F16>(ra, s), xb = two ? elem<F16>(rb, s) : 0.0f;
            for (int h = 0; h < g; ++h) {
                out[(size_t) h * n + s] += qs[h * r + j] * xa + (two ? qs[h * r + j + 1] * xb : 0.0f);
            }
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

void avx2_exp_acc(const float * x, int n, float m, float a, float * y) {
    const __m256 vm = _mm256_set1_ps(m), va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, e, _mm256_loadu_ps(y + i)));
    }
    for (; i < n; ++i) {
        y[i] += a * expf(x[i] - m);
    }
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

int avx2_filter_gt(const float * x, int n, float t, int32_t * idx) {
    const __m256 vt = _mm256_set1_ps(t);
    int m = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        unsigned gt = (unsigned) _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vt, _CMP_GT_OQ));
        while (gt) {
            idx[m++] = i + __builtin_ctz(gt);
            gt &= gt - 1;
        }
    }
    for (; i < n; ++i) {
        if (x[i] > t) {
            idx[m++] = i;
        }
    }
    return m;
}

// 8 ids at a time: converted, range-checked, their flags gathered; the hits' indices one by one
int avx2_list_gather(const float * ids, int n, const int32_t * flag, int n_list, int base, int32_t * idx, int * stop) {
    const __m256i hi = _mm256_set1_epi32(n_list), zero = _mm256_setzero_si256();
    int m = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i li = _mm256_cvttps_epi32(_mm256_loadu_ps(ids + i));
        // in [0, n_list) (NaN and -1 are not: cvtt gives INT_MIN or -1)
        const __m256i ok = _mm256_andnot_si256(_mm256_cmpgt_epi32(zero, li), _mm256_cmpgt_epi32(hi, li));
        if (_mm256_movemask_ps(_mm256_castsi256_ps(ok)) != 0xff) {
            break; // the scalar pass below finds the stop
        }
        const __m256i f = _mm256_i32gather_epi32((const int *) flag, li, 4);
        unsigned hit = ~(unsigned) _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(f, zero))) & 0xffu;
        while (hit) {
            idx[m++] = base + i + __builtin_ctz(hit);
            hit &= hit - 1;
        }
    }
    int s = 0;
    m += sparq_list_gather_ref(ids + i, n - i, flag, n_list, base + i, idx + m, &s);
    *stop = i + s;
    return m;
}

} // namespace

const struct sparq_isa sparq_isa_avx2 = {
    "avx2",
    avx2_approx_f16, avx2_approx_f32,
    avx2_expsum, avx2_exp_acc, avx2_max,
    avx2_dot_f16, avx2_dot_f32,
    avx2_axpy_f16, avx2_axpy_f32,
    avx2_f16_to_f32,
    avx2_filter_gt,
    avx2_list_gather,
};

#endif
