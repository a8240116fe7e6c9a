// llama-sparq: the candidates every ranking selector shares: a chunk's best cells by a bound from
// group maxima and one vectorised filter (phase_scores and phase_gqa_candidates), and their merge
// over the chunks into the unit's choice (phase_select).

#include "sparq-cpu-phases.h"

#include <functional>

namespace sparq_cpu {

// The bucketed top-k's part of a chunk (select_chunk): its keys ck[0..n) (cells base..) copied into
// the thread's scratch with every cell of row R's window list (added by the merge, not chosen by
// score) and every cell but the best of its bucket in the chunk (the top-k primitive's
// bucket_keep_best) at -inf; the merge then keeps each bucket's best over the chunks (bucket_merge).
static const float * bucket_best(const ctx & C, int ith, const float * ck, int n, int base, int R) {
    const sparq_args * a = C.a;
    const int B = a->topk_buckets;
    const int n_win = a->win && R >= 0 ? C.rinfo(R)->n_win : 0;
    if (n <= B && n_win == 0) {
        return ck; // each cell of the chunk is alone in its bucket here
    }
    float * x = (float *) C.tbuf(ith, C.L.t_bk);
    memcpy(x, ck, (size_t) n * sizeof(float));
    const int32_t * wl = n_win ? C.win(R) : nullptr;
    for (int i = 0; i < n_win; ++i) {
        if (wl[i] >= base && wl[i] < base + n) {
            x[wl[i] - base] = -INFINITY; // added by the merge, not chosen by score
        }
    }
    if (n > B) {
        bucket_keep_best(x, n, base, B, (int32_t *) C.tbuf(ith, C.L.t_bb)); // (n > B: B entries)
    }
    return x;
}

// The candidates of one chunk: keys ck[0..n) of cells base.., of which the kk best
// are wanted. A lower bound t of the kk-th best key is the kk-th best of the maxima
// of G >= kk groups of cells (each such maximum is a key of the chunk); every cell
// with key >= t is a candidate, which are a few more than kk. Only vectorised passes
// touch all n keys; the selection proper (kth_largest) sees ~4 kk group maxima and
// the candidates. Returns the number of candidates written to out (at most cap).
int select_chunk(const ctx & C, int ith, const float * ck, int n, int base, int kk, cand * out, float * bound, int R) {
    if (n <= 0 || kk <= 0) {
        if (bound) {
            *bound = n <= 0 ? -INFINITY : INFINITY; // no cells, or none offered
        }
        return 0;
    }
    if (C.a->topk_buckets > 0 && R >= 0) {
        ck = bucket_best(C, ith, ck, n, base, R);
    }
    const sparq_isa * isa = C.isa;
    int32_t * idx = (int32_t *) C.tbuf(ith, C.L.t_idx);
    float t = -INFINITY;
    // about 4 kk groups of a multiple of 16 cells when the chunk is long; a shorter
    // chunk halves the groups (down to single cells) until there are 4/3 kk of them
    int gs = (n / (4 * kk)) & ~15;
    if (gs < 16) {
        gs = 16;
        while (gs > 1 && (n + gs - 1) / gs < kk + kk / 3) {
            gs /= 2;
        }
    }
    const int G = (n + gs - 1) / gs;
    if (G >= kk) {
        float * gm = (float *) C.tbuf(ith, C.L.t_gm);
        for (int i = 0; i < G; ++i) {
            gm[i] = isa->max(ck + (size_t) i * gs, std::min(gs, n - i * gs));
        }
        t = kth_largest(gm, G, kk);
    }
    if (bound) {
        *bound = t; // -inf: every cell is offered; else every key below t is not
    }
    if (t != -INFINITY) {
        t = std::nextafter(t, -INFINITY); // filter_gt(t') selects key >= t
    }
    const int m = isa->filter_gt(ck, n, t, idx);
    cand * dst = m <= C.L.chunk_cap ? out : (cand *) C.tbuf(ith, C.L.t_big);
    for (int i = 0; i < m; ++i) {
        dst[i].key = ck[idx[i]];
        dst[i].idx = base + idx[i];
    }
    if (m <= C.L.chunk_cap) {
        return m;
    }
    // many ties at the bound: keep the kk best (cells left out may equal the kk-th key)
    const float kth = compact(dst, m, kk);
    if (bound) {
        *bound = std::nextafter(kth, INFINITY);
    }
    memcpy(out, dst, (size_t) kk * sizeof(cand));
    return kk;
}

int merge_candidates(const ctx & C, int u, int w, int ith, const row_info * ri, const int32_t * wl, int kk, cand * merge,
                     int32_t * sel, cov_measure * cov, bool staged, bool * again) {
    const sparq_args * a = C.a;
    int n_sel = 0;
    long reach_sum = 0;
    int reached_all = 1;
    // the given window's cells as bits over their span (wl ascending): one test per candidate (a
    // binary search each cost more than the rest of the merge), and only the span cleared, which
    // for the recent positions is about l cells whatever the context
    uint64_t * wbits = a->win && ri->n_win > 0 ? (uint64_t *) C.tbuf(ith, C.L.t_wbits) : nullptr;
    const int32_t wlo = wbits ? wl[0] : 0;
    const uint32_t wspan = wbits ? (uint32_t) (wl[ri->n_win - 1] - wlo + 1) : 0;
    if (wbits) {
        memset(wbits, 0, (size_t) (wspan + 63) / 64 * sizeof(uint64_t));
        for (int i = 0; i < ri->n_win; ++i) {
            const uint32_t b = (uint32_t) (wl[i] - wlo);
            wbits[b >> 6] |= (uint64_t) 1 << (b & 63);
        }
    }
    // one list (group-shared) or one per query head, merged over the chunks
    for (int h = 0; h < C.L.ph; ++h) {
        int n_m = 0;
        // staged: every eligible cell at or above the largest bound of the chunks was offered, so
        // what is ranked from here on is the candidates at or above it, exactly the best cells of
        // the whole row down to it (a bucket's best is below it only when all of its cells are)
        float bound = -INFINITY;
        for (int c = 0; staged && c < C.L.n_chunks; ++c) {
            bound = std::max(bound, *C.cbound(w, c, h));
        }
        for (int c = 0; c < C.L.n_chunks; ++c) {
            const int n_c = *C.ccount(w, c, h);
            const cand * cc = C.cands(w, c, h);
            for (int i = 0; i < n_c; ++i) {
                // window cells are added below, not chosen by score; each candidate written, and
                // kept or not without a branch (merge has room for one more)
                const cand x = cc[i];
                const uint32_t b = (uint32_t) (x.idx - wlo);
                const bool in_win = b < wspan && ((wbits[b >> 6] >> (b & 63)) & 1);
                merge[n_m] = x;
                n_m += (int) (!in_win & (x.key >= bound));
            }
        }
        if (a->topk_buckets > 0) {
            n_m = bucket_merge(merge, n_m, a->topk_buckets);
        }
        int keep = kk;
        int front = 0; // merge[0..front) are already the best front cells
        if (a->cov_p > 0.0f) {
            // the coverage target: the fewest best cells reaching it (measured, or the selection)
            int reached = 0;
            const int floor = a->cov_apply ? a->k_min - ri->n_win : 0; // (measured only: no floor)
            const int n_cut = sparq_coverage_cut(C, u, w, h, ri, wl, merge, n_m, floor, &reached, &front);
            if (a->cov_apply) {
                // short of the target (a diffuse head): the cap's best cells
                keep = reached ? std::min(kk, std::max(n_cut, floor)) : kk;
            }
            if (bound > -INFINITY && keep > n_m) {
                // fewer candidates above the bound than kept: the chunks offer again at the full cap
                *again = true;
                return 0;
            }
            reach_sum += n_cut;
            reached_all &= reached && n_cut <= kk; // within the cap (k - window)
        }
        if (n_m > keep) {
            // the best keep: among the cut's cells, or the cut's cells and the best of the rest
            if (keep > 0 && keep < front) {
                compact(merge, front, keep);
            } else if (keep > front) {
                compact(merge + front, n_m - front, keep - front);
            }
            n_m = std::max(keep, 0);
        }
        for (int i = 0; i < n_m; ++i) {
            sel[n_sel++] = merge[i].idx;
        }
    }
    if (C.L.ph > 1) {
        // the union of the heads' choices
        std::sort(sel, sel + n_sel);
        n_sel = (int) (std::unique(sel, sel + n_sel) - sel);
    }
    if (cov) {
        cov->n_reach = a->cov_p > 0.0f ? ri->n_win + (int) ((reach_sum + C.L.ph / 2) / C.L.ph) : -1;
        cov->reached = a->cov_p > 0.0f ? reached_all : 0;
    }
    return n_sel;
}

} // namespace sparq_cpu
