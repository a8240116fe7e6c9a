// llama-sparq, experimental build only (SPARQ_CUDA_EXPERIMENTAL): the score tiles that also start
// the selection, for LLAMA_SPARQ_CUDA_SCORE_HIST and LLAMA_SPARQ_CUDA_CALIB_HIST (and the one launch
// per layer, sparq-cuda-exp-fused.cuh). Where a list is keyed by one head's logits (g == 1, or
// per-head choice), each score tile counts that head's logits by their top SPARQ_NB_BITS bits and
// keeps the list's candidates, so that the select is one block per list
// (sparq-cuda-exp-select.cuh). Layout of sparq_cu_args::cand then: [L][nt_a][1 + sparq_score_cap]
// per score tile its count (x of the first entry; over the cap: not all kept), then the cells; with
// the calibrated k's masses (MASS) the first entry's y is the lowest bin kept whole, and after all
// candidates [L][nt_a][1 + tl_a] per score tile its non-empty bins' count, then {bin << 16 | cells,
// sum of exp(x - tile max) as float bits}.
#pragma once

#include "sparq-cuda-score.cuh"
#include "sparq-cuda-topk.cuh"

// the candidates a score tile keeps (a score tile of fewer cells keeps as many as it has)
#define SPARQ_SCORE_CAND 512

// the candidates a score tile keeps, and where list li's tile t keeps them
static __device__ __host__ __forceinline__ int sparq_score_cap(const sparq_cu_args & a) {
    return a.tl_a < SPARQ_SCORE_CAND ? a.tl_a : SPARQ_SCORE_CAND;
}
static __device__ __forceinline__ uint2 * sparq_score_cands(const sparq_cu_args & a, int li, int t) {
    return a.cand + ((size_t) li * a.nt_a + t) * (1 + sparq_score_cap(a));
}
// with the masses, a cell's term in its score tile's bin: exp(x - the tile's maximum m) in double, as
// the select tiles weigh cells (-use_fast_math makes expf __expf: a few ulp more per 2^k of |x - m|)
static __device__ __forceinline__ float sparq_tile_mass(float x, float m) {
    return (float) exp((double) x - (double) m);
}

// with the masses, where list li's tile t writes its non-empty bins (after every tile's candidates)
static __device__ __forceinline__ uint2 * sparq_score_bins(const sparq_cu_args & a, int li, int t) {
    return a.cand + (size_t) a.L * a.nt_a * (1 + sparq_score_cap(a)) + ((size_t) li * a.nt_a + t) * (1 + a.tl_a);
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

// List li's candidates in this tile: its valid cells counted by their logit's top SPARQ_NB_BITS
// bits (shist, shared), the tile's own crossing of k found, and the cells in the bins
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

// With the masses, list li's part of the calibrated k's histogram in this tile: its valid cells
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

// What a score tile keeps of head h's logits for the list li = blockIdx.y * g + h (a list per head):
// its candidates (sparq_score_tile_cands), with MASS its masses per bin too (sparq_score_tile_mass,
// whose sums take sq's room once the scores are done: sq must then hold SPARQ_NB floats).
// shist: SPARQ_NB counts of shared memory.
template <int CPT, bool MASS>
static __device__ __forceinline__ void sparq_score_keep(const sparq_cu_args & a, int h, int s0, bool in, const float (&x)[CPT],
                                                        float bm, float * sq, unsigned int * shist, int * sh, double * shd,
                                                        sparq_cross * s_cross) {
    const int li = blockIdx.y * a.g + h;
    if constexpr (MASS) {
        sparq_score_tile_mass<CPT>(a, li, s0, in, x, bm, shist, sq, sh, shd, s_cross);
    } else {
        sparq_score_tile_cands<CPT>(a, li, s0, in, x, shist, sh, shd, s_cross);
    }
}

// k_sparq_score, and each head's candidates (with MASS its masses per bin) for the select's one block
// per list (sparq_score_keep)
template <int GMAX, typename TKT, int CPT, bool MASS>
static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_score_hist(const sparq_cu_args a) {
    SPARQ_SCORE_SMEM(MASS && GMAX * GGML_CUDA_SPARQ_D_MAX < SPARQ_NB ? SPARQ_NB : GMAX * GGML_CUDA_SPARQ_D_MAX);
    __shared__ unsigned int shist[SPARQ_NB];
    __shared__ double shd[SPARQ_NW];
    __shared__ sparq_cross s_cross;
    sparq_score_block<GMAX, TKT, CPT>(a, sq, si1, aq, chosen_of, sh, red,
                                      [&](int h, int s0, bool in, const float (&x)[CPT], float bm) {
                                          sparq_score_keep<CPT, MASS>(a, h, s0, in, x, bm, sq, shist, sh, shd, &s_cross);
                                      });
}
