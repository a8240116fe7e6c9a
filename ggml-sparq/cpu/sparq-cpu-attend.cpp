// llama-sparq: the last two phases of the CPU driver. phase_select, per unit: the final selection
// (the chunks' candidates merged, plus the window), the mean of V and each head's alpha;
// phase_attend, per part of a unit (per (unit, query head) for a selector with even_attend): exact attention over the
// unit's selection, the mean-value reallocation and the output. Rows of a stream marked dense
// attend over every valid cell.

#include "sparq-cpu-phases.h"

namespace sparq_cpu {

// exact attention of query head hh of unit u over every valid cell (a stream marked dense): one
// pass with a running maximum, no selection buffer
static void dense_head(const ctx & C, int u, int hh, int ith) {
    const sparq_args * a = C.a;
    const int S = a->n_kv, dv = a->dv;
    const int R = C.unit_row(u), kvh = C.unit_kvh(u), st = C.row_stream(R);
    const float * m = C.mask_row(R);
    float * y = (float *) C.tbuf(ith, C.L.t_vec);
    const int h = kvh * C.L.group_size + hh;
    const float * q = C.q_row(R, h);
    const head_terms ht = head_terms_of(C, R, h);
    float M = -INFINITY, P = 0.0f;
    for (int j = 0; j < dv; ++j) {
        y[j] = 0.0f;
    }
    for (int s = 0; s < S; ++s) {
        if (m && !is_valid(m[s])) {
            continue;
        }
        const float e = exact_logit(C, q, st, kvh, s, m, ht);
        if (e > M) {
            const float f = M == -INFINITY ? 0.0f : expf(M - e);
            for (int j = 0; j < dv; ++j) {
                y[j] *= f;
            }
            P *= f;
            M = e;
        }
        const float p = expf(e - M);
        P += p;
        axpy_row(C.isa, a->V_type, y, C.V_row(st, kvh, s), p, dv);
    }
    double Pd = P;
    const float f = sink_fold(a, h, &M, &Pd); // (the sink's value row is zero: y only rescaled)
    P = (float) Pd;
    const float iP = P > 0.0f ? 1.0f / P : 0.0f;
    float * o = C.out_row(R, h);
    for (int j = 0; j < dv; ++j) {
        o[j] = y[j] * f * iP;
    }
    if (C.sel->attended_dense) {
        C.sel->attended_dense(C, ith, st, kvh, q, m, ht, M, iP);
    }
}

// row R's cells into sel: the first k valid cells of a row with at most k (dense), else the
// chunks' merged candidates (*n_cand of them, first) and the window list; returns their number
static int unit_selection(const ctx & C, int u, int w, int R, bool dense, cand * merge, int32_t * sel, int * n_cand,
                          cov_measure * cov, int ith) {
    const sparq_args * a = C.a;
    const int S = a->n_kv;
    const row_info * ri = C.rinfo(R);
    const float * m = C.mask_row(R);
    int n_sel = 0;
    if (dense) {
        for (int s = 0; s < S && n_sel < a->k; ++s) {
            if (!m || is_valid(m[s])) {
                sel[n_sel++] = s;
            }
        }
    } else {
        const int kk = row_kk(a, ri);
        const int32_t * wl = C.win(R);
        if (kk > 0) {
            bool again = false;
            n_sel = merge_candidates(C, u, w, ith, ri, wl, kk, merge, sel, cov, staged_selection(a, C.L.group_size), &again);
            if (again) {
                sparq_group_candidates_all(C, u, w, ith);
                n_sel = merge_candidates(C, u, w, ith, ri, wl, kk, merge, sel, cov);
            }
            *n_cand = n_sel;
        }
        for (int i = 0; i < ri->n_win; ++i) {
            sel[n_sel++] = wl[i];
        }
    }
    return n_sel;
}

// the selected K and V rows are scattered: ask for all of them before using any
// always_inline: as a function of its own, GCC finds it has no effect (prefetches only) and drops the call
static inline __attribute__((always_inline)) void prefetch_rows(const ctx & C, int st, int kvh, const int32_t * sel,
                                                                int n_sel) {
    const sparq_args * a = C.a;
    const size_t kb = sparq_row_bytes(a->K_type, a->d);
    const size_t vb = sparq_row_bytes(a->V_type, a->dv);
    for (int t = 0; t < n_sel; ++t) {
        const char * kr = C.K_row(st, kvh, sel[t]);
        const char * vr = C.V_row(st, kvh, sel[t]);
        for (size_t o = 0; o < kb; o += 64) {
            __builtin_prefetch(kr + o);
        }
        for (size_t o = 0; o < vb; o += 64) {
            __builtin_prefetch(vr + o);
        }
    }
}

// vbar: the mean of V over the stream's cells (with mean_v, for a row that is not the stream's
// last, less the cells it may not see)
static void mean_of_v(const ctx & C, int R, int kvh, const float * m, bool mean_v, float * vbar) {
    const sparq_args * a = C.a;
    const int S = a->n_kv, dv = a->dv, st = C.row_stream(R);
    float cnt = fabsf(a->v_count[st]);
    const float * vs = (const float *) ((const char *) a->v_sum + (size_t) kvh * a->v_sum_nb1 + (size_t) st * a->v_sum_nb2);
    for (int j = 0; j < dv; ++j) {
        vbar[j] = vs[j];
    }
    const int row = C.row_in_stream(R);
    if (mean_v && m && row + 1 < a->n_rows) {
        // several rows (all-rows evaluation): the sums hold the whole ubatch, so leave out
        // the cells this row may not see that the stream's last row sees (the later rows)
        const float * ml = C.mask_row(R + (a->n_rows - 1 - row));
        for (int c = 0; c < S; ++c) {
            if (is_valid(ml[c]) && !is_valid(m[c])) {
                axpy_row(C.isa, a->V_type, vbar, C.V_row(st, kvh, c), -1.0f, dv);
                cnt -= 1.0f;
            }
        }
    }
    for (int j = 0; j < dv; ++j) {
        vbar[j] = cnt > 0.0f ? vbar[j] / cnt : 0.0f;
    }
}

// what the stream's last row did, per KV head (sparq_args::report)
static void report_unit(const ctx & C, int u, int n_sel, float alpha, const cov_measure & cov) {
    const sparq_args * a = C.a;
    const int R = C.unit_row(u);
    float * rp = a->report + ((size_t) C.row_stream(R) * a->n_head_kv + C.unit_kvh(u)) * 4;
    rp[0] = (float) n_sel;
    rp[1] = alpha;
    rp[2] = (float) cov.n_reach;
    rp[3] = (float) cov.reached;
}

// every listed cell of unit u's selection output -1 (the unit attends over every valid cell)
static void sel_out_all(const ctx & C, int u) {
    int32_t * so = C.a->sel_out + (size_t) u * C.a->sel_n;
    for (int t = 0; t < C.a->sel_n; ++t) {
        so[t] = -1;
    }
}

// the parts of a unit's exact attention over n cells
static int unit_parts(const ctx & C, int n) {
    return std::max(1, std::min(C.L.parts_max, n / SPARQ_PART_MIN));
}

// unit u (wave slot w): its plan for phase_attend
static void select_unit(const ctx & C, int u, int w, int ith) {
    const sparq_args * a = C.a;
    cand * merge = (cand *) C.tbuf(ith, C.L.t_merge);
    int32_t * tmp = (int32_t *) C.tbuf(ith, C.L.t_ex);
    float * ap = (float *) C.tbuf(ith, C.L.t_p);
    const int g = C.L.group_size;
    const int R = C.unit_row(u);
    const row_info * ri = C.rinfo(R);
    unit_plan * up = C.uplan(w);
    const bool dense = ri->dense_all || ri->n_valid <= row_k(a, ri->n_valid);
    if (C.sel->selected) {
        C.sel->selected(C, u, w, dense);
    }
    const bool report = a->report && C.row_in_stream(R) == a->n_rows - 1;
    up->n_sel = 0;
    up->mean_v = 0;
    up->all_cells = 0;
    up->n_parts = unit_parts(C, ri->n_valid);
    if (ri->dense_all) {
        up->all_cells = 1;
        if (report) {
            report_unit(C, u, -1, 1.0f, cov_measure{ -1, 0 });
        }
        if (a->sel_out) {
            sel_out_all(C, u);
        }
        return;
    }
    int32_t * sel = C.usel(w);
    int n_cand = 0;
    cov_measure cov{ -1, 0 };
    const int n_sel = unit_selection(C, u, w, R, dense, merge, sel, &n_cand, &cov, ith);
    up->n_sel = n_sel;
    up->n_parts = unit_parts(C, n_sel);
    const bool mean_v = !dense && !a->no_mean_v;
    up->mean_v = mean_v;
    mean_of_v(C, R, C.unit_kvh(u), C.mask_row(R), mean_v, C.uvbar(w));
    // alpha: approximate softmax mass of the selection (also measured for the report when the
    // selector has approximate scores)
    const bool measure = mean_v || (a->report && !dense && C.sel->ranks_scores);
    const float * m = C.mask_row(R);
    double alpha = 0.0;
    for (int hh = 0; hh < g; ++hh) {
        const float al = measure ? sparq_alpha(C, u, w, hh, sel, n_sel, dense ? -1 : n_cand, merge, m, ap) : 1.0f;
        C.ualpha(w)[hh] = al;
        alpha += al;
    }
    if (report) {
        report_unit(C, u, dense ? -1 : n_sel, (float) (alpha / g), cov);
    }
    if (a->sel_out) {
        int32_t * so = a->sel_out + (size_t) u * a->sel_n;
        memcpy(tmp, sel, (size_t) n_sel * sizeof(int32_t));
        std::sort(tmp, tmp + n_sel);
        for (int t = 0; t < a->sel_n; ++t) {
            so[t] = t < n_sel ? tmp[t] : -1;
        }
    }
}

// ----- phase_select: per unit, its cells, the mean of V and each head's alpha; each unit marked
// ready (release) for phase_attend, which needs no barrier before it -----
void phase_select(const ctx & C, int wb, int we, int ith, int nth) {
    for (int u = wb + ith; u < we; u += nth) {
        select_unit(C, u, u - wb, ith);
        C.unit_ready(u)->store(1, std::memory_order_release);
    }
}

// query head hh of unit u: exact attention over the unit's selection, mixed with its vbar by
// its alpha, into the output (ex, p, y: scratch)
static void attend_head(const ctx & C, int u, int w, int hh, float * ex, float * p, float * y, int ith) {
    const sparq_args * a = C.a;
    const int dv = a->dv;
    const int R = C.unit_row(u), kvh = C.unit_kvh(u), st = C.row_stream(R);
    const unit_plan * up = C.uplan(w);
    const int32_t * sel = C.usel(w);
    const int n_sel = up->n_sel;
    const float * m = C.mask_row(R);
    const int h = kvh * C.L.group_size + hh;
    const float * q = C.q_row(R, h);
    const head_terms ht = head_terms_of(C, R, h);
    if (sparq_block_bytes(a->K_type)) {
        for (int t = 0; t < n_sel; ++t) {
            ex[t] = exact_logit(C, q, st, kvh, sel[t], m, ht);
        }
    } else {
        const void * K0 = C.K_row(st, kvh, 0);
        if (a->K_type == SPARQ_F16) {
            C.isa->gather_dot_f16(q, K0, a->K_nb1, sel, n_sel, a->d, ex);
        } else {
            C.isa->gather_dot_f32(q, K0, a->K_nb1, sel, n_sel, a->d, ex);
        }
        for (int t = 0; t < n_sel; ++t) {
            ex[t] = variant_logit(a, ex[t] * a->scale, ht, m, sel[t]);
        }
    }
    float M = n_sel > 0 ? C.isa->max(ex, n_sel) : -INFINITY;
    double P_sink = 0.0;
    sink_fold(a, h, &M, &P_sink); // M includes the sink; P_sink its exp (0 without one)
    for (int t = 0; t < n_sel; ++t) {
        p[t] = 0.0f;
    }
    if (M != -INFINITY) {
        C.isa->exp_acc(ex, n_sel, M, 1.0f, p);
    }
    for (int j = 0; j < dv; ++j) {
        y[j] = 0.0f;
    }
    float P = (float) P_sink;
    for (int t = 0; t < n_sel; ++t) {
        P += p[t];
    }
    if (sparq_block_bytes(a->V_type)) {
        for (int t = 0; t < n_sel; ++t) {
            axpy_row(C.isa, a->V_type, y, C.V_row(st, kvh, sel[t]), p[t], dv);
        }
    } else if (a->V_type == SPARQ_F16) {
        C.isa->gather_axpy_f16(y, C.V_row(st, kvh, 0), a->V_nb1, sel, p, n_sel, dv);
    } else {
        C.isa->gather_axpy_f32(y, C.V_row(st, kvh, 0), a->V_nb1, sel, p, n_sel, dv);
    }
    const float iP = P > 0.0f ? 1.0f / P : 0.0f;
    if (C.sel->attended) {
        C.sel->attended(C, ith, st, kvh, sel, ex, n_sel, M, iP);
    }
    const float alpha = C.ualpha(w)[hh];
    const float * vbar = C.uvbar(w);
    float * o = C.out_row(R, h);
    const float ay = up->mean_v ? alpha * iP : iP, av = up->mean_v ? 1.0f - alpha : 0.0f;
    for (int j = 0; j < dv; ++j) {
        o[j] = ay * y[j] + av * vbar[j];
    }
}

// ----- the exact attention by parts (every selector without even_attend) -----

// a part's softmax state: per head its largest logit M, its sum of exp P (relative to M), and its
// output y (g rows of dv), unnormalised
struct att_state {
    float * M;
    float * P;
    float * y;
    att_state(float * base, int g) : M(base), P(base + g), y(base + 2 * g) {}
};

// the logits of cells idx[0..n) for the g heads q[] into ex (row stride att_block)
static void cell_logits(const ctx & C, const float * const * q, int st, int kvh, const int32_t * idx, int n, float * ex) {
    const sparq_args * a = C.a;
    const int g = C.L.group_size;
    const int B = C.L.att_block;
    if (a->K_type == SPARQ_F16) {
        C.isa->gather_dot_g_f16(q, g, C.K_row(st, kvh, 0), a->K_nb1, idx, n, a->d, ex, B);
    } else if (a->K_type == SPARQ_F32) {
        C.isa->gather_dot_g_f32(q, g, C.K_row(st, kvh, 0), a->K_nb1, idx, n, a->d, ex, B);
    } else {
        for (int t = 0; t < n; ++t) {
            dot_row_g(C.isa, a->K_type, q, g, C.K_row(st, kvh, idx[t]), a->d, ex + t, B);
        }
    }
}

// A selection's K and V rows are scattered: the logits are taken a few rows at a time while the
// K and V rows SPARQ_PF_AHEAD further are asked for, so the memory's latency overlaps the work
// (asking for a whole selection at once stalls once the core's outstanding misses are full).
constexpr int SPARQ_PF_STEP  = 8;
constexpr int SPARQ_PF_AHEAD = 24;

// cells idx[0..n) (n <= att_block) of (row R, KV head kvh) for the g heads q[]: their
// logits (ex), the running softmax of each head, their V rows added by their weights (p). The rows
// ahead are prefetched on the way: with n_ahead > 0 those of idx[n..n_ahead) (a selection's), with
// n_ahead < 0 those of the cells after each (every cell in order, up to cell -n_ahead: a KV head's
// rows in the cache are strided by the cell's row of every head, which the hardware prefetcher
// did not follow: without it this path was slower than upstream's attention on SmolLM2)
static void attend_cells(const ctx & C, const float * const * q, int R, int kvh, const float * m, const int32_t * idx,
                         int n, int n_ahead, float * ex, float * p, att_state & S) {
    const sparq_args * a = C.a;
    const int g = C.L.group_size, dv = a->dv, st = C.row_stream(R);
    const int B = C.L.att_block;
    constexpr int PA = SPARQ_PF_AHEAD, PS = SPARQ_PF_STEP;
    if (n_ahead > 0) {
        for (int t = 0; t < n; t += PS) {
            const int f0 = t + PA, f1 = std::min(n_ahead, f0 + PS);
            if (f0 < f1) {
                prefetch_rows(C, st, kvh, idx + f0, f1 - f0);
            }
            cell_logits(C, q, st, kvh, idx + t, std::min(PS, n - t), ex + t);
        }
    } else if (n_ahead < 0) {
        for (int t = 0; t < n; t += PS) {
            const int c0 = idx[t] + PA, c1 = std::min(-n_ahead, c0 + PS);
            for (int c = c0; c < c1; ++c) {
                prefetch_rows(C, st, kvh, &c, 1);
            }
            cell_logits(C, q, st, kvh, idx + t, std::min(PS, n - t), ex + t);
        }
    } else {
        cell_logits(C, q, st, kvh, idx, n, ex);
    }
    for (int hh = 0; hh < g; ++hh) {
        float * eh = ex + hh * B;
        float * ph = p + hh * B;
        const head_terms ht = head_terms_of(C, R, kvh * g + hh);
        for (int t = 0; t < n; ++t) {
            eh[t] = variant_logit(a, eh[t] * a->scale, ht, m, idx[t]);
            ph[t] = 0.0f;
        }
        const float bm = C.isa->max(eh, n);
        if (bm == -INFINITY) {
            continue;
        }
        if (bm > S.M[hh]) {
            // a larger maximum: what the head has so far, rescaled to it
            const float f = S.M[hh] == -INFINITY ? 0.0f : expf(S.M[hh] - bm);
            float * yh = S.y + (size_t) hh * dv;
            for (int j = 0; j < dv; ++j) {
                yh[j] *= f;
            }
            S.P[hh] *= f;
            S.M[hh] = bm;
        }
        C.isa->exp_acc(eh, n, S.M[hh], 1.0f, ph);
        float P = 0.0f;
        for (int t = 0; t < n; ++t) {
            P += ph[t];
        }
        S.P[hh] += P;
    }
    if (a->V_type == SPARQ_F16) {
        C.isa->gather_axpy_g_f16(S.y, dv, g, C.V_row(st, kvh, 0), a->V_nb1, idx, p, B, n, dv);
    } else if (a->V_type == SPARQ_F32) {
        C.isa->gather_axpy_g_f32(S.y, dv, g, C.V_row(st, kvh, 0), a->V_nb1, idx, p, B, n, dv);
    } else {
        for (int t = 0; t < n; ++t) {
            axpy_row_g(C.isa, a->V_type, S.y, dv, g, C.V_row(st, kvh, idx[t]), p + t, B, dv);
        }
    }
}

// the unit's output from its n_parts states (in their order, whichever thread combines them):
// the parts' sums rescaled to the heads' largest logits, normalised, and mixed with the mean of V
static void finish_unit(const ctx & C, int u, int w, int n_parts, float * own) {
    const sparq_args * a = C.a;
    const int g = C.L.group_size, dv = a->dv;
    const unit_plan * up = C.uplan(w);
    const int R = C.unit_row(u), kvh = C.unit_kvh(u);
    const float * vbar = C.uvbar(w);
    for (int hh = 0; hh < g; ++hh) {
        float M = -INFINITY;
        for (int pt = 0; pt < n_parts; ++pt) {
            const att_state S(n_parts == 1 ? own : C.part_state(w, pt), g);
            M = std::max(M, S.M[hh]);
        }
        float * o = C.out_row(R, kvh * g + hh);
        for (int j = 0; j < dv; ++j) {
            o[j] = 0.0f;
        }
        double P_sink = 0.0;
        sink_fold(a, kvh * g + hh, &M, &P_sink); // the parts are rescaled to M, which includes the sink
        float P = (float) P_sink;
        if (M != -INFINITY) {
            for (int pt = 0; pt < n_parts; ++pt) {
                const att_state S(n_parts == 1 ? own : C.part_state(w, pt), g);
                if (S.M[hh] == -INFINITY) {
                    continue;
                }
                const float f = expf(S.M[hh] - M);
                const float * yh = S.y + (size_t) hh * dv;
                for (int j = 0; j < dv; ++j) {
                    o[j] += f * yh[j];
                }
                P += f * S.P[hh];
            }
        }
        const float iP = P > 0.0f ? 1.0f / P : 0.0f;
        if (!up->all_cells && up->mean_v) {
            const float alpha = C.ualpha(w)[hh];
            const float ay = alpha * iP, av = 1.0f - alpha;
            for (int j = 0; j < dv; ++j) {
                o[j] = ay * o[j] + av * vbar[j];
            }
        } else {
            // (vbar is not computed for a unit without the mix: never read it, not even times 0)
            for (int j = 0; j < dv; ++j) {
                o[j] *= iP;
            }
        }
    }
}

// part pt of unit u (wave slot w): its cells' exact attention for the g heads into its state; the
// last part done combines them
static void attend_part(const ctx & C, int u, int w, int pt, int ith) {
    const sparq_args * a = C.a;
    const int g = C.L.group_size;
    const int B = C.L.att_block;
    const unit_plan * up = C.uplan(w);
    const int R = C.unit_row(u), kvh = C.unit_kvh(u), st = C.row_stream(R);
    const float * m = C.mask_row(R);
    float * ex = (float *) C.tbuf(ith, C.L.t_aex);
    float * p = (float *) C.tbuf(ith, C.L.t_ap);
    const float ** q = (const float **) C.tbuf(ith, C.L.t_aq);
    for (int hh = 0; hh < g; ++hh) {
        q[hh] = C.q_row(R, kvh * g + hh);
    }
    const int n_parts = up->n_parts;
    float * own = (float *) C.tbuf(ith, C.L.t_ast);
    att_state S(n_parts == 1 ? own : C.part_state(w, pt), g);
    for (int hh = 0; hh < g; ++hh) {
        S.M[hh] = -INFINITY;
        S.P[hh] = 0.0f;
    }
    for (size_t j = 0; j < (size_t) g * a->dv; ++j) {
        S.y[j] = 0.0f;
    }
    if (up->all_cells) {
        int32_t * idx = (int32_t *) C.tbuf(ith, C.L.t_aidx);
        int c0, c1;
        chunk_range(a->n_kv, pt, n_parts, &c0, &c1);
        for (int c = c0; c < std::min(c1, c0 + SPARQ_PF_AHEAD); ++c) {
            prefetch_rows(C, st, kvh, &c, 1);
        }
        for (int c = c0; c < c1; c += B) {
            const int ce = std::min(c1, c + B);
            int n = 0;
            for (int s = c; s < ce; ++s) {
                idx[n] = s;
                n += !m || is_valid(m[s]);
            }
            if (n > 0) {
                attend_cells(C, q, R, kvh, m, idx, n, -c1, ex, p, S);
            }
        }
    } else {
        const int32_t * sel = C.usel(w);
        int t0, t1;
        chunk_range(up->n_sel, pt, n_parts, &t0, &t1);
        prefetch_rows(C, st, kvh, sel + t0, std::min(SPARQ_PF_AHEAD, t1 - t0));
        // blocks of equal size (no short last one)
        const int nb = (t1 - t0 + B - 1) / B;
        for (int b = 0; b < nb; ++b) {
            int b0, b1;
            chunk_range(t1 - t0, b, nb, &b0, &b1);
            attend_cells(C, q, R, kvh, m, sel + t0 + b0, b1 - b0, t1 - t0 - b0, ex, p, S);
        }
    }
    if (n_parts == 1) {
        finish_unit(C, u, w, 1, own);
    } else if (C.parts_done(u)->fetch_add(1, std::memory_order_acq_rel) + 1 == n_parts) {
        finish_unit(C, u, w, n_parts, nullptr);
    }
}

// ----- phase_attend. The threads take the items in order from a shared counter as they finish
// phase_select, each waiting only for its unit's plan: SmolLM2's 3 units on 2 threads leave no
// thread idle while another selects its second unit. An item is a part of a unit (attend_part), or
// with even_attend a (unit, query head) in an equal fixed share per thread: its weights are summed per
// thread, and a fixed split keeps their sums (and so its later choices) the same from run to run. -----
void phase_attend(const ctx & C, int wb, int we, int ith, int nth) {
    const int g = C.L.group_size;
    float * ex = (float *) C.tbuf(ith, C.L.t_ex);
    float * p = (float *) C.tbuf(ith, C.L.t_p);
    float * y = (float *) C.tbuf(ith, C.L.t_vec);
    const int n_items = (we - wb) * g;
    const bool fixed = C.sel->even_attend;
    std::atomic<int32_t> * next = C.next_item(wb / C.L.wave_units);
    int i0 = 0, i1 = n_items;
    if (fixed) {
        chunk_range(n_items, ith, nth, &i0, &i1);
    }
    if (!fixed) {
        // per (unit, part), in the same way
        const int pm = C.L.parts_max;
        for (;;) {
            const int i = next->fetch_add(1, std::memory_order_relaxed);
            if (i >= (we - wb) * pm) {
                break;
            }
            const int w = i / pm, pt = i % pm, u = wb + w;
            while (!C.unit_ready(u)->load(std::memory_order_acquire)) {
                sparq_pause();
            }
            if (pt < C.uplan(w)->n_parts) {
                attend_part(C, u, w, pt, ith);
            }
        }
        return;
    }
    int prefetched = -1;
    for (int k = i0;; ++k) {
        const int i = fixed ? k : next->fetch_add(1, std::memory_order_relaxed);
        if (i >= i1) {
            break;
        }
        const int w = i / g, hh = i % g, u = wb + w;
        while (!C.unit_ready(u)->load(std::memory_order_acquire)) {
            sparq_pause();
        }
        const unit_plan * up = C.uplan(w);
        if (up->all_cells) {
            dense_head(C, u, hh, ith);
            continue;
        }
        if (prefetched != w) {
            const int R = C.unit_row(u);
            prefetch_rows(C, C.row_stream(R), C.unit_kvh(u), C.usel(w), up->n_sel);
            prefetched = w;
        }
        attend_head(C, u, w, hh, ex, p, y, ith);
    }
}

} // namespace sparq_cpu
