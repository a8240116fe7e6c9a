// llama-sparq: the second kernel of GGML_OP_SPARQ_ATTN (sparq-cuda.cu lists the kernels), a list's
// choice by the last tile of the list to finish: the row's description, the calibrated k's cut at the
// coverage target, the bin holding the k-th largest key, those above it and the best of that bin (or
// the bucketed top-k's best offers) into the unit's bitmap, from the select tiles' histogram and
// candidates (sparq_tiles_src).
#pragma once

#include "sparq-cuda-select.cuh"

// Where a list's choice finds its first-pass histogram and the cells of its crossing bins: the
// select tiles' (sparq_tile_histogram, sparq_tile_candidates). The experimental build's sources
// (experimental/sparq-cuda-exp-select.cuh) answer the same calls.
struct sparq_tiles_src {
    // the most cells of a crossing bin ranked in shared memory (more: radix passes over the list)
    __device__ int rank_max() const { return SPARQ_CAND_MAX; }
    // before the crossing of a list's k: nothing (the tiles' histogram is the list's already)
    __device__ void prepare(const sparq_cu_args &, const sparq_sel_ctx &, const sparq_sel_smem &) {}
    // the list's eligible cells in first-pass bin b
    __device__ int count(const sparq_cu_args & a, const sparq_sel_ctx & c, const sparq_sel_smem &, int b) const {
        return (int) __ldcg(a.hist + (size_t) c.li * SPARQ_NB + b);
    }
    // the window (by the unit's first list) and the cells above bin b into the unit's bitmap, b's own
    // too with all_of_bin, else gathered: a fixed k's tiles left their candidates (every cell in a
    // bin from b up among them, where they kept all), else one pass over the list
    __device__ void pass(const sparq_cu_args & a, const sparq_sel_ctx & c, int b, bool all_of_bin, const sparq_sel_smem & sm,
                         int * s_nc) const {
        const unsigned int nc = a.cov_p > 0.0f ? 0xffffffffu : __ldcg(a.ncand + c.li);
        if (nc <= (unsigned int) (a.nt_s * SPARQ_TILE_CAND)) {
            if (c.h == 0) {
                sparq_window_bits(a, c);
            }
            sparq_cand_pass(a, c, b, all_of_bin, !all_of_bin, (int) nc, sm, s_nc);
        } else {
            sparq_sel_pass(a, c, b, all_of_bin, true, !all_of_bin, sm, s_nc);
        }
    }
    // bin b's eligible cells gathered (the calibrated k's crossing bin): a pass over the list
    __device__ void gather(const sparq_cu_args & a, const sparq_sel_ctx & c, int b, const sparq_sel_smem & sm,
                           int * s_nc) const {
        sparq_sel_pass(a, c, b, false, false, true, sm, s_nc);
    }
};

// The calibrated k's cut of list li: the fewest best eligible cells whose mass reaches need (> 0),
// or -1 when that takes more than kk cells (the unit is diffuse and keeps the kk best). From the
// first-pass histograms, then the bin of the crossing: its cells ranked in shared memory, or radix
// passes over the list when there are more of them than fit. *reach: the cut's cells, for the
// report; beyond the cap not ranked further (a lower bound serves): the cells above the crossing's bin
// and one, or every eligible cell when all of them fall short (lower bounds). src: where the
// crossing bin's cells are gathered (sparq_tiles_src).
template <typename SRC>
static __device__ int sparq_coverage_cut(const sparq_cu_args & a, const sparq_sel_ctx & c, double need, int kk,
                                         const sparq_sel_smem & sm, int * s_nc, int * reach, const SRC & src) {
    const int tid = threadIdx.x;
    const unsigned int * hg = a.hist + (size_t) c.li * SPARQ_NB;
    const double * hmg = a.hmass + (size_t) c.li * SPARQ_NB;
    const sparq_cross x = sparq_find_cross<SPARQ_NB / SPARQ_NT>(true, need, [&](int bin) { return (int) __ldcg(hg + bin); },
                                                                [&](int bin) { return __ldcg(hmg + bin); }, sm.sh, sm.shd,
                                                                sm.s_cross);
    if (x.bin < 0 || x.c_above >= kk) {
        *reach = x.bin < 0 ? x.c_total : x.c_above + 1;
        return -1; // short of the target with every eligible cell, or beyond the cap
    }
    const double rem = need - x.m_above;
    if (x.c_bin <= src.rank_max()) {
        if (tid == 0) {
            *s_nc = 0;
            sm.s_int[3] = 0x7fffffff;
        }
        __syncthreads();
        src.gather(a, c, x.bin, sm, s_nc);
        const int n = min(*s_nc, SPARQ_CAND_MAX);
        sparq_sort_cands(sm, n);
        // the running mass over the sorted candidates: a contiguous share per thread
        const int per = (n + SPARQ_NT - 1) / SPARQ_NT;
        const int i0 = min(n, tid * per), i1 = min(n, i0 + per);
        double loc = 0.0;
        for (int i = i0; i < i1; ++i) {
            loc += sparq_key_mass(a, c, sparq_key_float(sm.hc[i]));
        }
        double tot;
        double acc = sparq_block_scan_d(loc, &tot, sm.shd) - loc;
        for (int i = i0; i < i1; ++i) {
            acc += sparq_key_mass(a, c, sparq_key_float(sm.hc[i]));
            if (acc >= rem) {
                atomicMin(&sm.s_int[3], i);
                break;
            }
        }
        __syncthreads();
        const int pos = sm.s_int[3];
        __syncthreads();
        // (past the bin only by rounding between the histogram's sums and these)
        const int n_cut = x.c_above + (pos == 0x7fffffff ? n + 1 : pos + 1);
        *reach = n_cut;
        return n_cut <= kk ? n_cut : -1;
    }
    // radix passes within the bin: 8, 8 and 4 more bits down to the exact key of the crossing
    unsigned int prefix = (unsigned int) x.bin << SPARQ_NB_SHIFT;
    int c_above = x.c_above;
    double m_above = x.m_above;
    const int passes[3][2] = { { 12, 8 }, { 4, 8 }, { 0, 4 } };
    int c_bin = x.c_bin;
    for (int p = 0; p < 3; ++p) {
        const sparq_cross y = sparq_radix_pass(a, c, prefix, passes[p][0], passes[p][1], true, need - m_above, sm);
        if (y.bin < 0) {
            const int n_cut = c_above + c_bin + 1; // (rounding, as above)
            *reach = n_cut;
            return n_cut <= kk ? n_cut : -1;
        }
        prefix |= (unsigned int) y.bin << passes[p][0];
        c_above += y.c_above;
        m_above += y.m_above;
        c_bin = y.c_bin;
    }
    // cells with the crossing's key weigh the same: as many of them as the rest of the target needs
    const double w = sparq_key_mass(a, c, sparq_key_float(prefix));
    int j = w > 0.0 ? (int) ceil((need - m_above) / w) : c_bin;
    j = max(1, min(c_bin, j));
    const int n_cut = c_above + j;
    *reach = n_cut;
    return n_cut <= kk ? n_cut : -1;
}

// The kk (> 0) best eligible cells of list li and the window into the unit's bitmap: from the
// first-pass histogram (src's) the bin holding the kk-th best key; one pass takes the cells above it
// and gathers the bin's cells, the best of which are ranked in shared memory; a bin with more cells
// than fit takes radix passes over the list and a collection in cell order (equal keys to the lower
// cells, as the CPU op).
template <typename SRC>
static __device__ void sparq_choose(const sparq_cu_args & a, const sparq_sel_ctx & c, int kk, const sparq_sel_smem & sm,
                                    int * s_nc, SRC src) {
    const int tid = threadIdx.x;
    src.prepare(a, c, sm);
    const sparq_cross x = sparq_find_cross<SPARQ_NB / SPARQ_NT>(false, (double) kk, [&](int bin) { return src.count(a, c, sm, bin); },
                                                                [&](int) { return 0.0; }, sm.sh, sm.shd, sm.s_cross);
    if (x.bin < 0) {
        sparq_sel_pass(a, c, -1, false, true, false, sm, s_nc); // no more eligible cells than wanted: all
        return;
    }
    const int want = kk - x.c_above;
    if (want == x.c_bin || x.c_bin <= src.rank_max()) {
        if (tid == 0) {
            *s_nc = 0;
        }
        __syncthreads();
        const bool all_of_bin = want == x.c_bin;
        src.pass(a, c, x.bin, all_of_bin, sm, s_nc);
        if (all_of_bin) {
            return;
        }
        const int n = min(*s_nc, SPARQ_CAND_MAX);
        if (want < n) {
            sparq_take_best_cands(a, c, x.bin, n, want, sm);
        } else { // (fewer gathered than counted: only if the two passes disagreed)
            unsigned int * sb = a.selbits + (size_t) c.u * a.W;
            for (int i = tid; i < n; i += SPARQ_NT) {
                const int s = sm.ci[i];
                atomicOr(&sb[s >> 5], 1u << (s & 31));
            }
            __syncthreads();
        }
        return;
    }
    // radix passes within the bin, then the collection in cell order
    sparq_cu_pick pk = {};
    pk.prefix = (unsigned int) x.bin << SPARQ_NB_SHIFT;
    pk.shift = SPARQ_NB_SHIFT;
    pk.want = want;
    pk.n_eq = x.c_bin;
    const int passes[3][2] = { { 12, 8 }, { 4, 8 }, { 0, 4 } };
    for (int p = 0; p < 3 && !pk.done; ++p) { // pk is uniform over the block
        const sparq_cross y = sparq_radix_pass(a, c, pk.prefix, passes[p][0], passes[p][1], false, (double) pk.want, sm);
        pk.prefix |= (unsigned int) y.bin << passes[p][0];
        pk.shift = passes[p][0];
        pk.want -= y.c_above;
        pk.n_eq = y.c_bin;
        if (pk.n_eq == pk.want || pk.shift == 0) {
            pk.done = 1;
            pk.ties = pk.n_eq != pk.want;
        }
    }
    sparq_cu_row ri = {};
    ri.w0 = c.w0;
    const char * m = sparq_mask_row(a, c.R);
    unsigned int * sb = a.selbits + (size_t) c.u * a.W;
    int eq_seen = 0;
    for (int s0 = 0; s0 < a.n_kv; s0 += SPARQ_NT) {
        sparq_collect_chunk(a, ri, c.R, c.h, m, c.keys, pk, true, s0, eq_seen, sm.sh, sb);
    }
}

// The bucketed top-k's choice of list li: the kk (> 0) best of its buckets' offers (the tiles'
// sparq_tile_buckets; sparq_bucket_bound and sparq_bucket_each, sparq-cuda-topk.cuh) and the window
// into the unit's bitmap
static __device__ void sparq_choose_buckets(const sparq_cu_args & a, const sparq_sel_ctx & c, int kk,
                                            const sparq_sel_smem & sm) {
    const unsigned long long * bk = a.bk + (size_t) c.li * a.buckets;
    const unsigned long long lo = sparq_bucket_bound(bk, a.buckets, kk, sm.rc, sm.sh, sm.shd, sm.s_cross);
    if (c.h == 0) {
        sparq_window_bits(a, c);
    }
    unsigned int * sb = a.selbits + (size_t) c.u * a.W;
    sparq_bucket_each(bk, a.buckets, lo, [&](int s) { atomicOr(&sb[s >> 5], 1u << (s & 31)); });
    __syncthreads();
}

// the number of window cells of a row with a given window list: its valid distinct cells, which the
// tile blocks set in the row's window bitmap
static __device__ int sparq_count_win_bits(const sparq_cu_args & a, int R, int * sh) {
    int n = 0;
    for (int w = threadIdx.x; w < a.W; w += SPARQ_NT) {
        n += __popc(__ldcg(a.wbits + (size_t) R * a.W + w));
    }
    int tot;
    sparq_block_scan(n, &tot, sh);
    return tot;
}

// the window's estimated mass for the calibrated k: the mean over the list's heads (every head of
// the group for a shared list) of their softmax over the window's cells and their sinks
static __device__ double sparq_window_mass(const sparq_cu_args & a, const sparq_sel_ctx & c, const sparq_sel_smem & sm) {
    const int h0 = a.ph > 1 ? c.h : 0, h1 = a.ph > 1 ? c.h + 1 : a.g;
    const int tid = threadIdx.x;
    if (tid < h1 - h0) {
        float M;
        double Z;
        sparq_unit_stats(a, c.u, h0 + tid, &M, &Z);
        sm.sMw[tid] = M;
        sm.siZw[tid] = Z > 0.0 ? 1.0 / Z : 0.0;
    }
    __syncthreads();
    const float * lg = a.logits + (size_t) c.u * a.g * a.n_kv;
    double loc = 0.0;
    for (int s = (a.win ? 0 : c.w0) + tid; s < a.n_kv; s += SPARQ_NT) {
        if (a.win ? sparq_win_bit(a, c.R, s) : lg[s] > -INFINITY) {
            for (int hh = h0; hh < h1; ++hh) {
                loc += exp((double) lg[(size_t) hh * a.n_kv + s] - (double) sm.sMw[hh - h0]) * sm.siZw[hh - h0];
            }
        }
    }
    if (a.sinks && tid == 0) {
        // the heads' sinks, always attended, as the window
        for (int hh = h0; hh < h1; ++hh) {
            loc += exp((double) a.sinks[(c.u % a.n_head_kv) * a.g + hh] - (double) sm.sMw[hh - h0]) * sm.siZw[hh - h0];
        }
    }
    double tot;
    sparq_block_scan_d(loc, &tot, sm.shd);
    return tot / (h1 - h0);
}

// The last block of list li to finish its tile: the window's cells counted, the row's description
// for the attend kernel, the calibrated k's cut, then the chosen cells, from src's histogram and
// candidates (sparq_tiles_src). BUCKETS: the bucketed top-k may apply (a fixed k's select tiles; an
// instantiation of its own, so that the others keep their registers).
template <bool BUCKETS = false, typename SRC>
static __device__ void sparq_select_list(const sparq_cu_args & a, const sparq_sel_ctx & c, const sparq_sel_smem & sm,
                                         int * s_nc, const SRC & src) {
    const int n_win = a.l <= 0 ? 0 : a.win ? sparq_count_win_bits(a, c.R, sm.sh) : a.l;
    if (threadIdx.x == 0 && c.row_owner) {
        sparq_cu_row ri;
        ri.n_valid = c.n_valid;
        ri.w0 = c.w0;
        ri.n_win = n_win;
        ri.mode = 0;
        a.rows[c.R] = ri;
    }
    int kk = c.rk - n_win;
    if (a.lrep && threadIdx.x == 0 && (a.cov_p <= 0.0f || kk <= 0)) {
        // not measured: no target, or the window fills the row's cap (as the CPU op)
        a.lrep[2 * c.li] = -1;
        a.lrep[2 * c.li + 1] = 0;
    }
    if (a.cov_p > 0.0f && kk > 0) {
        const double need = (double) a.cov_p - (n_win > 0 ? sparq_window_mass(a, c, sm) : 0.0);
        int n_cut = 0, reach = 0;
        if (need > 0.0) {
            n_cut = sparq_coverage_cut(a, c, need, kk, sm, s_nc, &reach, src);
        }
        if (a.lrep && threadIdx.x == 0) {
            a.lrep[2 * c.li] = reach;
            a.lrep[2 * c.li + 1] = n_cut >= 0;
        }
        if (n_cut >= 0) {
            kk = min(kk, max(n_cut, a.k_min - n_win));
        } // else diffuse: the cap's kk best cells, the rest to the mean of V
    }
    if (kk <= 0) {
        if (c.h == 0) {
            sparq_sel_pass(a, c, 0x7fffffff, false, true, false, sm, s_nc); // the window alone
        }
        return;
    }
    if (BUCKETS && a.buckets > 0) {
        sparq_choose_buckets(a, c, kk, sm);
        return;
    }
    sparq_choose(a, c, kk, sm, s_nc, src);
}
