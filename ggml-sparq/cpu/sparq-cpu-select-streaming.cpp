// llama-sparq: the streaming selector's CPU part (LM-Infinite): its choice is the window list
// itself, the l most recent cells and the k - l earliest ones (the sinks), made in phase_windows;
// phase_scores skips its rows (no scores).

#include "sparq-cpu-phases.h"

namespace sparq_cpu {

// the sinks, the first k - l valid cells, after the window's n_win in wl
static int streaming_sinks(const sparq_args * a, const float * m, int S, int32_t * wl, int n_win) {
    const int n_sink_max = a->k - a->l;
    // the sinks: the first k - l valid cells (disjoint from the window: n_valid > k)
    int n_sink = 0;
    for (int s = 0; s < S && n_sink < n_sink_max; ++s) {
        if (!m || is_valid(m[s])) {
            wl[n_win++] = s;
            n_sink++;
        }
    }
    std::sort(wl, wl + n_win);
    return n_win;
}

// LM-Infinite: the window list (k entries: the l most recent and the k - l earliest) is the choice
extern const selector select_streaming = {
    /* name           */ "streaming",
    /* ranks_scores   */ false,
    /* window_choice  */ true,
    /* even_attend    */ false,
    /* args           */ baseline_args,
    /* scratch        */ nullptr,
    /* window_more    */ streaming_sinks,
    /* prepare        */ nullptr,
    /* chunk          */ nullptr,
    /* selected       */ nullptr,
    /* attended       */ nullptr,
    /* attended_dense */ nullptr,
    /* finish         */ nullptr,
};

} // namespace sparq_cpu
