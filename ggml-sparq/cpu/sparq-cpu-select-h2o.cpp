// llama-sparq: the H2O selector's CPU part: its candidates are the cells of largest accumulated
// attention (phase_scores); each thread sums its rows' attention weights (phase_attend) into its
// share, added to the scores once every row of the call has chosen (h2o_fold).

#include "sparq-cpu-phases.h"

namespace sparq_cpu {

// its input: the scores, sel_in[0] [n_kv, n_head_kv, n_stream], which it reads and writes
static float * h2o_row(const ctx & C, int st, int kvh) {
    const sparq_sel_input & in = C.a->sel_in[0];
    return (float *) ((char *) in.data + (size_t) kvh * in.nb1 + (size_t) st * in.nb2);
}

// thread ith's share of the attention weights of (stream, KV head) (its scratch, off_own[0])
static float * h2o_part(const ctx & C, int ith, int st, int kvh) {
    const sparq_args * a = C.a;
    return (float *) (C.base + C.L.off_own[0]) + (((size_t) ith * a->n_stream + st) * a->n_head_kv + kvh) * a->n_kv;
}

// its scratch: per thread, the attention weights of its rows per (stream, KV head, cell)
static void h2o_scratch(const sparq_args * a, layout & L, int nth, size_t * o, size_t *) {
    L.off_own[0] = *o;
    *o += align_up((size_t) nth * a->n_stream * a->n_head_kv * a->n_kv * sizeof(float));
}

static void h2o_clear(const ctx & C, int ith, int) {
    const sparq_args * a = C.a;
    memset(h2o_part(C, ith, 0, 0), 0, (size_t) a->n_stream * a->n_head_kv * a->n_kv * sizeof(float));
}

static void h2o_candidates(const ctx & C, int u, int w, int s0, int s1, int ith) {
    const sparq_args * a = C.a;
    const int R = C.unit_row(u), kvh = C.unit_kvh(u), st = C.row_stream(R);
    const row_info * ri = C.rinfo(R);
    float * ck = (float *) C.tbuf(ith, C.L.t_ck);
    // candidates by accumulated attention (invalid cells never), cells before the window
    const float * hs = h2o_row(C, st, kvh);
    const float * m = C.mask_row(R);
    const int n = std::min(s1, (int) ri->w0) - s0;
    for (int s = 0; s < n; ++s) {
        ck[s] = m && !is_valid(m[s0 + s]) ? -INFINITY : hs[s0 + s];
    }
    *C.ccount(w, ith) = select_chunk(C, ith, ck, n, s0, row_kk_scan(a, ri), C.cands(w, ith));
}

static void h2o_add_weights(const ctx & C, int ith, int st, int kvh, const int32_t * sel, const float * ex, int n_sel,
                     float M, float iP) {
    // the row's attention weights, added to the scores once every row has chosen
    float * part = h2o_part(C, ith, st, kvh);
    for (int t = 0; t < n_sel; ++t) {
        part[sel[t]] += expf(ex[t] - M) * iP;
    }
}

static void h2o_add_dense_weights(const ctx & C, int ith, int st, int kvh, const float * q, const float * m,
                                  const head_terms & t, float M, float iP) {
    // the weights need the final maximum and sum: a second pass over the logits
    const int S = C.a->n_kv;
    float * part = h2o_part(C, ith, st, kvh);
    for (int s = 0; s < S; ++s) {
        if (m && !is_valid(m[s])) {
            continue;
        }
        part[s] += expf(exact_logit(C, q, st, kvh, s, m, t) - M) * iP;
    }
}

// after every row has chosen: the threads' weights added to the scores, a share of the cells each
static void h2o_fold(const ctx & C, int ith, int nth) {
    const sparq_args * a = C.a;
    const int S = a->n_kv;
    for (int st = 0; st < a->n_stream; ++st) {
        for (int kvh = 0; kvh < a->n_head_kv; ++kvh) {
            int s0, s1;
            chunk_range(S, ith, nth, &s0, &s1);
            float * hs = h2o_row(C, st, kvh);
            for (int t = 0; t < nth; ++t) {
                const float * part = h2o_part(C, t, st, kvh);
                for (int s = s0; s < s1; ++s) {
                    hs[s] += part[s];
                }
            }
        }
    }
}

// the l most recent cells and the k - l of largest accumulated attention; no approximate scores
extern const selector select_h2o = {
    /* name           */ "h2o",
    /* ranks_scores   */ false,
    /* window_choice  */ false,
    /* even_attend    */ true,
    /* args           */ baseline_args,
    /* scratch        */ h2o_scratch,
    /* window_more    */ nullptr,
    /* prepare        */ h2o_clear,
    /* chunk          */ h2o_candidates,
    /* selected       */ nullptr,
    /* attended       */ h2o_add_weights,
    /* attended_dense */ h2o_add_dense_weights,
    /* finish         */ h2o_fold,
};

} // namespace sparq_cpu
