// llama-sparq: the CPU driver's internal declarations, shared by its files: the scratch layout,
// the per-call context and its accessors, the helpers every phase uses, and the functions of the
// phases and of the selectors' CPU parts (sparq-cpu.cpp runs the phases between barriers).
#pragma once

#include "sparq-cpu.h"
#include "sparq-cpu-selector.h"
#include "sparq-cpu-topk.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

namespace sparq_cpu {

// ---------------------------------------------------------------------------
// scratch layout (sparq-cpu-layout.cpp)
// ---------------------------------------------------------------------------

constexpr int    SPARQ_BLOCK_MAX = 1024;              // cells per approximate-score block (g == 1)
constexpr size_t SPARQ_ALIGN     = 64;
constexpr size_t SPARQ_LOGIT_CAP = (size_t) 64 << 20; // bytes of GQA logits kept at once

inline size_t align_up(size_t x) { return (x + SPARQ_ALIGN - 1) & ~(SPARQ_ALIGN - 1); }

// per query row: valid cells, the local window (its size, its cells ascending in the
// row's window list, and w0: the start of the window when it is the tail of the cells)
struct row_info { int32_t n_valid; int32_t w0; int32_t n_win; int32_t dense_all; };

// per unit, what phase_select decided for phase_attend: the cells of its selection (usel), whether
// each head mixes in the mean of V, or whether it attends over every valid cell instead
struct unit_plan { int32_t n_sel; int32_t mean_v; int32_t all_cells; int32_t n_parts; };

// The exact attention of a unit is split into parts (of its selection, or of its cells when it
// attends over all of them) that any thread may take; each part runs its g heads over blocks of
// att_block cells, and the last part to finish combines the parts' softmax states. The parts
// depend on the unit's cells only, never on the threads, so results do not depend on them either.
constexpr int SPARQ_ATT_BLOCK = 256;  // most cells of a block (its g heads' logits and weights: 2 g x 256 floats)
constexpr int SPARQ_ATT_FLOATS = 8192; // with many heads per KV head, fewer cells: g x block at most this
constexpr int SPARQ_PART_MIN  = 128;  // fewest cells of a part
constexpr int SPARQ_PARTS_MAX = 16;   // most parts of a unit (decode: one query row per stream)

struct layout {
    int n_units;     // units (stream, row, KV head), the work items of the per-unit phases
    int n_rows_all;  // query rows over all streams (n_stream * n_rows)
    int group_size;  // query heads per KV head (GQA group)
    int n_chunks;    // cell chunks a row is split into: one per thread
    int chunk_cap;   // candidates a chunk may offer per selection list
    int wave_units;  // units whose chunk buffers and GQA logits are in scratch at once
    int block_cells; // cells per block of approximate scores (their group_size rows stay in cache)
    int wcap;       // entries of a row's window list: l, or k when that list is the whole choice
    int ph;         // selection lists per unit: g with per-head selection (g > 1), else 1
    int sel_max;    // cells a unit's selection can hold
    int chunk_max;
    size_t off_mask, off_cnt, off_row, off_win, off_i1, off_qs, off_stat, off_ccount, off_cand, off_logit, off_thread;
    size_t off_cbound; // per (wave slot, chunk, list): every eligible key the chunk did not offer is below it
    size_t off_uplan, off_usel, off_ualpha, off_uvbar; // per wave slot: phase_select's plan, cells, alphas, mean of V
    size_t off_sync;   // atomics: per unit, its plan is ready; per wave, the next item to attend; per unit, its parts done
    int parts_max;     // parts a unit's exact attention may be split into (1: none)
    int att_block;     // cells of a block of the exact attention (SPARQ_ATT_BLOCK, fewer with many heads)
    size_t off_part;   // per (wave slot, part): the part's softmax state (att_state)
    // A shared GQA list keeps exp(logit - M_b) per cell (M_b: its chunk's largest logit up to its
    // block, off_blkm per (wave slot, head, chunk, block)), rescaled to the head's maximum once
    // every chunk has scored (sparq_rescale_exps): the group's weights and the selection's mass
    // then need no second exp per cell. Per-head lists keep the logits they rank.
    bool keep_exps;
    int blocks_per_chunk;
    size_t off_blkm;
    int n_waves;
    size_t off_own[2]; // the selector's own shared scratch (its scratch hook sets them; its file reads them)
    // per-thread area: offsets from the thread's base
    size_t t_blk, t_ck, t_idx, t_gm, t_big, t_merge, t_sel, t_ex, t_p, t_vec, t_gh, t_rows, t_wbits;
    size_t t_own[2];   // the selector's own per-thread scratch
    size_t t_bk, t_bb;
    size_t t_aex, t_ap, t_aidx, t_ast, t_aq; // phase_attend: a block's g x B logits and weights, its cells, a state, q rows
    size_t thread_bytes, total;
};

// the cells a selection ranks: k, or more when a coverage target measures beyond k
inline int k_rank(const sparq_args * a) { return a->cov_p > 0.0f ? std::max(a->k, a->k_scan) : a->k; }

// candidates a chunk may offer (never more than its cells)
inline int sparq_cap(const sparq_args * a, int chunk_max) { return std::max(16, std::min(4 * k_rank(a), chunk_max)); }

// the arguments a selector actually runs with (its args hook)
sparq_args effective_args(const sparq_args * a);
layout make_layout(const sparq_args * a, int nth);

// ---------------------------------------------------------------------------
// one call's context: the arguments, the ISA, the layout and the scratch's views
// ---------------------------------------------------------------------------

struct ctx {
    const sparq_args * a;
    const sparq_isa  * isa;
    const selector   * sel;
    layout L;
    char * base;

    float     * maskf(int row)              const { return (float *) (base + L.off_mask) + (size_t) row * a->n_kv; }
    int32_t   * cnt(int row)                const { return (int32_t *) (base + L.off_cnt) + (size_t) row * L.n_chunks; }
    row_info  * rinfo(int row)              const { return (row_info *) (base + L.off_row) + row; }
    int32_t   * win(int row)                const { return (int32_t *) (base + L.off_win) + (size_t) row * (L.wcap + 1); }
    int32_t   * i1(int u)                   const { return (int32_t *) (base + L.off_i1) + (size_t) u * a->r; }
    float     * qs(int u)                   const { return (float *) (base + L.off_qs) + (size_t) u * L.group_size * a->r; }
    float     * stat(int w, int c)          const { return (float *) (base + L.off_stat) + ((size_t) w * L.n_chunks + c) * L.group_size * 2; }
    int32_t   * ccount(int w, int c, int h = 0) const {
        return (int32_t *) (base + L.off_ccount) + ((size_t) w * L.n_chunks + c) * L.ph + h;
    }
    float     * cbound(int w, int c, int h = 0) const {
        return (float *) (base + L.off_cbound) + ((size_t) w * L.n_chunks + c) * L.ph + h;
    }
    cand      * cands(int w, int c, int h = 0) const {
        return (cand *) (base + L.off_cand) + (((size_t) w * L.n_chunks + c) * L.ph + h) * L.chunk_cap;
    }
    unit_plan * uplan(int w)                const { return (unit_plan *) (base + L.off_uplan) + w; }
    int32_t   * usel(int w)                 const { return (int32_t *) (base + L.off_usel) + (size_t) w * (L.sel_max + 1); }
    float     * ualpha(int w)               const { return (float *) (base + L.off_ualpha) + (size_t) w * L.group_size; }
    float     * uvbar(int w)                const { return (float *) (base + L.off_uvbar) + (size_t) w * a->dv; }
    std::atomic<int32_t> * unit_ready(int u) const { return (std::atomic<int32_t> *) (base + L.off_sync) + u; }
    std::atomic<int32_t> * next_item(int wv) const { return (std::atomic<int32_t> *) (base + L.off_sync) + L.n_units + wv; }
    std::atomic<int32_t> * parts_done(int u) const { return (std::atomic<int32_t> *) (base + L.off_sync) + L.n_units + L.n_waves + u; }
    // the softmax state of part p of wave slot w: per head its largest logit, its sum of exp, its output
    float     * part_state(int w, int p)    const {
        return (float *) (base + L.off_part) + ((size_t) w * L.parts_max + p) * L.group_size * (a->dv + 2);
    }
    // the approximate logits of query head h (per-head lists), or their exponentials (keep_exps)
    float     * logits(int w, int h)        const { return (float *) (base + L.off_logit) + ((size_t) w * L.group_size + h) * a->n_kv; }
    float     * exps(int w, int h)          const { return logits(w, h); }
    float     * blkm(int w, int h, int c)   const {
        return (float *) (base + L.off_blkm) + (((size_t) w * L.group_size + h) * L.n_chunks + c) * L.blocks_per_chunk;
    }
    char      * tbuf(int ith, size_t off)   const { return base + L.off_thread + (size_t) ith * L.thread_bytes + off; }

    // unit u = (stream * n_rows + row) * n_head_kv + kvh
    int unit_row(int u) const { return u / a->n_head_kv; }        // row index over all streams
    int unit_kvh(int u) const { return u % a->n_head_kv; }
    int row_stream(int R) const { return R / a->n_rows; }
    int row_in_stream(int R) const { return R % a->n_rows; }

    const void * mask_row_raw(int R) const {
        const int st = row_stream(R);
        return (const char *) a->mask + (size_t) row_in_stream(R) * a->mask_nb1 + (size_t) (st % a->mask_ne3) * a->mask_nb3;
    }
    // f32 view of the mask row (NULL when there is no mask)
    const float * mask_row(int R) const {
        if (!a->mask) {
            return nullptr;
        }
        return a->mask_type == SPARQ_F32 ? (const float *) mask_row_raw(R) : maskf(R);
    }
    // query head h's bias over the cells of row R (n_kv floats), NULL without a bias
    const float * bias_row(int R, int h) const {
        if (!a->kq_b) {
            return nullptr;
        }
        return (const float *) ((const char *) a->kq_b + (size_t) row_in_stream(R) * a->kq_b_nb1 + (size_t) h * a->kq_b_nb2 +
                                (size_t) (row_stream(R) % a->kq_b_ne3) * a->kq_b_nb3);
    }
    const float * q_row(int R, int h) const {
        return (const float *) ((const char *) a->q + (size_t) row_in_stream(R) * a->q_nb1 + (size_t) h * a->q_nb2 +
                                (size_t) row_stream(R) * a->q_nb3);
    }
    // the query in K^T's basis (steps 1-2)
    const float * qsel_row(int R, int h) const {
        if (!a->q_sel) {
            return q_row(R, h);
        }
        return (const float *) ((const char *) a->q_sel + (size_t) row_in_stream(R) * a->q_sel_nb1 +
                                (size_t) h * a->q_sel_nb2 + (size_t) row_stream(R) * a->q_sel_nb3);
    }
    const float * comp_w(int kvh, int st) const {
        return a->comp_w ? (const float *) ((const char *) a->comp_w + (size_t) kvh * a->comp_w_nb1 +
                                            (size_t) st * a->comp_w_nb2) : nullptr;
    }
    const char * K_row(int st, int kvh, int i) const {
        return (const char *) a->K + (size_t) i * a->K_nb1 + (size_t) kvh * a->K_nb2 + (size_t) st * a->K_nb3;
    }
    const char * V_row(int st, int kvh, int i) const {
        return (const char *) a->V + (size_t) i * a->V_nb1 + (size_t) kvh * a->V_nb2 + (size_t) st * a->V_nb3;
    }
    const char * KT_row(int st, int kvh, int comp) const {
        return (const char *) a->KT + (size_t) comp * a->KT_nb1 + (size_t) kvh * a->KT_nb2 + (size_t) st * a->KT_nb3;
    }
    // the output of query head h of row R
    float * out_row(int R, int h) const {
        return (float *) ((char *) a->out + (size_t) h * a->out_nb1 + (size_t) row_in_stream(R) * a->out_nb2 +
                          (size_t) row_stream(R) * a->out_nb3);
    }
};

// ---------------------------------------------------------------------------
// helpers of every phase
// ---------------------------------------------------------------------------

inline bool is_valid(float m) { return m != -INFINITY; }

// a spin-wait's pause (another thread is about to publish what this one waits for)
inline void sparq_pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

inline void chunk_range(int n, int c, int nc, int * s0, int * s1) {
    *s0 = (int) (((int64_t) n * c) / nc);
    *s1 = (int) (((int64_t) n * (c + 1)) / nc);
}

// positions chosen by score (the window fills the rest of k)
// the most cells a row of n_valid valid cells attends before it runs dense: k, or with a per-row cap
// (sparq_args::k_frac) the row's own, which depends on its stream only
inline int row_k(const sparq_args * a, int n_valid) {
    if (a->k_frac <= 0.0f) {
        return a->k;
    }
    const double cap = std::ceil((double) a->k_frac * (double) n_valid);
    return (int) std::min<double>(a->k, std::max<double>(a->k_min, cap));
}

inline int row_kk(const sparq_args * a, const row_info * ri) {
    return row_k(a, ri->n_valid) - ri->n_win;
}

// how many best-scoring cells a chunk must offer: with a given window list the window
// cells are not excluded while scanning, so up to n_win of the best may be window cells
inline int row_kk_scan(const sparq_args * a, const row_info * ri) {
    const int kk = k_rank(a) - ri->n_win;
    return a->win && kk > 0 ? kk + ri->n_win : kk;
}

// The calibrated k with GQA ranks in two stages: each chunk first offers only the candidates a
// typical cut needs (row_kk_first: at least 2 k_min, an eighth of the row's cap), with the bound
// under which it left cells out; a list's cut found among the candidates above every chunk's bound
// is the cut over all cells, and a unit whose cut is not (its attention spread wide) offers again
// at the full cap. The same cells either way; the first stage ranks a fraction of them.
inline bool staged_selection(const sparq_args * a, int g) {
    return a->cov_apply && a->cov_p > 0.0f && g > 1 && selector_of(a->selector).ranks_scores;
}

inline int row_kk_first(const sparq_args * a, const row_info * ri) {
    const int first = std::max(2 * a->k_min, row_k(a, ri->n_valid) / 8) + (a->win ? ri->n_win : 0);
    return std::min(row_kk_scan(a, ri), first);
}

// x . row, for a K or V row of type t (n values)
inline float dot_row(const sparq_isa * isa, sparq_type t, const float * x, const char * row, int n) {
    switch (t) {
        case SPARQ_F16:  return isa->dot_f16(x, (const uint16_t *) row, n);
        case SPARQ_Q8_0: return isa->dot_q8_0(x, (const sparq_block_q8_0 *) row, n);
        case SPARQ_F32:  return isa->dot_f32(x, (const float *) row, n);
        default: {
            float out;
            sparq_dot_blocks_g(isa, t, &x, 1, row, n, &out, 0);
            return out;
        }
    }
}

// y += p * row, for a K or V row of type t (n values)
inline void axpy_row(const sparq_isa * isa, sparq_type t, float * y, const char * row, float p, int n) {
    switch (t) {
        case SPARQ_F16:  isa->axpy_f16(y, (const uint16_t *) row, p, n); break;
        case SPARQ_Q8_0: isa->axpy_q8_0(y, (const sparq_block_q8_0 *) row, p, n); break;
        case SPARQ_F32:  isa->axpy_f32(y, (const float *) row, p, n); break;
        default:         sparq_axpy_blocks_g(isa, t, y, 0, 1, row, &p, 0, n); break;
    }
}

// dot_row for g queries q[h] into out[h * ostride], the row read once (a 4- or 5-bit row dequantized once)
inline void dot_row_g(const sparq_isa * isa, sparq_type t, const float * const * q, int g, const char * row, int n,
                      float * out, size_t ostride) {
    if (sparq_dequant_of(t)) {
        sparq_dot_blocks_g(isa, t, q, g, row, n, out, ostride);
        return;
    }
    for (int h = 0; h < g; ++h) {
        out[h * ostride] = dot_row(isa, t, q[h], row, n);
    }
}

// axpy_row for g weights p[h * pstride] into y[h * ystride ..], the row read once
inline void axpy_row_g(const sparq_isa * isa, sparq_type t, float * y, size_t ystride, int g, const char * row,
                       const float * p, size_t pstride, int n) {
    if (sparq_dequant_of(t)) {
        sparq_axpy_blocks_g(isa, t, y, ystride, g, row, p, pstride, n);
        return;
    }
    for (int h = 0; h < g; ++h) {
        axpy_row(isa, t, y + h * ystride, row, p[h * pstride], n);
    }
}

// ALiBi's slope of query head h, as ggml's soft_max_ext and flash_attn_ext take it; 1 without ALiBi
inline float alibi_slope(const sparq_args * a, int h) {
    if (a->max_bias <= 0.0f) {
        return 1.0f;
    }
    const uint32_t n_head_log2 = 1u << (uint32_t) floorf(log2f((float) a->n_head));
    const float m0 = powf(2.0f, -(a->max_bias) / n_head_log2);
    const float m1 = powf(2.0f, -(a->max_bias / 2.0f) / n_head_log2);
    return (uint32_t) h < n_head_log2 ? powf(m0, h + 1) : powf(m1, 2 * (h - (int) n_head_log2) + 1);
}

// what one query head of one row adds to its logits: ALiBi's slope (on the mask) and its bias row
// (NULL: none), the same in the approximate and the exact scores
struct head_terms {
    float slope;
    const float * bias;
};
inline head_terms head_terms_of(const ctx & C, int R, int h) {
    return { alibi_slope(C.a, h), C.bias_row(R, h) };
}

// the logit x (scale included) of cell s with the variants: soft-capped, plus scale times the bias,
// plus the mask row m's value (NULL: none) times the slope
inline float variant_logit(const sparq_args * a, float x, const head_terms & t, const float * m, int s) {
    if (a->softcap > 0.0f) {
        x = a->softcap * tanhf(x / a->softcap);
    }
    if (t.bias) {
        x += a->scale * t.bias[s];
    }
    return m ? x + t.slope * m[s] : x;
}

// the variants over a block of n logits x (scale included) of one head, cells s0.. of mask row m
inline void variant_logits(const sparq_args * a, float * x, int n, const head_terms & t, const float * m, int s0) {
    if (a->softcap > 0.0f) {
        const float c = a->softcap, ic = 1.0f / a->softcap;
        for (int s = 0; s < n; ++s) {
            x[s] = c * tanhf(x[s] * ic);
        }
    }
    if (t.bias) {
        const float * b = t.bias + s0;
        for (int s = 0; s < n; ++s) {
            x[s] += a->scale * b[s];
        }
    }
    if (m) {
        for (int s = 0; s < n; ++s) {
            x[s] += t.slope * m[s0 + s];
        }
    }
}

// query head h's sink folded into a softmax of maximum *M and sum *P (relative to *M): the new
// maximum and sum, and the factor that rescales what was relative to the old maximum (1 without a
// sink)
inline float sink_fold(const sparq_args * a, int h, float * M, double * P) {
    if (!a->sinks) {
        return 1.0f;
    }
    const float sk = a->sinks[h];
    float f = 1.0f;
    if (sk > *M) {
        f = *M == -INFINITY ? 0.0f : expf(*M - sk);
        *P *= f;
        *M = sk;
    }
    *P += exp((double) sk - *M);
    return f;
}

// the exact logit of query q and cell s of (stream, KV head), the variants and mask included
inline float exact_logit(const ctx & C, const float * q, int st, int kvh, int s, const float * m, const head_terms & t) {
    const sparq_args * a = C.a;
    const float e = dot_row(C.isa, a->K_type, q, C.K_row(st, kvh, s), a->d);
    return variant_logit(a, e * a->scale, t, m, s);
}

// ---------------------------------------------------------------------------
// candidates, shared by every selector that ranks cells (sparq-cpu-candidates.cpp)
// ---------------------------------------------------------------------------

// the kk best of a chunk's keys ck[0..n) (cells base..) into out; returns their number. bound
// (optional): every key > -inf of the chunk that was not offered is below it (-inf: all were).
// With topk_buckets, R >= 0 (the row) and the bucketed top-k: only each bucket's best cell of the
// chunk outside the row's window list is offered (merge_candidates keeps each bucket's best)
int select_chunk(const ctx & C, int ith, const float * ck, int n, int base, int kk, cand * out,
                 float * bound = nullptr, int R = -1);
// phase_select: the chunks' candidates of wave slot w (less the cells of the window list wl) merged
// into the kk best of each list, their cells into sel (merge[0..kk) keeps the last list's keys);
// returns their number
// With a coverage target (cov_p) the chunks offer k_rank cells and each list is first cut by
// sparq_coverage_cut; cov (optional) gets its measure. staged: the chunks offered the first
// stage's candidates (staged_selection); *again is set, and nothing chosen, when a list's cut or
// selection is not proven among them: the unit's chunks must offer at the full cap (unstaged).
struct cov_measure { int n_reach; int reached; };
int merge_candidates(const ctx & C, int u, int w, int ith, const row_info * ri, const int32_t * wl, int kk, cand * merge,
                     int32_t * sel, cov_measure * cov, bool staged = false, bool * again = nullptr);

// ---------------------------------------------------------------------------
// the phases (sparq-cpu.cpp runs them in this order; sparq-cpu.h says what each does)
// ---------------------------------------------------------------------------

void phase_components(const ctx & C, int ith, int nth);             // sparq-cpu-prepare.cpp
void phase_windows(const ctx & C, int ith, int nth);
void phase_scores(const ctx & C, int wb, int we, int ith);             // sparq-cpu-scores.cpp
void phase_gqa_candidates(const ctx & C, int wb, int we, int ith);
void phase_select(const ctx & C, int wb, int we, int ith, int nth);    // sparq-cpu-attend.cpp
void phase_attend(const ctx & C, int wb, int we, int ith, int nth);

// ---------------------------------------------------------------------------
// the parts of the selectors that rank approximate scores, which the phases share; the rest of
// every selector is behind its hooks (sparq-cpu-selector.h)
// ---------------------------------------------------------------------------

// sparq-cpu-select-sparq.cpp
// phase_components, per unit: the r components i1 and the scaled query components qs (every
// selector runs it; the baselines with r = 1, which nothing reads); absq, order, wts: d scratch entries each
void sparq_components(const ctx & C, int u, float * absq, int32_t * order, float * wts);
// phase_scores, per unit and chunk [s0, s1): approximate logits from K^T, softmax statistics, and
// the chunk's candidates (g == 1) or the group's logits (g > 1, for phase_gqa_candidates)
void sparq_chunk_scores(const ctx & C, int u, int w, int s0, int s1, int ith);
// phase_gqa_candidates, per unit and chunk c = [s0, s1) (the whole chunk, its window's cells too),
// before the candidates (keep_exps): each kept exponential rescaled to exp(l - M) with M its head's
// maximum (head_softmax), once per op call
void sparq_rescale_exps(const ctx & C, int u, int w, int s0, int s1, int c);
// phase_gqa_candidates, per unit and chunk c = [s0, s1) before the window: the GQA candidates (per
// head, or by the group-summed normalised scores), kk of them, with the chunk's bound; scratch of
// thread ith
void sparq_group_candidates(const ctx & C, int u, int w, int s0, int s1, int kk, int c, int ith);
// phase_select (the staged calibrated k): every chunk's GQA candidates of unit u again at the full
// cap, by thread ith alone
void sparq_group_candidates_all(const ctx & C, int u, int w, int ith);
// phase_select, per query head hh: alpha, the approximate softmax mass of the selection (ap: n_sel
// floats of scratch)
float sparq_alpha(const ctx & C, int u, int w, int hh, const int32_t * sel, int n_sel, int n_cand,
                  const cand * merge, const float * m, float * ap);
// phase_select, per selection list h of unit u: the coverage target's cut of its n candidates
// (merge[0..n), unordered): moves the fewest best ones whose estimated mass, with the window's,
// reaches cov_p to the front and returns how many that is (n when they all fall short; *reached
// says which); the caller clamps it. When the target is reached by fewer than floor, the best
// min(floor, n) are at the front; *front says how many best cells are.
int sparq_coverage_cut(const ctx & C, int u, int w, int h, const row_info * ri, const int32_t * wl, cand * merge,
                       int n, int floor, int * reached, int * front);

// the paper's baselines' arguments: no approximate scores, no mean of V, one choice per KV head
// (sparq-cpu-layout.cpp)
void baseline_args(sparq_args & b);

} // namespace sparq_cpu
