// llama-sparq: NEON (AArch64 Advanced SIMD) SparQ primitives.

#include "sparq-cpu.h"

#if defined(__aarch64__)

#include <arm_neon.h>
#include <cmath>

namespace {

inline float32x4_t load_f16(const uint16_t * p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}

// exp(x) for x <= 88.37; lanes below -87.33 (including -INF) give 0 (see the AVX-512 file)
inline float32x4_t exp_ps(float32x4_t x) {
    const uint32x4_t tiny = vcltq_f32(x, vdupq_n_f32(-87.33654f));
    x = vminq_f32(x, vdupq_n_f32(88.37626f));
    x = vmaxq_f32(x, vdupq_n_f32(-87.33654f));
    const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
    float32x4_t t = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    t = vfmsq_f32(t, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, t);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, t);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, t);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, t);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, t);
    p = vfmaq_f32(vaddq_f32(t, vdupq_n_f32(1.0f)), p, vmulq_f32(t, t));
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    const float32x4_t r = vmulq_f32(p, vreinterpretq_f32_s32(e));
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(r), tiny));
}

template <bool F16>
inline float32x4_t load(const void * row, int s) {
    return F16 ? load_f16((const uint16_t *) row + s) : vld1q_f32((const float *) row + s);
}

template <bool F16>
inline float elem(const void * row, int s) {
    return F16 ? sparq_fp16_to_fp32(((const uint16_t *) row)[s]) : ((const float *) row)[s];
}

// Row-major accumulation as in the AVX-512 file: out (g x n) += w_j * row_j, two rows
// at a time, with the rows' next block prefetched; the tail (n % 8) is scalar.
template <bool F16>
void approx(const void * const * rows, int r, const float * qs, int g, int n, float * out) {
    const size_t esz = F16 ? 2 : 4;
    for (int i = 0; i < g * n; ++i) {
        out[i] = 0.0f;
    }
    const int nv = n & ~7;
    for (int j = 0; j < r; j += 2) {
        const bool two = j + 1 < r;
        const void * ra = rows[j];
        const void * rb = rows[two ? j + 1 : j];
        for (int s = 0; s < nv; s += 8) {
            __builtin_prefetch((const char *) ra + (size_t) (s + n) * esz);
            __builtin_prefetch((const char *) rb + (size_t) (s + n) * esz);
            const float32x4_t a0 = load<F16>(ra, s), a1 = load<F16>(ra, s + 4);
            const float32x4_t b0 = two ? load<F16>(rb, s) : vdupq_n_f32(0.0f);
            const float32x4_t b1 = two ? load<F16>(rb, s + 4) : vdupq_n_f32(0.0f);
            for (int h = 0; h < g; ++h) {
                const float wa = qs[h * r + j];
                const float wb = two ? qs[h * r + j + 1] : 0.0f;
                float * o = out + (size_t) h * n + s;
                vst1q_f32(o,     vfmaq_n_f32(vfmaq_n_f32(vld1q_f32(o),     a0, wa), b0, wb));
                vst1q_f32(o + 4, vfmaq_n_f32(vfmaq_n_f32(vld1q_f32(o + 4), a1, wa), b1, wb));
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

void neon_approx_f16(const uint16_t * const * rows, int r, const float * qs, int g, int n, float * out) {
    approx<true>((const void * const *) rows, r, qs, g, n, out);
}

void neon_approx_f32(const float * const * rows, int r, const float * qs, int g, int n, float * out) {
    approx<false>((const void * const *) rows, r, qs, g, n, out);
}

float neon_expsum(const float * x, int n, float m) {
    const float32x4_t vm = vdupq_n_f32(m);
    float32x4_t acc = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        acc = vaddq_f32(acc, exp_ps(vsubq_f32(vld1q_f32(x + i), vm)));
    }
    float sum = vaddvq_f32(acc);
    for (; i < n; ++i) {
        sum += expf(x[i] - m);
    }
    return sum;
}

void neon_exp_acc(const float * x, int n, float m, float a, float * y) {
    const float32x4_t vm = vdupq_n_f32(m);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t e = exp_ps(vsubq_f32(vld1q_f32(x + i), vm));
        vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), e, a));
    }
    for (; i < n; ++i) {
        y[i] += a * expf(x[i] - m);
    }
}

float neon_max(const float * x, int n) {
    float32x4_t acc = vdupq_n_f32(-INFINITY);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        acc = vmaxq_f32(acc, vld1q_f32(x + i));
    }
    float m = vmaxvq_f32(acc);
    for (; i < n; ++i) {
        m = x[i] > m ? x[i] : m;
    }
    return m;
}

float neon_dot_f16(const float * a, const uint16_t * b, int n) {
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        acc0 = vfmaq_f32(acc0, vld1q_f32(a + i),     load_f16(b + i));
        acc1 = vfmaq_f32(acc1, vld1q_f32(a + i + 4), load_f16(b + i + 4));
    }
    float sum = vaddvq_f32(vaddq_f32(acc0, acc1));
    for (; i < n; ++i) {
        sum += a[i] * sparq_fp16_to_fp32(b[i]);
    }
    return sum;
}

float neon_dot_f32(const float * a, const float * b, int n) {
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        acc0 = vfmaq_f32(acc0, vld1q_f32(a + i),     vld1q_f32(b + i));
        acc1 = vfmaq_f32(acc1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
    }
    float sum = vaddvq_f32(vaddq_f32(acc0, acc1));
    for (; i < n; ++i) {
        sum += a[i] * b[i];
    }
    return sum;
}

void neon_axpy_f16(float * y, const uint16_t * x, float a, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), load_f16(x + i), a));
    }
    for (; i < n; ++i) {
        y[i] += a * sparq_fp16_to_fp32(x[i]);
    }
}

void neon_axpy_f32(float * y, const float * x, float a, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), a));
    }
    for (; i < n; ++i) {
        y[i] += a * x[i];
    }
}

void neon_f16_to_f32(const uint16_t * x, float * y, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        vst1q_f32(y + i, load_f16(x + i));
    }
    for (; i < n; ++i) {
        y[i] = sparq_fp16_to_fp32(x[i]);
    }
}

int neon_filter_gt(const float * x, int n, float t, int32_t * idx) {
    const float32x4_t vt = vdupq_n_f32(t);
    int m = 0, i = 0;
    for (; i + 4 <= n; i += 4) {
        if (vmaxvq_u32(vcgtq_f32(vld1q_f32(x + i), vt))) {
            for (int j = 0; j < 4; ++j) {
                if (x[i + j] > t) {
                    idx[m++] = i + j;
                }
            }
        }
    }
    for (; i < n; ++i) {
        if (x[i] > t) {
            idx[m++] = i;
        }
    }
    return m;
}

} // namespace

const struct sparq_isa sparq_isa_neon = {
    "neon",
    neon_approx_f16, neon_approx_f32,
    neon_expsum, neon_exp_acc, neon_max,
    neon_dot_f16, neon_dot_f32,
    neon_axpy_f16, neon_axpy_f32,
    neon_f16_to_f32,
    neon_filter_gt,
    sparq_list_gather_ref,
};

#endif
