// llama-sparq: the CUDA kernels of GGML_OP_SPARQ_ATTN and their launch sequence (see sparq-cuda.cu
// for the stages). Included by sparq-cuda.cu (nvcc, with ggml's common.cuh) and by
// tests/native/sparq-cuda-emu.cpp, which runs these same kernels on the CPU (one thread per CUDA
// thread) against the CPU op. The includer provides: half, half2, uint2, uint4, float2, float4,
// dim3, make_float2, the warp intrinsics, warp_reduce_sum/max, the atomics, and
//   SPARQ_LAUNCH(kernel, grid, block, stream, args...), SPARQ_MEMSET(ptr, bytes, stream),
//   sparq_stream_t.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

// The largest k, head size and group size (n_head / n_head_kv) the CUDA kernels take.
#define GGML_CUDA_SPARQ_K_MAX 16384
#define GGML_CUDA_SPARQ_D_MAX 256
#define GGML_CUDA_SPARQ_G_MAX 16

#define SPARQ_NT     256              // threads per block of every kernel but the pick
#define SPARQ_NW     (SPARQ_NT / 32)  // warps per block
#define SPARQ_TS_CPT 16               // cells per thread of a selection tile
#define SPARQ_TS     (SPARQ_NT * SPARQ_TS_CPT)

// per query row
struct sparq_cu_row {
    int n_valid; // cells the row may see
    int w0;      // candidates are the cells < w0 (the start of the tail window; S with a given window)
    int n_win;   // window cells (valid, distinct)
    int mode;    // 0 SparQ, 1 dense (n_valid <= k), 2 dense stream (v_count < 0)
};

// per list: the state of its radix select
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
    int d, dv, S, n_rows, n_head, n_hkv, n_stream, g, ph;
    int r, k, l, no_mean_v;
    float scale;
    int R, U, L, W, nt_a, nt_s, sel_max;

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

    // scratch (ggml's CUDA pool)
    sparq_cu_row  * rows;    // [R]
    unsigned int  * wbits;   // [R][W] the given window's cells
    int           * i1;      // [U][r]
    float         * qsc;     // [U][g][r] q_sel[i1] / tau
    float         * logits;  // [U][g][S] approximate logits + mask
    float2        * tstat;   // [U][nt_a][g] per tile: max, sum exp(x - max)
    float         * keys;    // [U][S] group keys (g > 1, shared choice)
    unsigned int  * hist;    // [L][256]
    sparq_cu_pick * pick;    // [L]
    int           * eqcnt;   // [L][nt_s]
    unsigned int  * selbits; // [U][W] the chosen cells
    int           * sel;     // [U][sel_max]
};

// ---------------------------------------------------------------------------
// small helpers
// ---------------------------------------------------------------------------

template <typename T> static __device__ __forceinline__ float sq_ld(const T * p);
template <> __device__ __forceinline__ float sq_ld<half>(const half * p) { return __half2float(*p); }
template <> __device__ __forceinline__ float sq_ld<float>(const float * p) { return *p; }

// N consecutive values from p (aligned to N elements, at most 16 bytes per load)
template <typename T, int N>
static __device__ __forceinline__ void sq_ldv(const T * p, float * v) {
    if constexpr (std::is_same_v<T, half>) {
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

// Inclusive prefix sum over the block (SPARQ_NT threads, every thread calls it); *total is the
// block's sum. sh: SPARQ_NW ints of shared memory, free again on return.
static __device__ __forceinline__ int sparq_block_scan(int x, int * total, int * sh) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int v = x;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffff, v, o);
        if (lane >= o) {
            v += y;
        }
    }
    if (lane == 31) {
        sh[warp] = v;
    }
    __syncthreads();
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

// the softmax maximum and sum of head hh's approximate logits over all cells of unit u
static __device__ void sparq_unit_stats(const sparq_cu_args & a, int u, int hh, float * M, double * Z) {
    const float2 * ts = a.tstat + (size_t) u * a.nt_a * a.g + hh;
    float m = -INFINITY;
    for (int t = 0; t < a.nt_a; ++t) {
        m = fmaxf(m, ts[(size_t) t * a.g].x);
    }
    double z = 0.0;
    for (int t = 0; t < a.nt_a; ++t) {
        const float2 st = ts[(size_t) t * a.g];
        if (st.x != -INFINITY) {
            z += (double) st.y * exp((double) st.x - (double) m);
        }
    }
    *M = m;
    *Z = z;
}

// whether cell s of row R is in the given window (a.win set)
static __device__ __forceinline__ bool sparq_win_bit(const sparq_cu_args & a, int R, int s) {
    return (a.wbits[(size_t) R * a.W + (s >> 5)] >> (s & 31)) & 1u;
}

// the keys of list li
static __device__ __forceinline__ const float * sparq_list_keys(const sparq_cu_args & a, int li) {
    const int u = li / a.ph, h = li % a.ph;
    if (a.g > 1 && a.ph == 1) {
        return a.keys + (size_t) u * a.S;
    }
    return a.logits + ((size_t) u * a.g + h) * a.S;
}

// cells chosen by score in a SparQ row (the window fills the rest of k)
static __device__ __forceinline__ int sparq_row_kk(const sparq_cu_args & a, const sparq_cu_row & ri) {
    return a.k - ri.n_win;
}

// ---------------------------------------------------------------------------
// 1 rows: valid cells, mode, window
// ---------------------------------------------------------------------------

static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_rows(const sparq_cu_args a) {
    __shared__ int sh[SPARQ_NW];
    __shared__ int s_cnt, s_w0;
    const int R = blockIdx.x, tid = threadIdx.x;
    const int st = R / a.n_rows, row = R % a.n_rows;
    const char * m = sparq_mask_row(a, R);

    int n = 0;
    for (int s = tid; s < a.S; s += SPARQ_NT) {
        n += sparq_valid(a, m, s);
    }
    int n_valid;
    sparq_block_scan(n, &n_valid, sh);

    const bool dense_all = a.v_count[st] < 0.0f;
    unsigned int * wb = a.win ? a.wbits + (size_t) R * a.W : nullptr;
    if (wb) {
        for (int i = tid; i < a.W; i += SPARQ_NT) {
            wb[i] = 0u;
        }
    }
    if (tid == 0) {
        s_cnt = 0;
        s_w0 = a.S;
    }
    __syncthreads();

    int n_win = 0;
    if (n_valid > a.k && a.l > 0 && !dense_all) {
        if (wb) {
            // the given cells of the l most recent positions: the valid ones, each once
            const int32_t * src = (const int32_t *) (a.win + (size_t) row * a.win_nb1 + (size_t) st * a.win_nb2);
            const int n_src = min(a.l, a.win_n);
            for (int i = tid; i < n_src; i += SPARQ_NT) {
                const int c = src[i];
                if (c >= 0 && c < a.S && sparq_valid(a, m, c)) {
                    const unsigned int bit = 1u << (c & 31);
                    const unsigned int old = atomicOr(&wb[c >> 5], bit);
                    if (!(old & bit)) {
                        atomicAdd(&s_cnt, 1);
                    }
                }
            }
            __syncthreads();
            n_win = s_cnt;
        } else {
            // the last l valid cells; w0 is the earliest of them (n_valid > k >= l: all l exist)
            int found = 0;
            for (int base = 0; base < a.S && found < a.l; base += SPARQ_NT) {
                const int s = a.S - 1 - (base + tid);
                const int f = s >= 0 && sparq_valid(a, m, s);
                int tot;
                const int incl = sparq_block_scan(f, &tot, sh);
                if (f && found + incl - 1 == a.l - 1) {
                    s_w0 = s;
                }
                found += tot;
            }
            __syncthreads();
            n_win = a.l;
        }
    }
    if (tid == 0) {
        sparq_cu_row ri;
        ri.n_valid = n_valid;
        ri.w0 = s_w0;
        ri.n_win = n_win;
        ri.mode = dense_all ? 2 : (n_valid <= a.k ? 1 : 0);
        a.rows[R] = ri;
    }
}

// ---------------------------------------------------------------------------
// 2 components: i1 and the scaled query components
// ---------------------------------------------------------------------------

static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_components(const sparq_cu_args a) {
    __shared__ float aq[GGML_CUDA_SPARQ_D_MAX];
    __shared__ int si1[GGML_CUDA_SPARQ_D_MAX];
    __shared__ int sh[SPARQ_NW];
    __shared__ double shd[SPARQ_NW];
    const int u = blockIdx.x, j = threadIdx.x;
    const int R = u / a.n_hkv, kvh = u % a.n_hkv;
    const int st = R / a.n_rows, row = R % a.n_rows;
    const float * cw = a.cw ? (const float *) (a.cw + (size_t) kvh * a.cw_nb1 + (size_t) st * a.cw_nb2) : nullptr;
    const char * qbase = a.qs + (size_t) row * a.qs_nb1 + (size_t) st * a.qs_nb3;

    float s = 0.0f;
    if (j < a.d) {
        for (int h = 0; h < a.g; ++h) {
            s += fabsf(((const float *) (qbase + (size_t) (kvh * a.g + h) * a.qs_nb2))[j]);
        }
        if (cw) {
            s *= cw[j];
        }
        aq[j] = s;
    }
    __syncthreads();

    // the r largest, ties to the lower index
    int chosen = 0;
    if (j < a.d) {
        int rank = 0;
        for (int i = 0; i < a.d; ++i) {
            const float x = aq[i];
            rank += (x > s) || (x == s && i < j);
        }
        chosen = rank < a.r;
    }
    // (a NaN in q breaks the ranking: every slot gets a component anyway, never one out of range)
    if (j < a.r) {
        si1[j] = j;
    }
    int tot;
    const int pos = sparq_block_scan(chosen, &tot, sh) - 1; // ascending components
    if (chosen && pos < a.r) {
        si1[pos] = j;
    }
    __syncthreads();
    if (j < a.r) {
        a.i1[(size_t) u * a.r + j] = si1[j];
    }

    // 1/tau per head: scale * sqrt(||q||_1 / ||q[i1]||_1) (weighted norms with comp_w)
    for (int h = 0; h < a.g; ++h) {
        const float * q = (const float *) (qbase + (size_t) (kvh * a.g + h) * a.qs_nb2);
        double all = 0.0, part = 0.0;
        if (j < a.d) {
            all = (double) (fabsf(q[j]) * (cw ? cw[j] : 1.0f));
            part = chosen ? all : 0.0;
        }
        all = sparq_block_sum_d(all, shd);
        part = sparq_block_sum_d(part, shd);
        const float f = part > 0.0 ? (float) ((double) a.scale * sqrt(all / part)) : a.scale;
        if (j < a.r) {
            a.qsc[((size_t) u * a.g + h) * a.r + j] = q[si1[j]] * f;
        }
    }
}

// ---------------------------------------------------------------------------
// 3 approx: approximate logits from r rows of K^T, tile statistics
// ---------------------------------------------------------------------------

// CPT cells per thread (consecutive, one vector load per K^T row when CPT > 1)
template <int GMAX, typename TKT, int CPT>
static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_approx(const sparq_cu_args a) {
    __shared__ float sq[GMAX * GGML_CUDA_SPARQ_D_MAX];
    __shared__ int si1[GGML_CUDA_SPARQ_D_MAX];
    __shared__ float red[SPARQ_NW];
    const int u = blockIdx.y, tid = threadIdx.x;
    const int R = u / a.n_hkv, kvh = u % a.n_hkv, st = R / a.n_rows;
    if (a.rows[R].mode != 0) {
        return; // dense rows need no approximate scores
    }
    const int g = a.g, r = a.r;
    for (int i = tid; i < g * r; i += SPARQ_NT) {
        sq[i] = a.qsc[(size_t) u * g * r + i];
    }
    for (int i = tid; i < r; i += SPARQ_NT) {
        si1[i] = a.i1[(size_t) u * r + i];
    }
    __syncthreads();

    const int s0 = blockIdx.x * (SPARQ_NT * CPT) + tid * CPT;
    // with CPT > 1 the host guarantees S % CPT == 0, so a thread's cells are all in or all out
    const bool in = s0 < a.S;
    float acc[GMAX][CPT];
#pragma unroll
    for (int h = 0; h < GMAX; ++h) {
#pragma unroll
        for (int c = 0; c < CPT; ++c) {
            acc[h][c] = 0.0f;
        }
    }
    if (in) {
        const char * kt = a.KT + (size_t) kvh * a.KT_nb2 + (size_t) st * a.KT_nb3;
#pragma unroll 4
        for (int j = 0; j < r; ++j) {
            float v[CPT];
            sq_ldv<TKT, CPT>((const TKT *) (kt + (size_t) si1[j] * a.KT_nb1) + s0, v);
#pragma unroll
            for (int h = 0; h < GMAX; ++h) {
                if (h < g) {
                    const float qv = sq[h * r + j];
#pragma unroll
                    for (int c = 0; c < CPT; ++c) {
                        acc[h][c] = fmaf(qv, v[c], acc[h][c]);
                    }
                }
            }
        }
    }
    const char * m = sparq_mask_row(a, R);
    float mv[CPT];
#pragma unroll
    for (int c = 0; c < CPT; ++c) {
        mv[c] = in ? sparq_mask_val(a, m, s0 + c) : -INFINITY;
    }
#pragma unroll
    for (int h = 0; h < GMAX; ++h) {
        if (h >= g) {
            break; // uniform over the block
        }
        float x[CPT];
        float lm = -INFINITY;
#pragma unroll
        for (int c = 0; c < CPT; ++c) {
            x[c] = in ? acc[h][c] + mv[c] : -INFINITY;
            lm = fmaxf(lm, x[c]);
        }
        if (in) {
            float * dst = a.logits + ((size_t) u * g + h) * a.S + s0;
#pragma unroll
            for (int c = 0; c < CPT; ++c) {
                dst[c] = x[c];
            }
        }
        const float bm = sparq_block_max(lm, red);
        float ls = 0.0f;
        if (bm != -INFINITY) {
#pragma unroll
            for (int c = 0; c < CPT; ++c) {
                ls += x[c] == -INFINITY ? 0.0f : __expf(x[c] - bm);
            }
        }
        const float bz = sparq_block_sum(ls, red);
        if (tid == 0) {
            a.tstat[((size_t) u * a.nt_a + blockIdx.x) * g + h] = make_float2(bm, bm == -INFINITY ? 0.0f : bz);
        }
    }
}

// ---------------------------------------------------------------------------
// 4 group keys (g > 1, one choice per KV head): sum_h softmax_h(x_h)
// ---------------------------------------------------------------------------

static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_group_keys(const sparq_cu_args a) {
    __shared__ float sM[GGML_CUDA_SPARQ_G_MAX], siZ[GGML_CUDA_SPARQ_G_MAX];
    const int u = blockIdx.y, tid = threadIdx.x;
    const int R = u / a.n_hkv;
    if (a.rows[R].mode != 0) {
        return;
    }
    if (tid < a.g) {
        float M;
        double Z;
        sparq_unit_stats(a, u, tid, &M, &Z);
        sM[tid] = M;
        siZ[tid] = Z > 0.0 ? (float) (1.0 / Z) : 0.0f;
    }
    __syncthreads();
    const char * m = sparq_mask_row(a, R);
    const float * lg = a.logits + (size_t) u * a.g * a.S;
    for (int i = 0; i < SPARQ_TS_CPT; ++i) {
        const int s = blockIdx.x * SPARQ_TS + i * SPARQ_NT + tid;
        if (s >= a.S) {
            break;
        }
        float key = -INFINITY; // masked cells are never chosen
        if (sparq_valid(a, m, s)) {
            key = 0.0f;
            for (int h = 0; h < a.g; ++h) {
                if (sM[h] != -INFINITY) {
                    key += siZ[h] * __expf(lg[(size_t) h * a.S + s] - sM[h]);
                }
            }
        }
        a.keys[(size_t) u * a.S + s] = key;
    }
}

// ---------------------------------------------------------------------------
// 5 radix select: the kk-th largest key of each list, 8 bits per pass
// ---------------------------------------------------------------------------

// whether cell s may be chosen by score in list li's row (key of that cell given)
static __device__ __forceinline__ bool sparq_eligible(const sparq_cu_args & a, const sparq_cu_row & ri, int R, int s, float key) {
    return s < ri.w0 && key > -INFINITY && !(a.win && sparq_win_bit(a, R, s));
}

static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_hist(const sparq_cu_args a, const int shift) {
    __shared__ unsigned int hs[256];
    const int li = blockIdx.y, tid = threadIdx.x;
    const int u = li / a.ph, R = u / a.n_hkv;
    const sparq_cu_row ri = a.rows[R];
    if (ri.mode != 0 || sparq_row_kk(a, ri) <= 0) {
        return;
    }
    unsigned int prefix = 0;
    if (shift < 24) {
        const sparq_cu_pick pk = a.pick[li];
        if (pk.done) {
            return;
        }
        prefix = pk.prefix >> (shift + 8);
    }
    hs[tid] = 0u;
    __syncthreads();
    const float * key = sparq_list_keys(a, li);
    for (int i = 0; i < SPARQ_TS_CPT; ++i) {
        const int s = blockIdx.x * SPARQ_TS + i * SPARQ_NT + tid;
        if (s >= a.S) {
            break;
        }
        const float x = key[s];
        if (sparq_eligible(a, ri, R, s, x)) {
            const unsigned int o = sparq_key_bits(x);
            if (shift == 24 || (o >> (shift + 8)) == prefix) {
                atomicAdd(&hs[(o >> shift) & 255u], 1u);
            }
        }
    }
    __syncthreads();
    if (hs[tid]) {
        atomicAdd(&a.hist[(size_t) li * 256 + tid], hs[tid]);
    }
}

// one warp per list: the bin holding the wanted key; clears the histogram for the next pass
static __global__ void __launch_bounds__(32) k_sparq_pick(const sparq_cu_args a, const int shift) {
    const int li = blockIdx.x, lane = threadIdx.x;
    const int u = li / a.ph, R = u / a.n_hkv;
    const sparq_cu_row ri = a.rows[R];
    const int kk = sparq_row_kk(a, ri);
    sparq_cu_pick pk;
    if (shift == 24) {
        pk.prefix = 0u;
        pk.shift = 32;
        pk.want = kk;
        pk.n_eq = 0;
        pk.all = 0;
        pk.done = ri.mode != 0 || kk <= 0;
        pk.ties = 0;
        if (pk.done) {
            if (lane == 0) {
                a.pick[li] = pk;
            }
            return;
        }
    } else {
        pk = a.pick[li];
        if (pk.done) {
            return;
        }
    }
    unsigned int * hg = a.hist + (size_t) li * 256;
    unsigned int c[8];
    int tot = 0;
#pragma unroll
    for (int b = 0; b < 8; ++b) {
        c[b] = hg[lane * 8 + b];
        hg[lane * 8 + b] = 0u;
        tot += (int) c[b];
    }
    // suffix sums over the lanes: suf = the counts of this lane's bins and every higher bin
    int suf = tot;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_down_sync(0xffffffff, suf, o);
        if (lane + o < 32) {
            suf += y;
        }
    }
    const int total = __shfl_sync(0xffffffff, suf, 0);
    if (shift == 24 && total <= pk.want) {
        // no more eligible cells than wanted: all of them
        if (lane == 0) {
            pk.all = 1;
            pk.done = 1;
            a.pick[li] = pk;
        }
        return;
    }
    // total >= want here (later passes count exactly the cells of the chosen bin, >= want):
    // exactly one lane holds the bin where the running count from the top reaches want
    const int above_lane = suf - tot;
    if (above_lane < pk.want && pk.want <= suf) {
        int above = above_lane;
        int bin = lane * 8;
        int cnt = 0;
#pragma unroll
        for (int b = 7; b >= 0; --b) {
            if (above + (int) c[b] >= pk.want) {
                bin = lane * 8 + b;
                cnt = (int) c[b];
                break;
            }
            above += (int) c[b];
        }
        pk.prefix |= (unsigned int) bin << shift;
        pk.shift = shift;
        pk.want -= above;
        pk.n_eq = cnt;
        if (cnt == pk.want || shift == 0) {
            pk.done = 1;
            pk.ties = cnt != pk.want;
        }
        a.pick[li] = pk;
    }
}

// ---------------------------------------------------------------------------
// 6 collect: the chosen cells and the window into the unit's bitmap
// ---------------------------------------------------------------------------

// per tile, the eligible cells whose key equals the bound (only for lists with ties)
static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_eqcount(const sparq_cu_args a) {
    __shared__ int sh[SPARQ_NW];
    const int li = blockIdx.y, tid = threadIdx.x;
    const int u = li / a.ph, R = u / a.n_hkv;
    const sparq_cu_row ri = a.rows[R];
    if (ri.mode != 0 || sparq_row_kk(a, ri) <= 0) {
        return;
    }
    const sparq_cu_pick pk = a.pick[li];
    if (!pk.ties) {
        return;
    }
    const float * key = sparq_list_keys(a, li);
    int n = 0;
    for (int i = 0; i < SPARQ_TS_CPT; ++i) {
        const int s = blockIdx.x * SPARQ_TS + i * SPARQ_NT + tid;
        if (s < a.S) {
            const float x = key[s];
            n += sparq_eligible(a, ri, R, s, x) && sparq_key_bits(x) == pk.prefix;
        }
    }
    int tot;
    sparq_block_scan(n, &tot, sh);
    if (tid == 0) {
        a.eqcnt[(size_t) li * a.nt_s + blockIdx.x] = tot;
    }
}

static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_collect(const sparq_cu_args a) {
    __shared__ int sh[SPARQ_NW];
    const int li = blockIdx.y, tid = threadIdx.x, lane = tid % 32;
    const int u = li / a.ph, h = li % a.ph, R = u / a.n_hkv;
    const sparq_cu_row ri = a.rows[R];
    if (ri.mode != 0) {
        return;
    }
    const int kk = sparq_row_kk(a, ri);
    sparq_cu_pick pk = {};
    if (kk > 0) {
        pk = a.pick[li];
    }
    const bool choose = kk > 0;
    const char * m = sparq_mask_row(a, R);
    const float * key = sparq_list_keys(a, li);
    unsigned int * sb = a.selbits + (size_t) u * a.W;

    // equal keys before this tile (ties only)
    int eq_seen = 0;
    if (pk.ties) {
        for (int t = 0; t < (int) blockIdx.x; ++t) {
            eq_seen += a.eqcnt[(size_t) li * a.nt_s + t];
        }
    }
    for (int i = 0; i < SPARQ_TS_CPT; ++i) {
        const int s = blockIdx.x * SPARQ_TS + i * SPARQ_NT + tid;
        bool take = false, eq = false;
        if (s < a.S) {
            if (h == 0) {
                take = a.win ? sparq_win_bit(a, R, s) : (s >= ri.w0 && sparq_valid(a, m, s));
            }
            if (choose) {
                const float x = key[s];
                if (sparq_eligible(a, ri, R, s, x)) {
                    if (pk.all) {
                        take = true;
                    } else {
                        const unsigned int o = sparq_key_bits(x);
                        const unsigned int hi = pk.shift >= 32 ? 0u : o >> pk.shift;
                        const unsigned int bh = pk.shift >= 32 ? 0u : pk.prefix >> pk.shift;
                        if (hi > bh) {
                            take = true;
                        } else if (hi == bh) {
                            eq = true;
                        }
                    }
                }
            }
        }
        if (pk.ties) { // uniform over the block
            int tot;
            const int incl = sparq_block_scan(eq ? 1 : 0, &tot, sh);
            if (eq && eq_seen + incl - 1 < pk.want) {
                take = true;
            }
            eq_seen += tot;
        } else if (eq) {
            take = true;
        }
        // the warp's 32 cells are one bitmap word (tiles and chunks are multiples of 32)
        const unsigned int bits = __ballot_sync(0xffffffff, take);
        if (lane == 0 && bits) {
            atomicOr(&sb[(blockIdx.x * SPARQ_TS + i * SPARQ_NT + (tid - lane)) >> 5], bits);
        }
    }
}

// ---------------------------------------------------------------------------
// 7 attend: exact attention over the chosen cells, mean-V mix (every selector)
// ---------------------------------------------------------------------------

template <int GMAX, typename TK, typename TV>
static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_attend(const sparq_cu_args a) {
    __shared__ float sq[GMAX * GGML_CUDA_SPARQ_D_MAX];  // the g query rows
    __shared__ float sp[GMAX * SPARQ_NT];               // logits, then weights, of a chunk
    __shared__ int scell[SPARQ_NT];                     // the chunk's cells (-1: none)
    __shared__ float sM[GMAX], sP[GMAX], scorr[GMAX], sMs[GMAX];
    __shared__ double sZ[GMAX], smass[GMAX];
    __shared__ int sh[SPARQ_NW];
    __shared__ int s_n;

    const int u = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int R = u / a.n_hkv, kvh = u % a.n_hkv;
    const int st = R / a.n_rows, row = R % a.n_rows;
    const int g = a.g, d = a.d, dv = a.dv;
    const sparq_cu_row ri = a.rows[R];
    const bool sparse = ri.mode == 0;
    const bool mean_v = sparse && !a.no_mean_v;
    const char * m = sparq_mask_row(a, R);

    for (int i = tid; i < g * d; i += SPARQ_NT) {
        const int h = i / d, j = i % d;
        sq[h * d + j] = ((const float *) (a.q + (size_t) row * a.q_nb1 + (size_t) (kvh * g + h) * a.q_nb2 +
                                          (size_t) st * a.q_nb3))[j];
    }
    if (tid < g) {
        sM[tid] = -INFINITY;
        sP[tid] = 0.0f;
        smass[tid] = 0.0;
        sMs[tid] = -INFINITY;
        sZ[tid] = 0.0;
        if (mean_v) {
            float M;
            double Z;
            sparq_unit_stats(a, u, tid, &M, &Z);
            sMs[tid] = M;
            sZ[tid] = Z;
        }
    }

    // the cells: the bitmap as an ascending list (SparQ rows), or every cell, masked (dense)
    int * list = a.sel + (size_t) u * a.sel_max;
    if (sparse) {
        const unsigned int * sb = a.selbits + (size_t) u * a.W;
        int base = 0;
        for (int w0 = 0; w0 < a.W; w0 += SPARQ_NT) {
            const int wi = w0 + tid;
            unsigned int word = wi < a.W ? sb[wi] : 0u;
            const int cnt = __popc(word);
            int tot;
            int pos = base + sparq_block_scan(cnt, &tot, sh) - cnt;
            while (word) {
                const int b = __ffs(word) - 1;
                if (pos < a.sel_max) {
                    list[pos] = wi * 32 + b;
                }
                ++pos;
                word &= word - 1u;
            }
            base += tot;
        }
        if (tid == 0) {
            s_n = min(base, a.sel_max);
        }
    } else if (tid == 0) {
        s_n = a.S;
    }
    __syncthreads();
    const int n_items = s_n;

    float y[GMAX];
#pragma unroll
    for (int h = 0; h < GMAX; ++h) {
        y[h] = 0.0f;
    }
    const char * Kb = a.K + (size_t) kvh * a.K_nb2 + (size_t) st * a.K_nb3;
    const char * Vb = a.V + (size_t) kvh * a.V_nb2 + (size_t) st * a.V_nb3;
    const float * lg = a.logits + (size_t) u * g * a.S;

    for (int c0 = 0; c0 < n_items; c0 += SPARQ_NT) {
        const int t = c0 + tid;
        int cell = -1;
        if (t < n_items) {
            cell = sparse ? list[t] : (sparq_valid(a, m, t) ? t : -1);
        }
        scell[tid] = cell;
        if (!sparse) {
            // dense rows walk every cell: skip the chunks without a valid one (a short sequence
            // in a long cache); the scan's barriers also publish scell
            int n_valid_chunk;
            sparq_block_scan(cell >= 0 ? 1 : 0, &n_valid_chunk, sh);
            if (n_valid_chunk == 0) {
                continue; // uniform over the block
            }
        } else {
            __syncthreads();
        }

        // exact logits: a warp per cell, lanes over the head size, all g heads per K row
        for (int ii = 0; ii < 32; ++ii) {
            const int it = warp * 32 + ii;
            const int c = scell[it];
            if (c < 0) {
                if (lane < g) {
                    sp[lane * SPARQ_NT + it] = -INFINITY;
                }
                continue;
            }
            const TK * kr = (const TK *) (Kb + (size_t) c * a.K_nb1);
            float part[GMAX];
#pragma unroll
            for (int h = 0; h < GMAX; ++h) {
                part[h] = 0.0f;
            }
            for (int j = lane; j < d; j += 32) {
                const float kv = sq_ld<TK>(kr + j);
#pragma unroll
                for (int h = 0; h < GMAX; ++h) {
                    if (h < g) {
                        part[h] = fmaf(sq[h * d + j], kv, part[h]);
                    }
                }
            }
            const float mval = sparq_mask_val(a, m, c);
#pragma unroll
            for (int h = 0; h < GMAX; ++h) {
                if (h < g) {
                    const float e = warp_reduce_sum(part[h]);
                    if (lane == 0) {
                        sp[h * SPARQ_NT + it] = e * a.scale + mval;
                    }
                }
            }
        }
        __syncthreads();

        // online softmax per head: a warp per head
        for (int h = warp; h < g; h += SPARQ_NW) {
            float cm = -INFINITY;
            for (int ii = lane; ii < SPARQ_NT; ii += 32) {
                cm = fmaxf(cm, sp[h * SPARQ_NT + ii]);
            }
            cm = warp_reduce_max(cm);
            const float Mold = sM[h];
            const float Mnew = fmaxf(Mold, cm);
            const float corr = Mnew == -INFINITY ? 1.0f : __expf(Mold - Mnew);
            float ps = 0.0f, ms = 0.0f;
            for (int ii = lane; ii < SPARQ_NT; ii += 32) {
                const float e = sp[h * SPARQ_NT + ii];
                const float p = e == -INFINITY ? 0.0f : __expf(e - Mnew);
                sp[h * SPARQ_NT + ii] = p;
                ps += p;
                const int c = scell[ii];
                if (mean_v && c >= 0) {
                    ms += __expf(lg[(size_t) h * a.S + c] - sMs[h]);
                }
            }
            ps = warp_reduce_sum(ps);
            ms = warp_reduce_sum(ms);
            if (lane == 0) {
                sM[h] = Mnew;
                sP[h] = sP[h] * corr + ps;
                scorr[h] = corr;
                smass[h] += (double) ms;
            }
        }
        __syncthreads();

        // values: a thread per component
        if (tid < dv) {
#pragma unroll
            for (int h = 0; h < GMAX; ++h) {
                if (h < g) {
                    y[h] *= scorr[h];
                }
            }
            const int n_c = min(SPARQ_NT, n_items - c0);
            for (int ii = 0; ii < n_c; ++ii) {
                const int c = scell[ii];
                if (c < 0) {
                    continue;
                }
                const float v = sq_ld<TV>((const TV *) (Vb + (size_t) c * a.V_nb1) + tid);
#pragma unroll
                for (int h = 0; h < GMAX; ++h) {
                    if (h < g) {
                        y[h] = fmaf(sp[h * SPARQ_NT + ii], v, y[h]);
                    }
                }
            }
        }
        __syncthreads();
    }

    // the mean of V over the stream's cells
    float vs = 0.0f;
    float cnt = fabsf(a.v_count[st]);
    if (tid < dv) {
        vs = ((const float *) (a.v_sum + (size_t) kvh * a.vs_nb1 + (size_t) st * a.vs_nb2))[tid];
    }
    if (mean_v && m && row + 1 < a.n_rows) {
        // several rows (all-rows evaluation): the sums hold the whole ubatch, so leave out the
        // cells this row may not see that the stream's last row sees
        const char * ml = sparq_mask_row(a, R + (a.n_rows - 1 - row));
        for (int c0 = 0; c0 < a.S; c0 += SPARQ_NT) {
            const int c = c0 + tid;
            scell[tid] = c < a.S && sparq_valid(a, ml, c) && !sparq_valid(a, m, c) ? c : -1;
            __syncthreads();
            for (int ii = 0; ii < SPARQ_NT; ++ii) {
                const int cc = scell[ii];
                if (cc >= 0) {
                    if (tid < dv) {
                        vs -= sq_ld<TV>((const TV *) (Vb + (size_t) cc * a.V_nb1) + tid);
                    }
                    cnt -= 1.0f;
                }
            }
            __syncthreads();
        }
    }
    const float vbar = cnt > 0.0f ? vs / cnt : 0.0f;

    if (tid < dv) {
#pragma unroll
        for (int h = 0; h < GMAX; ++h) {
            if (h < g) {
                const float iP = sP[h] > 0.0f ? 1.0f / sP[h] : 0.0f;
                float o;
                if (ri.mode == 2) {
                    o = y[h] * iP;
                } else {
                    float alpha = 1.0f;
                    if (mean_v) {
                        alpha = sZ[h] > 0.0 ? (float) fmin(1.0, smass[h] / sZ[h]) : 1.0f;
                    }
                    o = alpha * iP * y[h] + (1.0f - alpha) * vbar;
                }
                float * dst = (float *) (a.out + (size_t) (kvh * g + h) * a.o_nb1 + (size_t) row * a.o_nb2 +
                                         (size_t) st * a.o_nb3);
                dst[tid] = o;
            }
        }
    }
}

// ---------------------------------------------------------------------------
// launch sequence (shared by the CUDA backend and the CPU emulation)
// ---------------------------------------------------------------------------

static int sparq_gmax(int g) {
    return g <= 1 ? 1 : g <= 2 ? 2 : g <= 4 ? 4 : g <= 8 ? 8 : 16;
}

// the vector width of the K^T loads for a group size (cells per thread)
static int sparq_vec_cpt(int gmax) {
    return gmax <= 4 ? 8 : (gmax == 8 ? 4 : 2);
}

// element counts of the scratch buffers (sparq_cu_args' scratch pointers), from the shapes only
struct sparq_cu_scratch {
    size_t rows, wbits, i1, qsc, logits, tstat, keys, hist, pick, eqcnt, selbits, sel;
};

static sparq_cu_scratch sparq_cu_scratch_sizes(const sparq_cu_args & a) {
    const size_t U = a.U, S = a.S, g = a.g, L = a.L;
    sparq_cu_scratch z;
    z.rows = a.R;
    z.wbits = a.win ? (size_t) a.R * a.W : 1;
    z.i1 = U * a.r;
    z.qsc = U * g * a.r;
    z.logits = std::max<size_t>(1, U * g * S);
    z.tstat = U * a.nt_a * g;
    z.keys = a.g > 1 && a.ph == 1 ? std::max<size_t>(1, U * S) : 1;
    z.hist = L * 256;
    z.pick = L;
    z.eqcnt = L * a.nt_s;
    z.selbits = U * a.W;
    z.sel = std::max<size_t>(1, U * a.sel_max);
    return z;
}

template <int GMAX, typename TKT>
static void sparq_launch_approx(const sparq_cu_args & a, int cpt, sparq_stream_t stream) {
    const dim3 grid(a.nt_a, a.U);
    constexpr int VW = GMAX <= 4 ? 8 : (GMAX == 8 ? 4 : 2);
    if (cpt == VW) {
        SPARQ_LAUNCH((k_sparq_approx<GMAX, TKT, VW>), grid, SPARQ_NT, stream, a);
    } else {
        SPARQ_LAUNCH((k_sparq_approx<GMAX, TKT, 1>), grid, SPARQ_NT, stream, a);
    }
}

template <int GMAX>
static void sparq_launch_g(const sparq_cu_args & a, bool kt_f16, bool k_f16, bool v_f16, int cpt, bool attend,
                           sparq_stream_t stream) {
    if (!attend) {
        if (kt_f16) {
            sparq_launch_approx<GMAX, half>(a, cpt, stream);
        } else {
            sparq_launch_approx<GMAX, float>(a, cpt, stream);
        }
        return;
    }
    const dim3 grid(a.U);
    if (k_f16 && v_f16) {
        SPARQ_LAUNCH((k_sparq_attend<GMAX, half, half>), grid, SPARQ_NT, stream, a);
    } else if (k_f16) {
        SPARQ_LAUNCH((k_sparq_attend<GMAX, half, float>), grid, SPARQ_NT, stream, a);
    } else if (v_f16) {
        SPARQ_LAUNCH((k_sparq_attend<GMAX, float, half>), grid, SPARQ_NT, stream, a);
    } else {
        SPARQ_LAUNCH((k_sparq_attend<GMAX, float, float>), grid, SPARQ_NT, stream, a);
    }
}

static void sparq_launch_by_g(const sparq_cu_args & a, bool kt_f16, bool k_f16, bool v_f16, int cpt, bool attend,
                              sparq_stream_t stream) {
    switch (sparq_gmax(a.g)) {
        case 1:  sparq_launch_g<1>(a, kt_f16, k_f16, v_f16, cpt, attend, stream); break;
        case 2:  sparq_launch_g<2>(a, kt_f16, k_f16, v_f16, cpt, attend, stream); break;
        case 4:  sparq_launch_g<4>(a, kt_f16, k_f16, v_f16, cpt, attend, stream); break;
        case 8:  sparq_launch_g<8>(a, kt_f16, k_f16, v_f16, cpt, attend, stream); break;
        default: sparq_launch_g<16>(a, kt_f16, k_f16, v_f16, cpt, attend, stream); break;
    }
}

// The whole op: a's shapes, tensors and scratch set (cpt: 1 or sparq_vec_cpt(sparq_gmax(g)), the
// K^T load width the rows' alignment allows; nt_a must match it).
static void sparq_cu_run(const sparq_cu_args & a, int cpt, bool kt_f16, bool k_f16, bool v_f16, sparq_stream_t stream) {
    SPARQ_MEMSET(a.hist, (size_t) a.L * 256 * sizeof(unsigned int), stream);
    SPARQ_MEMSET(a.selbits, (size_t) a.U * a.W * sizeof(unsigned int), stream);

    SPARQ_LAUNCH(k_sparq_rows, dim3(a.R), SPARQ_NT, stream, a);
    SPARQ_LAUNCH(k_sparq_components, dim3(a.U), SPARQ_NT, stream, a);
    sparq_launch_by_g(a, kt_f16, k_f16, v_f16, cpt, false, stream);
    const dim3 gsel(a.nt_s, a.U), glist(a.nt_s, a.L);
    if (a.g > 1 && a.ph == 1) {
        SPARQ_LAUNCH(k_sparq_group_keys, gsel, SPARQ_NT, stream, a);
    }
    for (int shift = 24; shift >= 0; shift -= 8) {
        SPARQ_LAUNCH(k_sparq_hist, glist, SPARQ_NT, stream, a, shift);
        SPARQ_LAUNCH(k_sparq_pick, dim3(a.L), 32, stream, a, shift);
    }
    SPARQ_LAUNCH(k_sparq_eqcount, glist, SPARQ_NT, stream, a);
    SPARQ_LAUNCH(k_sparq_collect, glist, SPARQ_NT, stream, a);
    sparq_launch_by_g(a, kt_f16, k_f16, v_f16, cpt, true, stream);
}
