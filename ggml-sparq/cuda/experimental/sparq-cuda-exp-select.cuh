// llama-sparq, experimental build only (SPARQ_CUDA_EXPERIMENTAL): the select's variants.
//   - k_sparq_select_scored: one block per list from the score tiles' candidates
//     (sparq-cuda-exp-score.cuh) instead of the select tiles' grid: LLAMA_SPARQ_CUDA_SCORE_HIST (a
//     fixed k: the histogram from the candidates) and LLAMA_SPARQ_CUDA_CALIB_HIST (the calibrated k:
//     the list's mass histogram merged from the tiles' bins); also the one launch's choice.
//   - k_sparq_select_way: the select tiles with LLAMA_SPARQ_CUDA_SELECT_HIST=atomic (an add per cell
//     instead of the warp vote), LLAMA_SPARQ_CUDA_SELECT_LOADS=early (the keys' loads before the
//     list's context) and the test hook LLAMA_SPARQ_CUDA_SELECT=radix (the radix passes over a list
//     even where its crossing bin's cells fit in shared memory), read per launch from sparq_exp_args.
#pragma once

#include "sparq-cuda-exp-args.cuh"
#include "sparq-cuda-exp-score.cuh"
#include "sparq-cuda-select-tile.cuh"

// fn(key bits, cell) for each candidate the score tiles kept for list li, a warp per tile, four
// loads in flight per lane
template <typename F>
static __device__ __forceinline__ void sparq_scored_each(const sparq_cu_args & a, const sparq_sel_ctx & c, F fn) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int cap = sparq_score_cap(a);
    constexpr int U = 4;
    for (int t = warp; t < a.nt_a; t += SPARQ_NW) {
        const uint2 * cd = sparq_score_cands(a, c.li, t);
        const int n = min((int) cd[0].x, cap);
        for (int i0 = lane; i0 < n; i0 += U * 32) {
            uint2 e[U];
#pragma unroll
            for (int v = 0; v < U; ++v) {
                const int i = i0 + v * 32;
                e[v] = i < n ? cd[1 + i] : make_uint2(0u, 0u);
            }
#pragma unroll
            for (int v = 0; v < U; ++v) {
                if (i0 + v * 32 < n) {
                    fn(e[v].x, (int) e[v].y);
                }
            }
        }
    }
}

// whether every score tile kept all its candidates (uniform over the block)
static __device__ bool sparq_scored_complete(const sparq_cu_args & a, const sparq_sel_ctx & c, int * sh) {
    const int cap = sparq_score_cap(a);
    int over = 0;
    for (int t = threadIdx.x; t < a.nt_a; t += SPARQ_NT) {
        over += (int) sparq_score_cands(a, c.li, t)[0].x > cap;
    }
    int tot;
    sparq_block_scan(over, &tot, sh);
    return tot == 0;
}

// list li's eligible cells counted by their key's top bits into sm.hc: from the
// score tiles' candidates (complete: exact in every bin from the list's crossing up, which is all
// the choice reads), else from a pass over the list
static __device__ void sparq_scored_histogram(const sparq_cu_args & a, const sparq_sel_ctx & c, bool complete,
                                              const sparq_sel_smem & sm) {
    for (int b = threadIdx.x; b < SPARQ_NB; b += SPARQ_NT) {
        sm.hc[b] = 0u;
    }
    __syncthreads();
    if (complete) {
        sparq_scored_each(a, c, [&](unsigned int o, int s) {
            if (s < c.w0 && !(a.win && sparq_win_bit(a, c.R, s))) {
                atomicAdd(&sm.hc[o >> SPARQ_NB_SHIFT], 1u);
            }
        });
    } else {
        for (int s = threadIdx.x; s < a.n_kv; s += SPARQ_NT) {
            const float x = __ldcg(c.keys + s);
            if (sparq_sel_eligible(a, c, s, x)) {
                atomicAdd(&sm.hc[sparq_key_bits(x) >> SPARQ_NB_SHIFT], 1u);
            }
        }
    }
    __syncthreads();
}

// sparq_cand_pass over the score tiles' candidates (all kept): the eligible ones above
// bin b (and of b with take_eq) into the bitmap, b's gathered with gather
static __device__ void sparq_scored_pass(const sparq_cu_args & a, const sparq_sel_ctx & c, int b, bool take_eq, bool gather,
                                         const sparq_sel_smem & sm, int * s_nc) {
    unsigned int * sb = a.selbits + (size_t) c.u * a.W;
    sparq_scored_each(a, c, [&](unsigned int o, int s) {
        if (s >= c.w0 || (a.win && sparq_win_bit(a, c.R, s))) {
            return;
        }
        const int kb = (int) (o >> SPARQ_NB_SHIFT);
        if (kb > b || (take_eq && kb == b)) {
            atomicOr(&sb[s >> 5], 1u << (s & 31));
        } else if (gather && kb == b) {
            const int pos = atomicAdd(s_nc, 1);
            if (pos < SPARQ_CAND_MAX) {
                sm.hc[pos] = o;
                sm.ci[pos] = s;
            }
        }
    });
    __syncthreads();
}

// With the masses: the eligible candidates of bin b (at or above cand_lo: every one is there) into
// the gathered candidates, as sparq_sel_pass's gather (the calibrated k's crossing bin)
static __device__ void sparq_scored_gather(const sparq_cu_args & a, const sparq_sel_ctx & c, int b,
                                           const sparq_sel_smem & sm, int * s_nc) {
    sparq_scored_each(a, c, [&](unsigned int o, int s) {
        if (s < c.w0 && (int) (o >> SPARQ_NB_SHIFT) == b && !(a.win && sparq_win_bit(a, c.R, s))) {
            const int pos = atomicAdd(s_nc, 1);
            if (pos < SPARQ_CAND_MAX) {
                sm.hc[pos] = o;
                sm.ci[pos] = s;
            }
        }
    });
    __syncthreads();
}

// With the masses: list li's first-pass histograms (a.hist, a.hmass, which the score kernel cleared;
// the list's one block adds into them) from the score tiles' non-empty bins, each tile's masses
// rescaled from its own maximum m_t by exp(m_t - M) / Z; then the window's cells, which the score
// tiles counted as any valid cell, taken out again. Returns the lowest bin from which the tiles'
// candidates hold every valid cell (the highest of their lowest whole bins).
static __device__ int sparq_calib_merge(const sparq_cu_args & a, const sparq_sel_ctx & c, const sparq_sel_smem & sm) {
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    unsigned int * hg = a.hist + (size_t) c.li * SPARQ_NB;
    double * hmg = a.hmass + (size_t) c.li * SPARQ_NB;
    if (tid == 0) {
        sm.s_int[3] = 0;
    }
    __syncthreads();
    const float2 * ts = a.tstat + (size_t) c.u * a.nt_a * a.g + c.h; // (a list per head: its head is c.h)
    for (int t = warp; t < a.nt_a; t += SPARQ_NW) {
        const float mt = ts[(size_t) t * a.g].x;
        if (mt == -INFINITY) {
            continue; // no valid cell (uniform over the warp)
        }
        const double f = exp((double) mt - (double) c.M) * c.iZ;
        const uint2 * bd = sparq_score_bins(a, c.li, t);
        const int n = (int) bd[0].x;
        for (int i = lane; i < n; i += 32) {
            const uint2 e = bd[1 + i];
            const int b = (int) (e.x >> 16);
            atomicAdd(&hg[b], e.x & 0xffffu);
            atomicAdd(&hmg[b], (double) __uint_as_float(e.y) * f);
        }
        if (lane == 0) {
            atomicMax(&sm.s_int[3], (int) sparq_score_cands(a, c.li, t)[0].y);
        }
    }
    // the window's cells: the given window's bits, or the tail's valid cells from w0 on
    const auto drop = [&](int s) {
        const float x = __ldcg(c.keys + s);
        if (x > -INFINITY) {
            const float mt = ts[(size_t) (s / a.tl_a) * a.g].x;
            const int b = (int) (sparq_key_bits(x) >> SPARQ_NB_SHIFT);
            atomicAdd(&hg[b], 0xffffffffu);
            atomicAdd(&hmg[b], -((double) sparq_tile_mass(x, mt) * exp((double) mt - (double) c.M) * c.iZ));
        }
    };
    if (a.win) {
        for (int w = tid; w < a.W; w += SPARQ_NT) {
            unsigned int bits = __ldcg(a.wbits + (size_t) c.R * a.W + w);
            while (bits) {
                const int i = __ffs(bits) - 1;
                bits &= bits - 1u;
                drop(w * 32 + i);
            }
        }
    } else {
        for (int s = c.w0 + tid; s < a.n_kv; s += SPARQ_NT) {
            drop(s);
        }
    }
    __threadfence();
    __syncthreads();
    // a bin left with no cell weighs nothing (not the rounding of its sum and the window's)
    for (int b = tid; b < SPARQ_NB; b += SPARQ_NT) {
        if (__ldcg(hg + b) == 0u || __ldcg(hmg + b) < 0.0) {
            hmg[b] = 0.0;
        }
    }
    __threadfence();
    __syncthreads();
    const int lo = sm.s_int[3];
    __syncthreads();
    return lo;
}

// score_hist's source of a list's choice (sparq_tiles_src's calls): the score tiles' candidates,
// their histogram in shared memory where every tile kept all it found (exact in every bin from the
// list's crossing up, which is all the choice reads), else from a pass over the list
struct sparq_scored_src {
    bool complete; // every score tile kept all its candidates (set by prepare; uniform over the block)
    __device__ int rank_max() const { return SPARQ_CAND_MAX; }
    __device__ void prepare(const sparq_cu_args & a, const sparq_sel_ctx & c, const sparq_sel_smem & sm) {
        complete = sparq_scored_complete(a, c, sm.sh);
        sparq_scored_histogram(a, c, complete, sm);
    }
    __device__ int count(const sparq_cu_args &, const sparq_sel_ctx &, const sparq_sel_smem & sm, int b) const {
        return (int) sm.hc[b];
    }
    __device__ void pass(const sparq_cu_args & a, const sparq_sel_ctx & c, int b, bool all_of_bin, const sparq_sel_smem & sm,
                         int * s_nc) const {
        if (complete) {
            if (c.h == 0) {
                sparq_window_bits(a, c);
            }
            sparq_scored_pass(a, c, b, all_of_bin, !all_of_bin, sm, s_nc);
        } else {
            sparq_sel_pass(a, c, b, all_of_bin, true, !all_of_bin, sm, s_nc);
        }
    }
    __device__ void gather(const sparq_cu_args & a, const sparq_sel_ctx & c, int b, const sparq_sel_smem & sm,
                           int * s_nc) const {
        sparq_sel_pass(a, c, b, false, false, true, sm, s_nc);
    }
};

// calib_hist's source: the merged histograms in the list's scratch (sparq_calib_merge); a crossing
// bin at or above cand_lo has every valid cell among the score tiles' candidates, which its pass and
// gather read instead of the list
struct sparq_mass_src : sparq_tiles_src {
    int cand_lo; // the lowest bin from which the candidates hold every valid cell (SPARQ_NB: none)
    __device__ void pass(const sparq_cu_args & a, const sparq_sel_ctx & c, int b, bool all_of_bin, const sparq_sel_smem & sm,
                         int * s_nc) const {
        if (b >= cand_lo) {
            if (c.h == 0) {
                sparq_window_bits(a, c);
            }
            sparq_scored_pass(a, c, b, all_of_bin, !all_of_bin, sm, s_nc);
        } else {
            sparq_tiles_src::pass(a, c, b, all_of_bin, sm, s_nc);
        }
    }
    __device__ void gather(const sparq_cu_args & a, const sparq_sel_ctx & c, int b, const sparq_sel_smem & sm,
                           int * s_nc) const {
        if (b >= cand_lo) {
            sparq_scored_gather(a, c, b, sm, s_nc);
        } else {
            sparq_tiles_src::gather(a, c, b, sm, s_nc);
        }
    }
};

// source S with the radix passes forced (LLAMA_SPARQ_CUDA_SELECT=radix): no crossing bin is ranked
// in shared memory
template <typename S>
struct sparq_forced_src : S {
    bool radix;
    __device__ sparq_forced_src(const S & s, bool r) : S(s), radix(r) {}
    __device__ int rank_max() const { return radix ? 0 : S::rank_max(); }
};

// One block per list li (the score tiles left its histogram's source, their candidates): the given
// window's cells of the whole row into its window bitmap, then the list's choice. COV (calib_hist):
// the list's mass histogram merged from the score tiles' bins first. With the one launch each unit
// owns its row's copy (sparq_exp_args::fused).
template <bool COV>
static __device__ void sparq_select_scored(const sparq_exp_args & a, const sparq_sel_smem & sm, int * s_nc, int li) {
    sparq_sel_ctx c = sparq_sel_ctx_of(a, li, sm.sh, sm.s_int);
    if (a.fused) {
        c.row_owner = c.h == 0;
    }
    if (c.mode != 0) {
        sparq_tile_dense_row(a, c, 0);
        return;
    }
    if (a.win && a.l > 0) {
        const int st = c.R / a.n_rows, row = c.R % a.n_rows;
        const char * m = sparq_mask_row(a, c.R);
        const int32_t * src = (const int32_t *) (a.win + (size_t) row * a.win_nb1 + (size_t) st * a.win_nb2);
        for (int i = threadIdx.x; i < min(a.l, a.win_n); i += SPARQ_NT) {
            const int s = src[i];
            if (s >= 0 && s < a.n_kv && sparq_valid(a, m, s)) {
                atomicOr(&a.wbits[(size_t) c.R * a.W + (s >> 5)], 1u << (s & 31));
            }
        }
        __syncthreads();
    }
    if constexpr (COV) {
        sparq_mass_src src;
        src.cand_lo = sparq_calib_merge(a, c, sm);
        sparq_select_list(a, c, sm, s_nc, sparq_forced_src<sparq_mass_src>(src, a.force_radix));
    } else {
        sparq_select_list(a, c, sm, s_nc, sparq_forced_src<sparq_scored_src>(sparq_scored_src{}, a.force_radix));
    }
}

// the select as one block per list (grid 1 x L) from the score tiles' candidates (COV: calib_hist)
template <bool COV>
static __global__ void __launch_bounds__(SPARQ_NT) k_sparq_select_scored(const sparq_exp_args a) {
    SPARQ_SELECT_SMEM(false, COV);
    sparq_select_begin<false>(sm);
    sparq_select_scored<COV>(a, sm, &s_nc, blockIdx.y);
}

// a tile's count with SELECT_HIST's choice: one shared-memory add per eligible cell (atomic), or the
// warp vote
struct sparq_tile_count_way {
    bool atomic;
    __device__ void operator()(const sparq_sel_smem & sm, bool el, unsigned int bin) const {
        if (atomic) {
            if (el) {
                atomicAdd(&sm.hc[bin], 1u);
            }
        } else {
            sparq_tile_vote{}(sm, el, bin);
        }
    }
};

// k_sparq_select with the tiles' ways of sparq_exp_args (hist_atomic, keys_early, force_radix; its
// register budget, to compare like with like); with keys_early the tile's loads go before the
// context's own loads and scans, so that the two wait together
template <bool COV>
static __global__ void __launch_bounds__(SPARQ_NT, SPARQ_SELECT_BLOCKS(COV)) k_sparq_select_way(const sparq_exp_args a) {
    SPARQ_SELECT_SMEM(COV, COV);
    SPARQ_SELECT_TILE_SMEM;
    const int t0 = blockIdx.x * SPARQ_TS, t1 = min(a.n_kv, t0 + SPARQ_TS);
    sparq_select_begin<COV>(sm);
    const float * src = sparq_list_logits(a, blockIdx.y);
    float xs[SPARQ_TS_CPT];
    if (a.keys_early) {
        sparq_tile_load(src, t0, t1, xs);
    }
    sparq_sel_ctx c;
    if (!sparq_tile_context(a, sm, sM, siZ, t0, t1, c)) {
        return;
    }
    if (!a.keys_early) {
        sparq_tile_load(src, t0, t1, xs);
    }
    sparq_tile_finish<COV>(a, c, sm, sM, siZ, t0, t1, src, xs, sparq_tile_count_way{ a.hist_atomic != 0 },
                           sparq_forced_src<sparq_tiles_src>(sparq_tiles_src{}, a.force_radix), &s_last, &s_nc);
}
