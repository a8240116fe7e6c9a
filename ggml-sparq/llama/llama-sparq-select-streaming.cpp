// llama-sparq: selector streaming (LM-Infinite / StreamingLLM) on the llama side: its window list
// is the whole choice, the first positions (the attention sinks) and the most recent ones.

#include "llama-sparq-cost.h"
#include "llama-sparq-graph-build.h"
#include "llama-sparq-selector.h"

#include <algorithm>

// the k - min(16, k / 2) most recent positions; the rest of k are the sinks
static int streaming_window(int kk) {
    return kk - std::min(16, kk / 2);
}

// the paper's Appendix G: 2 k d + 2 d, no mean of V read or written
static void streaming_decide(sparq_attn_build & b, sparq_cost & c) {
    c.extra = -2.0 * b.d;
    sparq_decide(b.inp, b.il, -1, b.kk, b.kk, c);
}

extern const sparq_selector sparq_sel_streaming = {
    /* ranks_scores  */ false,
    /* per_head      */ false,
    /* window_choice */ true,
    /* every_step    */ false,
    /* check         */ nullptr,
    /* apply         */ nullptr,
    /* before_step   */ nullptr,
    /* window        */ streaming_window,
    /* rebuild       */ nullptr,
    /* appends       */ nullptr,
    /* prompt        */ nullptr,
    /* op_params     */ nullptr,
    /* op_srcs       */ nullptr,
    /* probe_srcs    */ nullptr,
    /* decide        */ streaming_decide,
    /* rows_read     */ nullptr,
    /* log_stats     */ nullptr,
};
