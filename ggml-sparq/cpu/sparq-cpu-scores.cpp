// llama-sparq: phase_scores and phase_gqa_candidates of the CPU driver, the scores and candidates
// per (unit, cell chunk): each unit's chunk goes to its selector's scoring (its chunk hook; a
// selector whose window list is its choice has none), then, with GQA, the group's candidates from
// the kept logits.

#include "sparq-cpu-phases.h"

namespace sparq_cpu {

// ----- phase_scores: approximate logits, softmax statistics, candidates (g == 1) -----
void phase_scores(const ctx & C, int wb, int we, int ith) {
    const sparq_args * a = C.a;
    const int S = a->n_kv, g = C.L.group_size;
    for (int u = wb; u < we; ++u) {
        const int w = u - wb;
        const row_info * ri = C.rinfo(C.unit_row(u));
        float * stat = C.stat(w, ith);
        for (int h = 0; h < C.L.ph; ++h) {
            *C.ccount(w, ith, h) = 0;
        }
        for (int h = 0; h < g; ++h) {
            stat[2 * h] = -INFINITY;
            stat[2 * h + 1] = 0.0f;
        }
        if (ri->n_valid <= row_k(a, ri->n_valid) || ri->dense_all || !C.sel->chunk) {
            continue; // exact dense row, or the window list is the whole choice: no scores needed
        }
        int s0, s1;
        chunk_range(S, ith, C.L.n_chunks, &s0, &s1);
        C.sel->chunk(C, u, w, s0, s1, ith);
    }
}

// ----- phase_gqa_candidates (GQA): group-summed normalised scores, candidates -----
void phase_gqa_candidates(const ctx & C, int wb, int we, int ith) {
    const sparq_args * a = C.a;
    const int S = a->n_kv;
    for (int u = wb; u < we; ++u) {
        const int w = u - wb;
        const row_info * ri = C.rinfo(C.unit_row(u));
        for (int h = 0; h < C.L.ph; ++h) {
            *C.ccount(w, ith, h) = 0;
            *C.cbound(w, ith, h) = -INFINITY;
        }
        const int kk = staged_selection(a, C.L.group_size) ? row_kk_first(a, ri) : row_kk_scan(a, ri);
        if (ri->n_valid <= row_k(a, ri->n_valid) || ri->dense_all) {
            continue;
        }
        int s0, s1;
        chunk_range(S, ith, C.L.n_chunks, &s0, &s1);
        if (C.L.keep_exps) {
            sparq_rescale_exps(C, u, w, s0, s1, ith);
        }
        s1 = std::min(s1, (int) ri->w0); // candidates: cells before the local window
        if (kk <= 0) {
            continue;
        }
        if (s1 <= s0) {
            continue;
        }
        sparq_group_candidates(C, u, w, s0, s1, kk, ith, ith);
    }
}

} // namespace sparq_cpu
