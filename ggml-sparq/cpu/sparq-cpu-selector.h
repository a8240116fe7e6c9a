// llama-sparq: the CPU driver's selector interface. A selector chooses the cells each row attends
// over (steps 1-3 of docs/algorithm.md); the exact attention over them is shared. The phases call
// a selector only through these hooks and traits, never by its name, so a selector is one file
// (sparq-cpu-select-<name>.cpp) that defines its `select_<name>` and one row of selector_of()
// (sparq-cpu-selectors.cpp). Each owns its scratch (the layout asks it) and its state.
#pragma once

#include "sparq-cpu.h"

#include <cstddef>
#include <cstdint>

namespace sparq_cpu {

struct ctx;
struct layout;
struct head_terms;

struct selector {
    const char * name;

    // traits
    bool ranks_scores;  // ranks step 2's approximate scores (K^T, the components, the mean of V)
    bool window_choice; // the window list is its whole choice: no scores, nothing to rank
    bool even_attend;   // phase_attend takes (unit, head) items in an equal fixed share per thread and
                        // never splits a unit (the selector sums weights per thread: the same sums
                        // from run to run)

    // The hooks; any may be null.
    // The arguments it runs with (every component for exact scores; no approximate scores for the baselines).
    void (*args)(sparq_args & b);
    // Its scratch: shared bytes from *o on, per-thread bytes from *t on (the layout's offsets of its own).
    void (*scratch)(const sparq_args * a, layout & L, int nth, size_t * o, size_t * t);
    // The window list's cells beyond the l most recent (attention sinks, say) into wl after its
    // n_win; returns the new length. m: the row's f32 mask or NULL, S cells.
    int (*window_more)(const sparq_args * a, const float * m, int S, int32_t * wl, int n_win);
    // phase_components, after the components: its own setup for the call.
    void (*prepare)(const ctx & C, int ith, int nth);
    // phase_scores, per unit u (wave slot w) and chunk [s0, s1) of a row that chooses: the chunk's
    // scores and candidates.
    void (*chunk)(const ctx & C, int u, int w, int s0, int s1, int ith);
    // phase_select, per unit, before its plan: dense says whether the row attends over every cell.
    void (*selected)(const ctx & C, int u, int w, bool dense);
    // phase_attend, per query head: its attention weights over the selection (ex: its logits, M their
    // maximum, iP 1 / the sum of exp) or, with dense, over every valid cell (q its query, m the mask).
    void (*attended)(const ctx & C, int ith, int st, int kvh, const int32_t * sel, const float * ex, int n_sel,
                     float M, float iP);
    void (*attended_dense)(const ctx & C, int ith, int st, int kvh, const float * q, const float * m,
                           const head_terms & t, float M, float iP);
    // After every row of the call has chosen and attended (a barrier before it).
    void (*finish)(const ctx & C, int ith, int nth);
};

// The selector of a sparq_args::selector value (the op's enum ggml_sparq_selector); aborts on a value
// with no row.
const selector & selector_of(int id);

} // namespace sparq_cpu
