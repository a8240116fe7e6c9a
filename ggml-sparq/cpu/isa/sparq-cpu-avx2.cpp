// llama-sparq: AVX2 + FMA + F16C SparQ primitives: the vector layer's wrappers for 8 floats
// (sparq-isa-simd.h) and AVX2's own filter and gather.
// Compiled with -mavx2 -mfma -mf16c; only called when the CPU has them.

#include "sparq-cpu.h"

#if defined(__x86_64__) || defined(_M_X64)

#include "sparq-isa-simd.h"

#include <immintrin.h>
#include <cmath>
#include <utility>

namespace {

struct avx2_vec {
    typedef __m256 vf;
    typedef __m256 vmask;
    static constexpr int W = 8;
    static constexpr int REGS = 16; // vector registers
    static inline vf zero()                              { return _mm256_setzero_ps(); }
    static inline vf set1(float x)                       { return _mm256_set1_ps(x); }
    static inline vf load(const float * p)               { return _mm256_loadu_ps(p); }
    static inline vf load(const uint16_t * p)            { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) p)); }
    static inline vf load(const uint8_t * p) { // 8 e5m2 bytes: each the upper byte of an f16
        return _mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *) p)), 8));
    }
    static inline void store(float * p, vf v)            { _mm256_storeu_ps(p, v); }
    static inline vf add(vf a, vf b)                     { return _mm256_add_ps(a, b); }
    static inline vf sub(vf a, vf b)                     { return _mm256_sub_ps(a, b); }
    static inline vf mul(vf a, vf b)                     { return _mm256_mul_ps(a, b); }
    static inline vf min(vf a, vf b)                     { return _mm256_min_ps(a, b); }
    static inline vf max(vf a, vf b)                     { return _mm256_max_ps(a, b); }
    static inline vf fmadd(vf a, vf b, vf c)             { return _mm256_fmadd_ps(a, b, c); }
    static inline vf fnmadd(vf a, vf b, vf c)            { return _mm256_fnmadd_ps(a, b, c); }
    static inline vf round(vf x)                         { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
    static inline vf pow2i(vf n) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
    }
    static inline vmask lt(vf a, vf b)                   { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
    static inline vf zero_where(vmask m, vf x)           { return _mm256_andnot_ps(m, x); }
    static inline void prefetch(const void * p)          { _mm_prefetch((const char *) p, _MM_HINT_T0); }
    static inline float half(uint16_t h)                 { return _cvtsh_ss(h); }
    // 8 bytes of nibbles: cells 8 grp .. 8 grp + 7 (low nibbles) and 16 + 8 grp .. (high), so a tile
    // of 3 heads fits the 16 registers with 2 vectors of a block at a time, each decoded once
    static constexpr int KT4_GROUPS = 2;
    static inline void kt4_group(const uint8_t * blk, int grp, vf * x) {
        // f16 d, f16 m: loaded as 4 pairs, converted once, each spread to 8 lanes
        const vf pairs = _mm256_cvtph_ps(_mm_castps_si128(_mm_broadcast_ss((const float *) blk)));
        const vf vd = _mm256_moveldup_ps(pairs), vm = _mm256_movehdup_ps(pairs);
        const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *) (blk + 4 + 8 * grp)));
        x[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(0x0F))), vd, vm);
        x[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)), vd, vm);
    }
    static constexpr int kt4_cell(int grp, int v) { return 16 * v + 8 * grp; }
    // the block's cells in order: its two groups, cells 0, 16 and 8, 24 (only a chunk's cut ends:
    // out of line, so that the tiles' code around it stays as laid out)
    static __attribute__((noinline)) void kt4_block(const uint8_t * blk, vf * x) {
        kt4_group(blk, 0, x);
        kt4_group(blk, 1, x + 2);
        std::swap(x[1], x[2]);
    }
    static inline void load_q8(const int8_t * qs, vf * x) {
        for (int i = 0; i < 4; ++i) {
            x[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *) (qs + 8 * i))));
        }
    }
    static inline float hsum(vf v) {
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        return _mm_cvtss_f32(s);
    }
    static inline float hmax(vf v) {
        __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        s = _mm_max_ps(s, _mm_movehl_ps(s, s));
        s = _mm_max_ss(s, _mm_movehdup_ps(s));
        return _mm_cvtss_f32(s);
    }
};

void avx2_approx_f16(const uint16_t * const * rows, int r, const float * qs, int g, int n, float * out) {
    simd_approx<avx2_vec>(rows, r, qs, g, n, out);
}

void avx2_approx_f32(const float * const * rows, int r, const float * qs, int g, int n, float * out) {
    simd_approx<avx2_vec>(rows, r, qs, g, n, out);
}

void avx2_approx_e5m2(const uint8_t * const * rows, int r, const float * qs, int g, int n, float * out) {
    simd_approx<avx2_vec>(rows, r, qs, g, n, out);
}

void avx2_approx_kt4(const uint8_t * const * rows, int c0, int r, const float * qs, int g, int n, float * out) {
    simd_approx_kt4<avx2_vec>(rows, c0, r, qs, g, n, out);
}

float avx2_expsum(const float * x, int n, float m)                  { return simd_expsum<avx2_vec>(x, n, m); }
float avx2_expsum_store(const float * x, int n, float m, float * y) { return simd_expsum_store<avx2_vec>(x, n, m, y); }
void  avx2_exp_acc(const float * x, int n, float m, float a, float * y) { simd_exp_acc<avx2_vec>(x, n, m, a, y); }
float avx2_max(const float * x, int n)                              { return simd_max<avx2_vec>(x, n); }
float avx2_dot_f16(const float * a, const uint16_t * b, int n)      { return simd_dot<avx2_vec>(a, b, n); }
float avx2_dot_f32(const float * a, const float * b, int n)         { return simd_dot<avx2_vec>(a, b, n); }
void  avx2_axpy_f16(float * y, const uint16_t * x, float a, int n)  { simd_axpy<avx2_vec>(y, x, a, n); }
void  avx2_axpy_f32(float * y, const float * x, float a, int n)     { simd_axpy<avx2_vec>(y, x, a, n); }
float avx2_dot_q8_0(const float * a, const sparq_block_q8_0 * b, int n)  { return simd_dot_q8_0<avx2_vec>(a, b, n); }
void  avx2_axpy_q8_0(float * y, const sparq_block_q8_0 * x, float a, int n) { simd_axpy_q8_0<avx2_vec>(y, x, a, n); }
void  avx2_f16_to_f32(const uint16_t * x, float * y, int n)         { simd_f16_to_f32<avx2_vec>(x, y, n); }

// per 8-lane mask, its lanes in order (and how many): a loop over the set bits mispredicted about
// once per vector at the densities a chunk's candidates have
struct avx2_filter_lut {
    alignas(32) int32_t lane[256][8];
    uint8_t count[256];
    constexpr avx2_filter_lut() : lane(), count() {
        for (int mk = 0; mk < 256; ++mk) {
            int k = 0;
            for (int j = 0; j < 8; ++j) {
                if ((mk >> j) & 1) {
                    lane[mk][k++] = j;
                }
            }
            count[mk] = (uint8_t) k;
        }
    }
};
constexpr avx2_filter_lut filter_lut{};

int avx2_filter_gt(const float * x, int n, float t, int32_t * idx) {
    const __m256 vt = _mm256_set1_ps(t);
    int m = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        const unsigned gt = (unsigned) _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vt, _CMP_GT_OQ));
        const __m256i l = _mm256_load_si256((const __m256i *) filter_lut.lane[gt]);
        _mm256_storeu_si256((__m256i *) (idx + m), _mm256_add_epi32(l, _mm256_set1_epi32(i))); // (room: see sparq_isa)
        m += filter_lut.count[gt];
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
    return simd_list_gather_rest(ids, n, i, flag, n_list, base, idx, m, stop);
}

} // namespace

const struct sparq_isa sparq_isa_avx2 = {
    "avx2",
    avx2_approx_f16, avx2_approx_f32, avx2_approx_e5m2, avx2_approx_kt4,
    avx2_expsum, avx2_expsum_store, avx2_exp_acc, avx2_max,
    avx2_dot_f16, avx2_dot_f32,
    avx2_axpy_f16, avx2_axpy_f32,
    avx2_dot_q8_0, avx2_axpy_q8_0,
    avx2_f16_to_f32,
    simd_gather_dot<avx2_vec, uint16_t>, simd_gather_dot<avx2_vec, float>,
    simd_gather_axpy<avx2_vec, uint16_t>, simd_gather_axpy<avx2_vec, float>,
    simd_gather_dot_g<avx2_vec, uint16_t>, simd_gather_dot_g<avx2_vec, float>,
    simd_gather_axpy_g<avx2_vec, uint16_t>, simd_gather_axpy_g<avx2_vec, float>,
    avx2_filter_gt,
    avx2_list_gather,
};

#endif
