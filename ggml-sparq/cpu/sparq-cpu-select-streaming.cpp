// llama-sparq: the streaming selector's CPU part (LM-Infinite): its choice is the window list
// itself, the l most recent cells and the k - l earliest ones (the sinks), made in phase_windows;
// phase_scores skips its rows (no scores).

#include "sparq-cpu-phases.h"

namespace sparq_cpu {

int streaming_sinks(const float * m, int S, int n_sink_max, int32_t * wl, int n_win) {
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

} // namespace sparq_cpu
