// llama-sparq: the first kernel of GGML_OP_SPARQ_ATTN (sparq-cuda.cu lists the kernels): per
// (score tile, unit) the chosen query components, the tile's valid cells, the approximate scores
// from K^T with their tile statistics, and the zeroing of what the later kernels accumulate into.
#pragma once

#include "sparq-cuda-common.cuh"
#include "sparq-cuda-topk.cuh"

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
// zero with no memset. (Fused, each unit's window bitmap is its own: a.wbits is shifted to it,
// every unit clears it.)
static __device__ void sparq_score_clear(const sparq_cu_args & a, int u, int kvh, int R) {
    const int tid = threadIdx.x;
    const int w_per_tile = a.tl_a / 32;
    const int w0 = blockIdx.x * w_per_tile, w1 = min(a.W, w0 + w_per_tile);
    for (int w = w0 + tid; w < w1; w += SPARQ_NT) {
        a.selbits[(size_t) u * a.W + w] = 0u;
        if (a.win && (kvh == 0 || a.fused)) {
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
        a.udense[u] = 0;
    }
}

// List li's candidates in this score tile: its valid cells whose logit's bin is lb or above, the
// first sparq_score_cap of them, after the entry {their count, tag}
template <int CPT>
static __device__ void sparq_score_keep_from(const sparq_cu_args & a, int li, int s0, bool in, const float (&x)[CPT],
                                             unsigned int lb, unsigned int tag, int * sh) {
    unsigned int put = 0u;
#pragma unroll
    for (int c = 0; c < CPT; ++c) {
        if (in && x[c] > -INFINITY && (sparq_key_bits(x[c]) >> SPARQ_NB_SHIFT) >= lb) {
            put |= 1u << c;
        }
    }
    int n_tile;
    int pos = sparq_block_scan(__popc(put), &n_tile, sh) - __popc(put);
    uint2 * cd = sparq_score_cands(a, li, blockIdx.x);
    const int cap = sparq_score_cap(a);
    if (threadIdx.x == 0) {
        cd[0] = make_uint2((unsigned int) n_tile, tag);
    }
#pragma unroll
    for (int c = 0; c < CPT; ++c) {
        if ((put >> c) & 1u) {
            if (pos < cap) {
                cd[1 + pos] = make_uint2(sparq_key_bits(x[c]), (unsigned int) (s0 + c));
            }
            ++pos;
        }
    }
}

// With score_hist, list li's candidates in this tile: its valid cells counted by their logit's top
// SPARQ_NB_BITS bits (shist, shared), the tile's own crossing of k found, and the cells in the bins
// from there up kept (the first sparq_score_cap of them; the count in the first entry). The list's
// k-th best eligible cell lies in a bin at or above every tile's crossing (the window's cells, at
// most the row's n_win, leave k - n_win eligible ones at or above it), so the candidates hold every
// cell the select may choose by score, and the histogram of those in the bins from the list's
// crossing up is exact: the select needs no pass over the list's logits.
template <int CPT>
static __device__ void sparq_score_tile_cands(const sparq_cu_args & a, int li, int s0, bool in, const float (&x)[CPT],
                                              unsigned int * shist, int * sh, double * shd, sparq_cross * s_cross) {
    const int tid = threadIdx.x;
    for (int b = tid; b < SPARQ_NB; b += SPARQ_NT) {
        shist[b] = 0u;
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < CPT; ++c) {
        if (in && x[c] > -INFINITY) {
            atomicAdd(&shist[sparq_key_bits(x[c]) >> SPARQ_NB_SHIFT], 1u);
        }
    }
    __syncthreads();
    const sparq_cross lx = sparq_find_cross<SPARQ_NB / SPARQ_NT>(false, (double) a.k, [&](int bin) { return (int) shist[bin]; },
                                                                 [&](int) { return 0.0; }, sh, shd, s_cross);
    sparq_score_keep_from<CPT>(a, li, s0, in, x, lx.bin < 0 ? 0u : (unsigned int) lx.bin, 0u, sh);
}

// With calib_hist, list li's part of the calibrated k's histogram in this tile: its valid cells
// counted (shist) and their exp(x - bm) summed (shm; bm, the tile's maximum, its own reference:
// every cell's term is at most 1 and the tile's best is exact, where the list's maximum is not
// known yet) by their logit's top SPARQ_NB_BITS bits; the non-empty bins written in order for the
// select's merge (which rescales each tile by exp(bm - M) / Z). The candidates: the cells of the
// whole bins from the top while at most sparq_score_cap of them, the lowest such bin in the first
// entry's y (the select reads candidates only from bins at or above every tile's).
template <int CPT>
static __device__ void sparq_score_tile_mass(const sparq_cu_args & a, int li, int s0, bool in, const float (&x)[CPT],
                                             float bm, unsigned int * shist, float * shm, int * sh, double * shd,
                                             sparq_cross * s_cross) {
    const int tid = threadIdx.x;
    for (int b = tid; b < SPARQ_NB; b += SPARQ_NT) {
        shist[b] = 0u;
        shm[b] = 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < CPT; ++c) {
        if (in && x[c] > -INFINITY) {
            const unsigned int bin = sparq_key_bits(x[c]) >> SPARQ_NB_SHIFT;
            atomicAdd(&shist[bin], 1u);
            atomicAdd(&shm[bin], sparq_tile_mass(x[c], bm));
        }
    }
    __syncthreads();
    // the non-empty bins, SPARQ_NB / SPARQ_NT consecutive ones per thread, in order
    constexpr int BPT = SPARQ_NB / SPARQ_NT;
    int n_nz = 0;
#pragma unroll
    for (int i = 0; i < BPT; ++i) {
        n_nz += shist[tid * BPT + i] != 0u;
    }
    int n_bins;
    int at = sparq_block_scan(n_nz, &n_bins, sh) - n_nz;
    uint2 * bd = sparq_score_bins(a, li, blockIdx.x);
    if (tid == 0) {
        bd[0] = make_uint2((unsigned int) n_bins, 0u);
    }
#pragma unroll
    for (int i = 0; i < BPT; ++i) {
        const int b = tid * BPT + i;
        if (shist[b] != 0u) {
            bd[1 + at++] = make_uint2(((unsigned int) b << 16) | shist[b], __float_as_uint(shm[b]));
        }
    }
    const int cap = sparq_score_cap(a);
    const sparq_cross lx = sparq_find_cross<BPT>(false, (double) (cap + 1), [&](int bin) { return (int) shist[bin]; },
                                                 [&](int) { return 0.0; }, sh, shd, s_cross);
    const unsigned int lb = lx.bin < 0 ? 0u : (unsigned int) lx.bin + 1u;
    sparq_score_keep_from<CPT>(a, li, s0, in, x, lb, lb, sh); // (whole bins: at most cap cells)
}

// Per (score tile of SPARQ_NT * CPT cells, unit): the components; the tile's valid cells into tcnt;
// the approximate logits of the g heads from r rows of K^T (each row read coalesced, CPT
// consecutive cells per thread with one vector load when CPT > 1) + mask into logits, with the
// tile's softmax maximum and sum per head into tstat. A dense stream (v_count < 0) needs no scores.
// HIST (a.score_hist; its own instantiation, so that the other keeps its registers): each head's
// candidates (sparq_score_tile_cands); with MASS (a.calib_hist) also its masses per bin
// (sparq_score_tile_mass, whose sums take sq's room once the scores are done: sq must then hold
// SPARQ_NB floats).
// The block of score tile blockIdx.x and unit blockIdx.y (k_sparq_score's body, which declares the
// shared memory: sq [GMAX * D_MAX], si1, aq, chosen_of [D_MAX], sh, red, shd [SPARQ_NW], shist
// [HIST ? SPARQ_NB : 1]; k_sparq_fused passes its own). Returns early for a dense stream.
template <int GMAX, typename TKT, int CPT, bool HIST, bool MASS = false>
static __device__ __forceinline__ void sparq_score_block(const sparq_cu_args & a, float * sq, int * si1, float * aq,
                                                         int * chosen_of, int * sh, float * red, unsigned int * shist,
                                                         double * shd, sparq_cross & s_cross) {
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
        if constexpr (MASS) { // (a list per head: li = u * g + h)
            sparq_score_tile_mass<CPT>(a, u * g + h, s0, in, x, bm, shist, sq, sh, shd, &s_cross);
        } else if constexpr (HIST) {
            sparq_score_tile_cands<CPT>(a, u * g + h, s0, in, x, shist, sh, shd, &s_cross);
        }
    }
}

template <int GMAX, typename TKT, int CPT, bool HIST, bool MASS = false>
static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_score(const sparq_cu_args a) {
    __shared__ float sq[MASS && GMAX * GGML_CUDA_SPARQ_D_MAX < SPARQ_NB ? SPARQ_NB : GMAX * GGML_CUDA_SPARQ_D_MAX];
    __shared__ int si1[GGML_CUDA_SPARQ_D_MAX];
    __shared__ float aq[GGML_CUDA_SPARQ_D_MAX];
    __shared__ int chosen_of[GGML_CUDA_SPARQ_D_MAX];
    __shared__ int sh[SPARQ_NW];
    __shared__ float red[SPARQ_NW];
    __shared__ unsigned int shist[HIST ? SPARQ_NB : 1];
    __shared__ double shd[SPARQ_NW];
    __shared__ sparq_cross s_cross;
    sparq_score_block<GMAX, TKT, CPT, HIST, MASS>(a, sq, si1, aq, chosen_of, sh, red, shist, shd, s_cross);
}
