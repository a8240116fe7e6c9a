// llama-sparq: NEON (AArch64 Advanced SIMD) SparQ primitives: the vector layer's wrappers for
// 4 floats (sparq-isa-simd.h) and NEON's own filter.

#include "sparq-cpu.h"

#if defined(__aarch64__)

#include "sparq-isa-simd.h"

#include <arm_neon.h>
#include <cmath>
#include <cstring>

namespace {

struct neon_vec {
    typedef float32x4_t vf;
    typedef uint32x4_t vmask;
    static constexpr int W = 4;
    static constexpr int REGS = 32; // vector registers
    static inline vf zero()                              { return vdupq_n_f32(0.0f); }
    static inline vf set1(float x)                       { return vdupq_n_f32(x); }
    static inline vf load(const float * p)               { return vld1q_f32(p); }
    static inline vf load(const uint16_t * p)            { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
    static inline vf load(const uint8_t * p) { // 4 e5m2 bytes (no read past them): each the upper byte of an f16
        uint32_t x;
        memcpy(&x, p, sizeof(x));
        const uint16x8_t h = vshll_n_u8(vcreate_u8((uint64_t) x), 8);
        return vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h)));
    }
    static inline void store(float * p, vf v)            { vst1q_f32(p, v); }
    static inline vf add(vf a, vf b)                     { return vaddq_f32(a, b); }
    static inline vf sub(vf a, vf b)                     { return vsubq_f32(a, b); }
    static inline vf mul(vf a, vf b)                     { return vmulq_f32(a, b); }
    static inline vf min(vf a, vf b)                     { return vminq_f32(a, b); }
    static inline vf max(vf a, vf b)                     { return vmaxq_f32(a, b); }
    static inline vf fmadd(vf a, vf b, vf c)             { return vfmaq_f32(c, a, b); }
    static inline vf fnmadd(vf a, vf b, vf c)            { return vfmsq_f32(c, a, b); }
    static inline vf round(vf x)                         { return vrndnq_f32(x); }
    static inline vf pow2i(vf n) {
        return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23));
    }
    static inline vmask lt(vf a, vf b)                   { return vcltq_f32(a, b); }
    static inline vf zero_where(vmask m, vf x)           { return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(x), m)); }
    static inline void prefetch(const void * p)          { __builtin_prefetch(p); }
    static inline float half(uint16_t h)                 { return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0); }
    static inline void load_q4(const uint8_t * qs, vf * x) {
        const uint8x16_t b = vld1q_u8(qs);
        const uint8x16_t nib[2] = { vandq_u8(b, vdupq_n_u8(0x0F)), vshrq_n_u8(b, 4) };
        for (int i = 0; i < 2; ++i) {
            const uint16x8_t lo = vmovl_u8(vget_low_u8(nib[i])), hi = vmovl_u8(vget_high_u8(nib[i]));
            x[4 * i + 0] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo)));
            x[4 * i + 1] = vcvtq_f32_u32(vmovl_u16(vget_high_u16(lo)));
            x[4 * i + 2] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi)));
            x[4 * i + 3] = vcvtq_f32_u32(vmovl_u16(vget_high_u16(hi)));
        }
    }
    static inline void kt4_block(const uint8_t * blk, vf * x) { simd_kt4_q4_block<neon_vec>(blk, x); }
    static constexpr int KT4_GROUPS = 1;
    static inline void kt4_group(const uint8_t * blk, int, vf * x) { kt4_block(blk, x); }
    static constexpr int kt4_cell(int, int v) { return v * W; }
    static inline void load_q8(const int8_t * qs, vf * x) {
        for (int i = 0; i < 2; ++i) {
            const int8x16_t b = vld1q_s8(qs + 16 * i);
            const int16x8_t lo = vmovl_s8(vget_low_s8(b)), hi = vmovl_s8(vget_high_s8(b));
            x[4 * i + 0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)));
            x[4 * i + 1] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo)));
            x[4 * i + 2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)));
            x[4 * i + 3] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi)));
        }
    }
    static inline float hsum(vf v)                       { return vaddvq_f32(v); }
    static inline float hmax(vf v)                       { return vmaxvq_f32(v); }
};

void neon_approx_f16(const uint16_t * const * rows, int r, const float * qs, int g, int n, float * out) {
    simd_approx<neon_vec>(rows, r, qs, g, n, out);
}

void neon_approx_f32(const float * const * rows, int r, const float * qs, int g, int n, float * out) {
    simd_approx<neon_vec>(rows, r, qs, g, n, out);
}

void neon_approx_e5m2(const uint8_t * const * rows, int r, const float * qs, int g, int n, float * out) {
    simd_approx<neon_vec>(rows, r, qs, g, n, out);
}

void neon_approx_kt4(const uint8_t * const * rows, int c0, int r, const float * qs, int g, int n, float * out) {
    simd_approx_kt4<neon_vec>(rows, c0, r, qs, g, n, out);
}

float neon_expsum(const float * x, int n, float m)                  { return simd_expsum<neon_vec>(x, n, m); }
float neon_expsum_store(const float * x, int n, float m, float * y) { return simd_expsum_store<neon_vec>(x, n, m, y); }
void  neon_exp_acc(const float * x, int n, float m, float a, float * y) { simd_exp_acc<neon_vec>(x, n, m, a, y); }
float neon_max(const float * x, int n)                              { return simd_max<neon_vec>(x, n); }
float neon_dot_f16(const float * a, const uint16_t * b, int n)      { return simd_dot<neon_vec>(a, b, n); }
float neon_dot_f32(const float * a, const float * b, int n)         { return simd_dot<neon_vec>(a, b, n); }
void  neon_axpy_f16(float * y, const uint16_t * x, float a, int n)  { simd_axpy<neon_vec>(y, x, a, n); }
void  neon_axpy_f32(float * y, const float * x, float a, int n)     { simd_axpy<neon_vec>(y, x, a, n); }
float neon_dot_q8_0(const float * a, const sparq_block_q8_0 * b, int n)  { return simd_dot_q8_0<neon_vec>(a, b, n); }
void  neon_axpy_q8_0(float * y, const sparq_block_q8_0 * x, float a, int n) { simd_axpy_q8_0<neon_vec>(y, x, a, n); }
void  neon_f16_to_f32(const uint16_t * x, float * y, int n)         { simd_f16_to_f32<neon_vec>(x, y, n); }

int neon_filter_gt(const float * x, int n, float t, int32_t * idx) {
    const float32x4_t vt = vdupq_n_f32(t);
    int m = 0, i = 0;
    for (; i + 4 <= n; i += 4) {
        if (vmaxvq_u32(vcgtq_f32(vld1q_f32(x + i), vt))) {
            for (int j = 0; j < 4; ++j) {
                idx[m] = i + j; // written always, kept or not without a branch (room: see sparq_isa)
                m += x[i + j] > t ? 1 : 0;
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
    neon_approx_f16, neon_approx_f32, neon_approx_e5m2, neon_approx_kt4,
    neon_expsum, neon_expsum_store, neon_exp_acc, neon_max,
    neon_dot_f16, neon_dot_f32,
    neon_axpy_f16, neon_axpy_f32,
    neon_dot_q8_0, neon_axpy_q8_0,
    neon_f16_to_f32,
    simd_gather_dot<neon_vec, uint16_t>, simd_gather_dot<neon_vec, float>,
    simd_gather_axpy<neon_vec, uint16_t>, simd_gather_axpy<neon_vec, float>,
    simd_gather_dot_g<neon_vec, uint16_t>, simd_gather_dot_g<neon_vec, float>,
    simd_gather_axpy_g<neon_vec, uint16_t>, simd_gather_axpy_g<neon_vec, float>,
    neon_filter_gt,
    sparq_list_gather_ref,
};

#endif
