// llama-sparq: what every CUDA kernel of GGML_OP_SPARQ_ATTN shares: the limits and block sizes,
// the per-row, per-list and argument structs, the element loads, the key order, the mask lookups
// and the block-wide scan and reductions. The includer provides the CUDA names (sparq-cuda-kernels.cuh).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "ggml-sparq-kt4.h"
#include "sparq-cuda-limits.h"

#define SPARQ_NT     256              // threads per block of every kernel
#define SPARQ_NW     (SPARQ_NT / 32)  // warps per block
#define SPARQ_TS_CPT 16               // cells per thread of a selection tile
#define SPARQ_TS     (SPARQ_NT * SPARQ_TS_CPT)

// The selection's first pass counts a list's keys by their top SPARQ_NB_BITS bits (the sign, the
// exponent and 3 mantissa bits of the float: an octave in 8 bins), so that the bin holding the
// k-th largest key holds few cells; the cells of that bin are then ranked in shared memory
// (SPARQ_CAND_MAX of them at most; more fall back to radix passes over the list).
#define SPARQ_NB_BITS  12
#define SPARQ_NB       (1 << SPARQ_NB_BITS)
#define SPARQ_NB_SHIFT (32 - SPARQ_NB_BITS)
#define SPARQ_CAND_MAX (SPARQ_NB / 2)
// a fixed k's candidates per selection tile: the tile's cells in the bins from its own crossing of
// the row's k up (more in one list, rare, fall back to a pass over the list's every cell)
#define SPARQ_TILE_CAND 512

// per query row
struct sparq_cu_row {
    int n_valid; // cells the row may see
    int w0;      // candidates are the cells < w0 (the start of the tail window; S with a given window)
    int n_win;   // window cells (valid, distinct)
    int mode;    // 0 SparQ, 1 dense (n_valid <= the row's k), 2 dense stream (v_count < 0)
};

// per list: where its selection stands (the bound's key bits found so far and what is still wanted)
struct sparq_cu_pick {
    unsigned int prefix; // the bound's key bits found so far
    int shift;           // the bound is on key >> shift
    int want;            // cells still wanted among those with (key >> shift) == (prefix >> shift)
    int n_eq;            // cells with (key >> shift) == (prefix >> shift)
    int all;             // every eligible cell is chosen
    int done;
    int ties;            // n_eq > want at shift 0: the lowest cell indices among equal keys
};

struct sparq_cu_args {
    int d, dv, n_kv, n_rows, n_head, n_head_kv, n_stream, g, ph;
    int r, k, l, no_mean_v;
    float scale;
    // the calibrated k (cov_p > 0): each list keeps the fewest best cells which, with the window,
    // hold cov_p of the estimated attention mass, at least k_min cells in all and at most the row's
    // cap (min(k, max(k_min, ceil(k_frac * n_valid))) with k_frac > 0, else k); a unit whose target
    // needs more than the cap attends over every valid cell
    float cov_p, k_frac;
    int k_min;
    // the approximate bucketed top-k (a fixed k): a cell's bucket is its index mod buckets, each
    // bucket offers its best eligible cell, the list chooses the best offers; min(topk_buckets, S)
    // (cells below S fall in the same buckets), 0: the exact top-k
    int buckets;
    int R, U, L, W, nt_a, tl_a, nt_s, sel_max;
    // the attention variants (ggml_sparq_attn_params; docs/algorithm.md): every logit, approximate
    // and exact, capped to softcap * tanh(x / softcap) (softcap > 0), then the mask added times the
    // head's ALiBi slope (max_bias > 0; else 1); sinks [n_head] (NULL: none): a logit per query head
    // with a zero value row in every softmax's denominator; kq_b [n_kv, n_rows, n_head, 1 or n_stream]
    // (NULL: none, rows of floats): scale times its value added after the cap, before the mask
    float softcap, max_bias;
    const float * sinks;
    const char * kq_b; size_t kb_nb1, kb_nb2, kb_nb3; int kb_ne3;
    // the layer's tickets: only the experimental build's one launch per layer counts in them
    // (experimental/sparq-cuda-exp-fused.cuh)
    unsigned int * tickets; // [GGML_CUDA_SPARQ_TICKETS] persistent, zero between launches, or NULL

    const char * q;  size_t q_nb1, q_nb2, q_nb3;
    const char * qs; size_t qs_nb1, qs_nb2, qs_nb3;     // q_sel, or q
    const char * cw; size_t cw_nb1, cw_nb2;             // comp_w or NULL (nb2 0: shared by the streams)
    const char * K;  size_t K_nb1, K_nb2, K_nb3;
    const char * KT; size_t KT_nb1, KT_nb2, KT_nb3;
    const char * V;  size_t V_nb1, V_nb2, V_nb3;
    const char * v_sum; size_t vs_nb1, vs_nb2;
    const float * v_count;
    const char * mask; int mask_f16; size_t m_nb1, m_nb3; int m_ne3;
    const char * win; size_t win_nb1, win_nb2; int win_n;
    char * out; size_t o_nb1, o_nb2, o_nb3;

    // scratch (ggml's CUDA pool); every kernel zeroes what a later one accumulates into, so nothing
    // is cleared between launches
    sparq_cu_row  * rows;    // [R]                 (select; [U] in the experimental one launch)
    unsigned int  * wbits;   // [R][W] the given window's cells (zeroed by score, set by select; [U][W] in the
                             // experimental one launch)
    float         * logits;  // [U][g][S] approximate logits + mask (score)
    float2        * tstat;   // [U][nt_a][g] per score tile: max, sum exp(x - max) (score)
    int           * tcnt;    // [U][nt_a] per score tile: the row's valid cells (score)
    float         * keys;    // [U][S] group keys (g > 1, shared choice; select)
    unsigned int  * hist;    // [L][SPARQ_NB] eligible cells per first-pass bin (zeroed by score)
    double        * hmass;   // [L][SPARQ_NB] their estimated mass (the calibrated k; zeroed by score)
    unsigned int  * ldone;   // [L] select's tiles finished per list (zeroed by score)
    uint2         * cand;    // [L][nt_s * SPARQ_TILE_CAND] a fixed k's candidates: key bits, cell (select;
                             // the experimental score tiles' layout: experimental/sparq-cuda-exp-score.cuh)
    unsigned int  * ncand;   // [L] their count (zeroed by score)
    unsigned long long * bk; // [L][buckets] each bucket's best offer: key bits << 32 | ~cell, 0 none
                             // (zeroed by score, set by select)
    unsigned int  * udone;   // [U] attend's parts finished per unit (zeroed by score)
    unsigned int  * selbits; // [U][W] the chosen cells (zeroed by score)
    int           * sel;     // [U][sel_max]
    float         * pstat;   // [U][n_part][g][3] per part of a split attend: max, sum, approximate mass
    float         * py;      // [U][n_part][g][dv] per part of a split attend: unnormalised values
    // the report (GGML_SPARQ_FEAT_REPORT; NULL: none), as the CPU op's: per (stream, KV head) what
    // the stream's last row did, 4 floats {cells attended (-1: dense), estimated coverage (mean over
    // the group's heads), cells reaching cov_p (window included; -1 without cov_p; for a diffuse
    // unit a lower bound), 1 if reached within the cap else 0}; the launch copies it to the host
    float         * report;  // [n_stream][n_head_kv][4] (attend)
    int           * lrep;    // [L][2] the calibrated k per list: cells reaching the target (-1: not
                             // measured), 1 if within the cap (select; with report only)
};

// the most cells a row of n_valid valid cells attends before it runs dense: k, or with a per-row
// cap (k_frac, the calibrated k) the row's own, which depends on its stream only
static __device__ __forceinline__ int sparq_row_k(const sparq_cu_args & a, int n_valid) {
    if (a.k_frac <= 0.0f) {
        return a.k;
    }
    const double cap = ceil((double) a.k_frac * (double) n_valid);
    return (int) fmin((double) a.k, fmax((double) a.k_min, cap));
}

// ---------------------------------------------------------------------------
// small helpers
// ---------------------------------------------------------------------------

template <typename T> static __device__ __forceinline__ float sq_ld(const T * p);
template <> __device__ __forceinline__ float sq_ld<half>(const half * p) { return __half2float(*p); }
template <> __device__ __forceinline__ float sq_ld<float>(const float * p) { return *p; }

// K^T's element types (the score kernel's TKT: float, half, uint8_t, sparq_cu_kt4)
enum sparq_cu_kt { SPARQ_CU_KT_F32 = 0, SPARQ_CU_KT_F16 = 1, SPARQ_CU_KT_E5M2 = 2, SPARQ_CU_KT_KT4 = 3 };

// the 4-bit K^T's tag (ggml-sparq-kt4.h: q4_1 blocks of 32 cells along a row): no element of its own
struct sparq_cu_kt4 {};

// an e5m2 byte (an 8-bit K^T): the upper byte of an f16
static __device__ __forceinline__ float sq_e5m2(unsigned int b) {
    return __half2float(__ushort_as_half((unsigned short) (b << 8)));
}

// N consecutive values from p (aligned to N elements, at most 16 bytes per load)
template <typename T, int N>
static __device__ __forceinline__ void sq_ldv(const T * p, float * v) {
    if constexpr (std::is_same_v<T, uint8_t>) {
        // e5m2: N bytes in one load, byte i of the words the i-th value (little-endian)
        unsigned int w[2] = { 0u, 0u };
        if constexpr (N == 8) {
            const uint2 x = *(const uint2 *) p;
            w[0] = x.x;
            w[1] = x.y;
        } else if constexpr (N == 4) {
            w[0] = *(const unsigned int *) p;
        } else if constexpr (N == 2) {
            w[0] = *(const unsigned short *) p;
        } else {
            static_assert(N == 1, "sparq: vector width");
            w[0] = *p;
        }
#pragma unroll
        for (int i = 0; i < N; ++i) {
            v[i] = sq_e5m2((w[i / 4] >> (8 * (i % 4))) & 0xffu);
        }
    } else if constexpr (std::is_same_v<T, half>) {
        if constexpr (N == 8) {
            const uint4 x = *(const uint4 *) p;
            const half2 * h = (const half2 *) &x;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float2 f = __half22float2(h[i]);
                v[2 * i] = f.x;
                v[2 * i + 1] = f.y;
            }
        } else if constexpr (N == 4) {
            const uint2 x = *(const uint2 *) p;
            const half2 * h = (const half2 *) &x;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const float2 f = __half22float2(h[i]);
                v[2 * i] = f.x;
                v[2 * i + 1] = f.y;
            }
        } else if constexpr (N == 2) {
            const float2 f = __half22float2(*(const half2 *) p);
            v[0] = f.x;
            v[1] = f.y;
        } else {
            static_assert(N == 1, "sparq: vector width");
            v[0] = __half2float(*p);
        }
    } else {
        if constexpr (N == 8) {
            const float4 a = ((const float4 *) p)[0], b = ((const float4 *) p)[1];
            v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
            v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
        } else if constexpr (N == 4) {
            const float4 a = *(const float4 *) p;
            v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        } else if constexpr (N == 2) {
            const float2 a = *(const float2 *) p;
            v[0] = a.x; v[1] = a.y;
        } else {
            static_assert(N == 1, "sparq: vector width");
            v[0] = *p;
        }
    }
}

// N consecutive values from cell s0 of K^T row `row` (s0 aligned to N): sq_ldv, or for a 4-bit K^T
// the N nibbles of s0's block (N divides 32) times its d plus its m (q d + m exact: d a power of two)
template <typename T, int N>
static __device__ __forceinline__ void sq_ld_kt(const char * row, int s0, float * v) {
    if constexpr (std::is_same_v<T, sparq_cu_kt4>) {
        const char * b = row + (size_t) (s0 / GGML_SPARQ_KT4_CELLS) * GGML_SPARQ_KT4_BYTES;
        const float d = __half2float(*(const half *) b), m = __half2float(*(const half *) (b + 2));
        const int j = s0 % GGML_SPARQ_KT4_CELLS;
#pragma unroll
        for (int i = 0; i < N; ++i) {
            const int c = j + i;
            const unsigned int q = c < 16 ? (unsigned char) b[4 + c] & 0x0Fu : (unsigned char) b[4 + c - 16] >> 4;
            v[i] = fmaf((float) q, d, m);
        }
    } else {
        sq_ldv<T, N>((const T *) row + s0, v);
    }
}

// float -> unsigned int with the same order (-0 as +0, so that equal floats are equal keys)
static __device__ __forceinline__ unsigned int sparq_key_bits(float f) {
    const unsigned int b = f == 0.0f ? 0u : __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

static __device__ __forceinline__ const char * sparq_mask_row(const sparq_cu_args & a, int R) {
    if (!a.mask) {
        return nullptr;
    }
    const int st = R / a.n_rows, row = R % a.n_rows;
    return a.mask + (size_t) row * a.m_nb1 + (size_t) (st % a.m_ne3) * a.m_nb3;
}

static __device__ __forceinline__ float sparq_mask_val(const sparq_cu_args & a, const char * m, int s) {
    if (!m) {
        return 0.0f;
    }
    return a.mask_f16 ? __half2float(((const half *) m)[s]) : ((const float *) m)[s];
}

static __device__ __forceinline__ bool sparq_valid(const sparq_cu_args & a, const char * m, int s) {
    return sparq_mask_val(a, m, s) != -INFINITY;
}

// Inclusive prefix sum within the warp; lane 31 leaves the warp's total in sh[warp], and the block
// synchronises (every thread calls it)
template <typename T>
static __device__ __forceinline__ T sparq_warp_scan_to(T v, T * sh) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const T y = __shfl_up_sync(0xffffffff, v, o);
        if (lane >= o) {
            v += y;
        }
    }
    if (lane == 31) {
        sh[threadIdx.x / 32] = v;
    }
    __syncthreads();
    return v;
}

// Inclusive prefix sum over the block (SPARQ_NT threads, every thread calls it); *total is the
// block's sum. sh: SPARQ_NW ints of shared memory, free again on return.
static __device__ __forceinline__ int sparq_block_scan(int x, int * total, int * sh) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int v = sparq_warp_scan_to(x, sh);
    if (warp == 0) {
        int w = lane < SPARQ_NW ? sh[lane] : 0;
#pragma unroll
        for (int o = 1; o < SPARQ_NW; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffff, w, o);
            if (lane >= o) {
                w += y;
            }
        }
        if (lane < SPARQ_NW) {
            sh[lane] = w;
        }
    }
    __syncthreads();
    const int pre = warp > 0 ? sh[warp - 1] : 0;
    *total = sh[SPARQ_NW - 1];
    __syncthreads();
    return v + pre;
}

// sparq_block_scan for doubles (sh: SPARQ_NW doubles)
static __device__ __forceinline__ double sparq_block_scan_d(double x, double * total, double * sh) {
    const int warp = threadIdx.x / 32;
    const double v = sparq_warp_scan_to(x, sh);
    double pre = 0.0, tot = 0.0;
#pragma unroll
    for (int i = 0; i < SPARQ_NW; ++i) {
        pre += i < warp ? sh[i] : 0.0;
        tot += sh[i];
    }
    *total = tot;
    __syncthreads();
    return v + pre;
}

static __device__ __forceinline__ float sparq_block_max(float x, float * sh) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    x = warp_reduce_max(x);
    if (lane == 0) {
        sh[warp] = x;
    }
    __syncthreads();
    float m = sh[0];
#pragma unroll
    for (int i = 1; i < SPARQ_NW; ++i) {
        m = fmaxf(m, sh[i]);
    }
    __syncthreads();
    return m;
}

static __device__ __forceinline__ float sparq_block_sum(float x, float * sh) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    x = warp_reduce_sum(x);
    if (lane == 0) {
        sh[warp] = x;
    }
    __syncthreads();
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < SPARQ_NW; ++i) {
        s += sh[i];
    }
    __syncthreads();
    return s;
}

static __device__ __forceinline__ double sparq_block_sum_d(double x, double * sh) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        x += __shfl_xor_sync(0xffffffff, x, o);
    }
    if (lane == 0) {
        sh[warp] = x;
    }
    __syncthreads();
    double s = 0.0;
#pragma unroll
    for (int i = 0; i < SPARQ_NW; ++i) {
        s += sh[i];
    }
    __syncthreads();
    return s;
}

// ALiBi's slope of query head h, as ggml's soft_max_ext and flash_attn_ext take it; 1 without ALiBi
static __device__ __forceinline__ float sparq_alibi_slope(const sparq_cu_args & a, int h) {
    if (a.max_bias <= 0.0f) {
        return 1.0f;
    }
    const int n2 = 1 << (int) floorf(log2f((float) a.n_head));
    const float m0 = powf(2.0f, -a.max_bias / n2);
    const float m1 = powf(2.0f, -(a.max_bias / 2.0f) / n2);
    return h < n2 ? powf(m0, h + 1) : powf(m1, 2 * (h - n2) + 1);
}

// the KQ bias's term of query head h in row R at cell s: scale times the bias (0 without one)
static __device__ __forceinline__ float sparq_bias_term(const sparq_cu_args & a, int R, int h, int s) {
    if (!a.kq_b) {
        return 0.0f;
    }
    const int st = R / a.n_rows, row = R % a.n_rows;
    const char * b = a.kq_b + (size_t) row * a.kb_nb1 + (size_t) h * a.kb_nb2 + (size_t) (st % a.kb_ne3) * a.kb_nb3;
    return a.scale * ((const float *) b)[s];
}

// a logit x (scale included) with the variants: soft-capped, plus the bias term bt, then the mask
// value mv times the slope (the CPU op's order)
static __device__ __forceinline__ float sparq_variant_logit(const sparq_cu_args & a, float x, float slope, float mv,
                                                            float bt) {
    if (a.softcap > 0.0f) {
        x = a.softcap * tanhf(x / a.softcap);
    }
    if (a.kq_b) {
        x += bt;
    }
    return x + slope * mv;
}

// query head h's sink, or -inf without sinks
static __device__ __forceinline__ float sparq_sink(const sparq_cu_args & a, int h) {
    return a.sinks ? a.sinks[h] : -INFINITY;
}

// the softmax maximum and sum of head hh's approximate logits over all cells of unit u, the head's
// sink included
static __device__ void sparq_unit_stats(const sparq_cu_args & a, int u, int hh, float * M, double * Z) {
    const float2 * ts = a.tstat + (size_t) u * a.nt_a * a.g + hh;
    float m = -INFINITY;
    // unrolled so that several tiles' loads are in flight (a load per iteration waited for each
    // time is a round trip per tile, in every attend block)
#pragma unroll 8
    for (int t = 0; t < a.nt_a; ++t) {
        m = fmaxf(m, ts[(size_t) t * a.g].x);
    }
    double z = 0.0;
#pragma unroll 8
    for (int t = 0; t < a.nt_a; ++t) {
        const float2 st = ts[(size_t) t * a.g];
        if (st.x != -INFINITY) {
            z += (double) st.y * exp((double) st.x - (double) m);
        }
    }
    if (a.sinks) {
        const float sk = a.sinks[(u % a.n_head_kv) * a.g + hh];
        if (sk > m) {
            z = m == -INFINITY ? 0.0 : z * exp((double) m - (double) sk);
            m = sk;
        }
        z += exp((double) sk - (double) m);
    }
    *M = m;
    *Z = z;
}

// whether cell s of row R is in the given window (a.win set); the select kernel's tiles set these
// bits for the list's last block in the same launch, so the load goes to L2 (__ldcg), past any
// stale L1 line
static __device__ __forceinline__ bool sparq_win_bit(const sparq_cu_args & a, int R, int s) {
    return (__ldcg(a.wbits + (size_t) R * a.W + (s >> 5)) >> (s & 31)) & 1u;
}

// A list's approximate logits: its head's (per-head choice), or with one list per unit its first
// head's (with GQA summed, the select reads every head's from there)
static __device__ __forceinline__ const float * sparq_list_logits(const sparq_cu_args & a, int li) {
    return a.logits + ((size_t) (li / a.ph) * a.g + li % a.ph) * a.n_kv;
}

// the keys of list li: its logits, or with GQA summed the unit's summed weights the select writes
static __device__ __forceinline__ const float * sparq_list_keys(const sparq_cu_args & a, int li) {
    if (a.g > 1 && a.ph == 1) {
        return a.keys + (size_t) li * a.n_kv; // one list per unit
    }
    return sparq_list_logits(a, li);
}
