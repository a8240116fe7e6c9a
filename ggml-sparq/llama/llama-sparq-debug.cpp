// llama-sparq: the debugging entry points of the C API: an eval callback on the context's graphs,
// and the check of the kept K^T and sums against a recomputation.
#include "llama-sparq-impl.h"

#include <algorithm>

void llama_sparq_debug_set_eval_callback(struct llama_context * ctx, ggml_backend_sched_eval_callback cb,
                                         void * user_data) {
    llama_cparams & cp = upstream::cparams(ctx);
    cp.cb_eval = cb;
    cp.cb_eval_user_data = user_data;
    // upstream hands cparams' callback to the scheduler only when it builds a graph: a step that
    // reuses the previous graph would run with the callback set before (possibly freed by now)
    ggml_backend_sched_set_eval_callback(ctx->get_sched(), cb, user_data);
}

double llama_sparq_debug_check(struct llama_context * ctx) {
    auto & cp = upstream::cparams(ctx);
    if (!cp.sparq || cp.sparq->n_layers == 0) {
        return -1.0;
    }
    llama_synchronize(ctx);
    llama_sparq_ctx & S = *cp.sparq;
    double d = 0.0;
    for (uint32_t strm = 0; strm < upstream::n_stream(S.kv); ++strm) {
        // a stream that is not current is rebuilt before its next use: nothing to compare
        if (sparq_stream_current(S, strm)) {
            d = std::max(d, sparq_rebuild_stream(S, strm, {}, true));
        }
    }
    return d;
}
