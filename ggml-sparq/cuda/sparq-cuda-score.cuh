// llama-sparq: the first kernel of GGML_OP_SPARQ_ATTN (sparq-cuda.cu lists the kernels): per
// (score tile, unit) the chosen query components, the tile's valid cells, the approximate scores
// from K^T with their tile statistics, and the zeroing of what the later kernels accumulate into.
#pragma once

#include "sparq-cuda-common.cuh"

// ---------------------------------------------------------------------------
// components: i1 and the scaled query components of a unit, in the block's shared memory
// ---------------------------------------------------------------------------

// The unit's r components (the r largest of sum_h |q_sel_h| times comp_w, ties to the lower
// index, ascending) into si1, and q_sel_h[i1] / tau_h into sq[h * r + j]. Every score tile's block
// works this out for itself (a few microseconds of arithmetic on d <= 256 values), so that no
// launch or global round trip stands between the query and the scores.
static __device__ void sparq_block_components(const sparq_cu_args & a, int u, int * si1, float * sq, float * aq,
                                              int * chosen_of, int * sh) {
    const int j = threadIdx.x, lane = j % 32, warp = j / 32;
    const int R = u / a.n_head_kv, kvh = u % a.n_head_kv;
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
    if (j < GGML_CUDA_SPARQ_D_MAX) {
        chosen_of[j] = chosen;
    }
    int tot;
    const int pos = sparq_block_scan(chosen, &tot, sh) - 1; // ascending components
    if (chosen && pos < a.r) {
        si1[pos] = j;
    }
    __syncthreads();

    // 1/tau per head: scale * sqrt(||q||_1 / ||q[i1]||_1) (weighted norms with comp_w), a warp per head
    for (int h = warp; h < a.g; h += SPARQ_NW) {
        const float * q = (const float *) (qbase + (size_t) (kvh * a.g + h) * a.qs_nb2);
        double all = 0.0, part = 0.0;
        for (int i = lane; i < a.d; i += 32) {
            const double x = (double) (fabsf(q[i]) * (cw ? cw[i] : 1.0f));
            all += x;
            part += chosen_of[i] ? x : 0.0;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            all += __shfl_xor_sync(0xffffffff, all, o);
            part += __shfl_xor_sync(0xffffffff, part, o);
        }
        const float f = part > 0.0 ? (float) ((double) a.scale * sqrt(all / part)) : a.scale;
        for (int i = lane; i < a.r; i += 32) {
            sq[h * a.r + i] = q[si1[i]] * f;
        }
    }
    __syncthreads();
}

// ---------------------------------------------------------------------------
// the score kernel
// ---------------------------------------------------------------------------

// The scratch the later kernels accumulate into, cleared by this one (each piece by one block):
// the bitmaps' words and the buckets of this tile's cells, and with the unit's first tile the
// unit's per-list histograms and counters. Kernels on one stream run in order, so they start from
// zero with no memset.
static __device__ void sparq_score_clear(const sparq_cu_args & a, int u, int kvh, int R) {
    const int tid = threadIdx.x;
    const int w_per_tile = a.tl_a / 32;
    const int w0 = blockIdx.x * w_per_tile, w1 = min(a.W, w0 + w_per_tile);
    for (int w = w0 + tid; w < w1; w += SPARQ_NT) {
        a.selbits[(size_t) u * a.W + w] = 0u;
        if (a.win && kvh == 0) {
            a.wbits[(size_t) R * a.W + w] = 0u;
        }
    }
    if (a.buckets > 0) { // the unit's lists' offers, contiguous: ph * tl_a per tile (buckets <= S)
        const size_t per = (size_t) a.ph * a.tl_a, all = (size_t) a.ph * a.buckets;
        const size_t n = all < (blockIdx.x + 1) * per ? all : (blockIdx.x + 1) * per;
        unsigned long long * bk = a.bk + (size_t) u * all;
        for (size_t i = blockIdx.x * per + tid; i < n; i += SPARQ_NT) {
            bk[i] = 0ull;
        }
    }
    if (blockIdx.x != 0) {
        return;
    }
    for (int li = u * a.ph; li < (u + 1) * a.ph; ++li) {
        for (int b = tid; b < SPARQ_NB; b += SPARQ_NT) {
            a.hist[(size_t) li * SPARQ_NB + b] = 0u;
            if (a.cov_p > 0.0f) {
                a.hmass[(size_t) li * SPARQ_NB + b] = 0.0;
            }
        }
        if (tid == 0) {
            a.ldone[li] = 0u;
            a.ncand[li] = 0u;
        }
    }
    if (tid == 0) {
        a.udone[u] = 0u;
    }
}

// Per (score tile of SPARQ_NT * CPT cells, unit): the components; the tile's valid cells into tcnt;
// the approximate logits of the g heads from r rows of K^T (each row read coalesced, CPT
// consecutive cells per thread with one vector load when CPT > 1) + mask into logits, with the
// tile's softmax maximum and sum per head into tstat. A dense stream (v_count < 0) needs no scores.
// The block of score tile blockIdx.x and unit blockIdx.y (k_sparq_score's body, which declares the
// shared memory: SPARQ_SCORE_SMEM). head_done(h, s0, in, x, bm), called by every thread after head
// h's logits and statistics (x: the thread's CPT logits from cell s0, -inf where not valid; in: s0 <
// S; bm: the tile's maximum), is what else a kernel does with them (k_sparq_score: nothing).
// Returns early for a dense stream.
template <int GMAX, typename TKT, int CPT, typename F>
static __device__ __forceinline__ void sparq_score_block(const sparq_cu_args & a, float * sq, int * si1, float * aq,
                                                         int * chosen_of, int * sh, float * red, F head_done) {
    // the select (a programmatic dependent launch) may be placed from now on: its blocks wait for
    // this kernel's end before they read anything it writes
    ggml_cuda_pdl_lc();
    const int u = blockIdx.y, tid = threadIdx.x;
    const int R = u / a.n_head_kv, kvh = u % a.n_head_kv, st = R / a.n_rows;
    sparq_score_clear(a, u, kvh, R);

    const int s0 = blockIdx.x * (SPARQ_NT * CPT) + tid * CPT;
    // with CPT > 1 the host guarantees S % CPT == 0, so a thread's cells are all in or all out
    const bool in = s0 < a.n_kv;
    const char * m = sparq_mask_row(a, R);
    float mv[CPT];
    int n_ok = 0;
#pragma unroll
    for (int c = 0; c < CPT; ++c) {
        mv[c] = in ? sparq_mask_val(a, m, s0 + c) : -INFINITY;
        n_ok += mv[c] != -INFINITY;
    }
    int n_tile;
    sparq_block_scan(n_ok, &n_tile, sh);
    if (tid == 0) {
        a.tcnt[(size_t) u * a.nt_a + blockIdx.x] = n_tile;
    }
    if (a.v_count[st] < 0.0f) {
        return; // a dense stream: no scores (uniform over the block)
    }

    sparq_block_components(a, u, si1, sq, aq, chosen_of, sh);
    const int g = a.g, r = a.r;
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
        // eight rows' loads in flight per thread: a batch is one memory round trip, and at 4K cells
        // the kernel is the chain of these round trips, not the bytes
#pragma unroll 8
        for (int j = 0; j < r; ++j) {
            float v[CPT];
            sq_ld_kt<TKT, CPT>(kt + (size_t) si1[j] * a.KT_nb1, s0, v);
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
#pragma unroll
    for (int h = 0; h < GMAX; ++h) {
        if (h >= g) {
            break; // uniform over the block
        }
        float x[CPT];
        float lm = -INFINITY;
        const float slope = sparq_alibi_slope(a, kvh * g + h);
#pragma unroll
        for (int c = 0; c < CPT; ++c) {
            x[c] = in ? sparq_variant_logit(a, acc[h][c], slope, mv[c], sparq_bias_term(a, R, kvh * g + h, s0 + c))
                      : -INFINITY;
            lm = fmaxf(lm, x[c]);
        }
        if (in) {
            float * dst = a.logits + ((size_t) u * g + h) * a.n_kv + s0;
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
        head_done(h, s0, in, x, bm);
    }
}

// the score kernel's shared memory (sq: at least GMAX * GGML_CUDA_SPARQ_D_MAX floats)
#define SPARQ_SCORE_SMEM(SQ_N)                        \
    __shared__ float sq[SQ_N];                        \
    __shared__ int si1[GGML_CUDA_SPARQ_D_MAX];        \
    __shared__ float aq[GGML_CUDA_SPARQ_D_MAX];       \
    __shared__ int chosen_of[GGML_CUDA_SPARQ_D_MAX];  \
    __shared__ int sh[SPARQ_NW];                      \
    __shared__ float red[SPARQ_NW]

template <int GMAX, typename TKT, int CPT>
static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_score(const sparq_cu_args a) {
    SPARQ_SCORE_SMEM(GMAX * GGML_CUDA_SPARQ_D_MAX);
    sparq_score_block<GMAX, TKT, CPT>(a, sq, si1, aq, chosen_of, sh, red, [](int, int, bool, const float (&)[CPT], float) {});
}
