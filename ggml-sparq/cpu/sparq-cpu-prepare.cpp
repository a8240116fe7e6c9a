// llama-sparq: phase_components and phase_windows of the CPU driver, the per-row work before any
// score: the mask rows to f32 and their valid cells counted, each unit's components (and the
// selectors' own setup), then per row the number of valid cells and the local window's cells.

#include "sparq-cpu-phases.h"

#include "ggml-sparq-e5m2.h"

#include <new>

namespace sparq_cpu {

// ----- phase_components: mask rows to f32 + valid counts; component selection -----

// every row's cells of this thread's chunk: an f16 mask converted to f32, the valid ones counted
static void mask_counts(const ctx & C, int ith, int nth) {
    const sparq_args * a = C.a;
    const int S = a->n_kv;
    for (int R = 0; R < C.L.n_rows_all; ++R) {
        int s0, s1;
        chunk_range(S, ith, nth, &s0, &s1);
        int32_t n = 0;
        if (!a->mask) {
            n = s1 - s0;
        } else {
            const float * m;
            if (a->mask_type == SPARQ_F16) {
                const uint16_t * src = (const uint16_t *) C.mask_row_raw(R);
                float * dst = C.maskf(R);
                if (s1 > s0) {
                    C.isa->f16_to_f32(src + s0, dst + s0, s1 - s0);
                }
                m = dst;
            } else {
                m = (const float *) C.mask_row_raw(R);
            }
            for (int s = s0; s < s1; ++s) {
                n += is_valid(m[s]);
            }
        }
        C.cnt(R)[ith] = n;
    }
}

// n <= 256 values x into cell c of n K^T rows from `rows` (stride bytes apart), encoded as the cell
// scatter encodes them (e5m2 and 4-bit blocks through f16; a 4-bit block's one writer is this unit)
static void kt_column_put(enum sparq_type t, char * rows, size_t stride, int64_t c, const float * x, int n) {
    const size_t off = sparq_cell_offset(t, c); // (a 4-bit block: ggml_sparq_kt4_put finds it)
    for (int j = 0; j < n; ++j) {
        char * row = rows + (size_t) j * stride;
        if (t == SPARQ_KT4) {
            ggml_sparq_kt4_put((uint8_t *) row, c, sparq_fp32_to_fp16(x[j]));
            continue;
        }
        char * e = row + off;
        if (t == SPARQ_E5M2) {
            *(uint8_t *) e = ggml_sparq_f16_to_e5m2(sparq_fp32_to_fp16(x[j]));
        } else if (t == SPARQ_F16) {
            *(uint16_t *) e = sparq_fp32_to_fp16(x[j]);
        } else {
            *(float *) e = x[j];
        }
    }
}

// where unit u's share of the step's append (sparq_args::cells) reads and writes: its stream s's
// new cell c, its KV head h, the K and V rows of the cell, the head's K^T rows
struct append_site {
    int s, h;
    int64_t c;
    const char * krow, * vrow;
    char * kt;
};

static append_site append_site_of(const ctx & C, int u) {
    const sparq_args * a = C.a;
    append_site p;
    p.s = C.row_stream(C.unit_row(u));
    p.h = C.unit_kvh(u);
    p.c = a->cells[p.s] % a->kv_size;
    p.krow = (const char *) a->K + (size_t) p.c * a->K_nb1 + (size_t) p.h * a->K_nb2 + (size_t) p.s * a->K_nb3;
    p.vrow = (const char *) a->V + (size_t) p.c * a->V_nb1 + (size_t) p.h * a->V_nb2 + (size_t) p.s * a->V_nb3;
    p.kt = (char *) a->KT + (size_t) p.h * a->KT_nb2 + (size_t) p.s * a->KT_nb3;
    return p;
}

// unit u's share of the step's append: the K and V rows as the cache holds them, with the
// sum-append mode's arithmetic (so that the sums equal a recomputation alike)
static void append_unit(const ctx & C, int u) {
    const sparq_args * a = C.a;
    const append_site p = append_site_of(C, u);
    const int s = p.s, h = p.h;
    float buf[256];
    float * ksq = (float *) ((char *) a->k_sq + (size_t) h * a->k_sq_nb1 + (size_t) s * a->k_sq_nb2);
    for (int j0 = 0; j0 < a->d; j0 += 256) {
        const int m = std::min(256, a->d - j0);
        sparq_row_to_f32(C.isa, a->K_type, p.krow + sparq_row_bytes(a->K_type, j0), buf, m);
        kt_column_put(a->KT_type, p.kt + (size_t) j0 * a->KT_nb1, a->KT_nb1, p.c, buf, m);
        for (int j = 0; j < m; ++j) {
            volatile float x = buf[j]; // each product and sum rounded on its own
            x = x * x;
            ksq[j0 + j] += x;
        }
    }
    float * sp = (float *) ((char *) a->v_sum + (size_t) h * a->v_sum_nb1 + (size_t) s * a->v_sum_nb2);
    float * cp = (float *) ((char *) a->v_comp + (size_t) h * a->v_comp_nb1 + (size_t) s * a->v_comp_nb2);
    for (int j0 = 0; j0 < a->dv; j0 += 256) {
        const int m = std::min(256, a->dv - j0);
        sparq_row_to_f32(C.isa, a->V_type, p.vrow + sparq_row_bytes(a->V_type, j0), buf, m);
        for (int j = j0; j < j0 + m; ++j) {
            const volatile float x = buf[j - j0];
            const float y = x - cp[j];
            const float t = sp[j] + y;
            cp[j] = (t - sp[j]) - y;
            sp[j] = t;
        }
    }
    if (h == 0) {
        const_cast<float *>(a->v_count)[s] += 1.0f;
        if (a->win) {
            int32_t * row = (int32_t *) ((char *) a->win + (size_t) s * a->win_nb2);
            memmove(row + 1, row, (size_t) (a->win_n - 1) * sizeof(int32_t));
            row[0] = (int32_t) p.c;
        }
    }
}

// the lines append_unit writes, asked for before the mask's work: each K^T row's cell is on a
// line (and page) of its own, and they have left the caches since the last step (always_inline:
// GCC drops a call to a function of prefetches only, as having no effect)
static inline __attribute__((always_inline)) void prefetch_append(const ctx & C, int u) {
    const sparq_args * a = C.a;
    const append_site p = append_site_of(C, u);
    const char * kt = p.kt + sparq_cell_offset(a->KT_type, p.c);
    for (int j = 0; j < a->d; ++j) {
        __builtin_prefetch(kt + (size_t) j * a->KT_nb1, 1);
    }
    __builtin_prefetch(p.krow);
    __builtin_prefetch(p.vrow);
}

void phase_components(const ctx & C, int ith, int nth) {
    const sparq_args * a = C.a;
    if (ith == 0) {
        // the hand-off from phase_select to phase_attend: no unit ready, no item taken, no part done
        for (int i = 0; i < 2 * C.L.n_units + C.L.n_waves; ++i) {
            new (C.unit_ready(0) + i) std::atomic<int32_t>(0);
        }
    }
    if (a->cells) {
        for (int u = ith; u < C.L.n_units; u += nth) {
            prefetch_append(C, u);
        }
    }
    mask_counts(C, ith, nth);

    // component selection, per unit
    float * absq = (float *) C.tbuf(ith, C.L.t_vec);
    int32_t * order = (int32_t *) (absq + a->d);
    for (int u = ith; u < C.L.n_units; u += nth) {
        if (a->cells) {
            append_unit(C, u);
        }
        sparq_components(C, u, absq, order, (float *) (order + a->d));
    }

    if (C.sel->prepare) {
        C.sel->prepare(C, ith, nth);
    }
}

// ----- phase_windows: valid cells and window start per row -----

// row R's window list wl (ascending): the given window cells that are valid, or the l most recent
// valid cells (then *w0 is the first of them), and the selector's more (its window_more hook).
// Returns its length.
static int32_t row_window(const ctx & C, int R, const float * m, int32_t * wl, int32_t * w0) {
    const sparq_args * a = C.a;
    const int S = a->n_kv;
    const bool whole = C.sel->window_choice; // the list is the whole choice: k entries
    int32_t n_win = 0;
    if (a->win) {
        // the window cells are given (the l most recent positions): keep the valid ones
        const int32_t * src = (const int32_t *) ((const char *) a->win + (size_t) C.row_in_stream(R) * a->win_nb1 +
                                                 (size_t) C.row_stream(R) * a->win_nb2);
        // a whole choice (window_choice): entries l..k-1 name the earliest positions' cells (the sinks)
        for (int i = 0; i < std::min(whole ? a->k : a->l, a->win_n); ++i) {
            const int32_t c = src[i];
            if (c >= 0 && c < S && (!m || is_valid(m[c]))) {
                wl[n_win++] = c;
            }
        }
        std::sort(wl, wl + n_win);
        n_win = (int32_t) (std::unique(wl, wl + n_win) - wl);
    } else {
        // the most recent cells are the last valid ones
        for (int s = S - 1; s >= 0 && n_win < a->l; --s) {
            if (!m || is_valid(m[s])) {
                wl[n_win++] = s;
                *w0 = s;
            }
        }
        std::reverse(wl, wl + n_win);
        if (C.sel->window_more) {
            n_win = C.sel->window_more(a, m, S, wl, n_win);
        }
    }
    return n_win;
}

void phase_windows(const ctx & C, int ith, int nth) {
    const sparq_args * a = C.a;
    const int S = a->n_kv;
    for (int R = ith; R < C.L.n_rows_all; R += nth) {
        int32_t n_valid = 0;
        for (int c = 0; c < C.L.n_chunks; ++c) {
            n_valid += C.cnt(R)[c];
        }
        const float * m = C.mask_row(R);
        int32_t w0 = S, n_win = 0;
        // a negative count marks a stream whose rows run exact dense attention (see sparq_args)
        const int32_t dense_all = a->all_dense || a->v_count[C.row_stream(R)] < 0.0f;
        if (n_valid > row_k(a, n_valid) && (a->l > 0 || C.sel->window_choice) && !dense_all) {
            n_win = row_window(C, R, m, C.win(R), &w0);
        }
        C.rinfo(R)->n_valid = n_valid;
        C.rinfo(R)->w0 = w0;
        C.rinfo(R)->n_win = n_win;
        C.rinfo(R)->dense_all = dense_all;
    }
}

} // namespace sparq_cpu
