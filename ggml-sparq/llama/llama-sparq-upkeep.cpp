// llama-sparq: the upkeep of the SparQ data between graphs: whether a stream's data is current, the
// rebuild counter, and llama_sparq_sync (everything brought up to date before a timed step).
#include "llama-sparq-upkeep.h"

#include "llama-sparq-rebuild.h"
#include "llama-sparq-selector.h"
#include "llama-sparq-state.h"
#include "llama-sparq-transfers.h"
#include "llama-sparq-upstream.h"

#include "llama-context.h"

#include <cstdint>
#include <mutex>
#include <vector>

// whether the stream's data is current for its cells as they are now
bool sparq_stream_current(const llama_sparq_ctx & S, uint32_t strm) {
    const sparq_stream_state & st = S.streams[strm];
    return st.valid && st.hash == upstream::cells_hash(upstream::cells(S.kv, strm));
}

void sparq_count_rebuild(llama_sparq_ctx & S) {
    std::lock_guard<std::mutex> lock(S.stats.mtx);
    S.stats.counters.n_rebuilds++;
}

// Waits until the writes queued to t are processed where t lives. A write to an RPC host is queued
// and sent in the background, and the RPC backend's synchronize only waits until it is sent, not
// processed: a read has to come back, and the host answers it after the writes before it. So one
// byte is read (nothing in host memory; a 1-byte copy from a GPU).
void sparq_wait_written(const ggml_tensor * t) {
    if (t && t->buffer && !ggml_backend_buffer_is_host(t->buffer)) {
        uint8_t probe;
        sparq_tensor_get(t, &probe, 0, 1);
    }
}

void llama_sparq_sync(struct llama_context * ctx) {
    auto & cp = upstream::cparams(ctx);
    if (!cp.sparq || cp.sparq->n_layers == 0 || !cp.sparq->params.enabled) {
        return;
    }
    // pending cache updates first (the deferred K-shift after seq_add / seq_div, stream copies):
    // the data must be rebuilt from K as the next decode step will see it
    ctx->memory_update(false);
    sparq_llama_sync(ctx);
    llama_sparq_ctx & S = *cp.sparq;
    bool rebuilt = false;
    for (uint32_t strm = 0; strm < upstream::n_stream(S.kv); ++strm) {
        if (sparq_stream_current(S, strm)) {
            continue;
        }
        sparq_rebuild_stream(S, strm, {});
        sparq_count_rebuild(S);
        S.streams[strm].hash = upstream::cells_hash(upstream::cells(S.kv, strm));
        S.streams[strm].valid = true;
        rebuilt = true;
    }
    // the rebuilt data written before the timed step that follows (without this, a benchmark's first
    // step over RPC waited for the rebuild: seconds at 16K cells on loopback)
    for (size_t ikv = 0; rebuilt && ikv < S.layers.size(); ++ikv) {
        sparq_wait_written(S.layers[ikv].data.kt);
    }
    // the selector's state brought up to date for every used cell now, not in the next step
    if (const auto before_step = sparq_selector_of(S.params.selector).before_step) {
        for (uint32_t strm = 0; strm < upstream::n_stream(S.kv); ++strm) {
            before_step(S, strm, {}, upstream::cells(S.kv, strm).get_used(), true);
        }
    }
}
