// llama-sparq: libllama's selectors by their LLAMA_SPARQ_SELECTOR_* value (llama-sparq-selector.h).

#include "llama-sparq-selector.h"

bool sparq_cache_on_host(const llama_sparq_ctx & S, const char * selector, char * err, size_t err_size) {
    for (const sparq_layer & L : S.layers) {
        // K^T lives in the buffer type of the layer's K, and so do the selectors' per-cell tensors
        if (L.data.kt && !ggml_backend_buffer_is_host(L.data.kt->buffer)) {
            sparq_err(err, err_size, "SparQ: selector %s runs on the CPU and needs the KV cache in host memory "
                      "(here on %s): use --no-kv-offload / offload_kqv = false", selector,
                      ggml_backend_buffer_name(L.data.kt->buffer));
            return false;
        }
    }
    return true;
}

bool sparq_selector_ranks_scores(int32_t selector) {
    return selector >= 0 && selector < LLAMA_SPARQ_SELECTOR_COUNT && sparq_selector_of(selector).ranks_scores;
}

const sparq_selector & sparq_selector_of(int32_t id) {
    static const sparq_selector * const table[LLAMA_SPARQ_SELECTOR_COUNT] = {
        &sparq_sel_sparq, &sparq_sel_oracle, &sparq_sel_streaming, &sparq_sel_h2o, &sparq_sel_index,
    };
    static_assert(LLAMA_SPARQ_SELECTOR_SPARQ == 0 && LLAMA_SPARQ_SELECTOR_ORACLE == 1 && LLAMA_SPARQ_SELECTOR_STREAMING == 2 &&
                  LLAMA_SPARQ_SELECTOR_H2O == 3 && LLAMA_SPARQ_SELECTOR_INDEX == 4 && LLAMA_SPARQ_SELECTOR_COUNT == 5,
                  "a selector without its row");
    GGML_ASSERT(id >= 0 && id < LLAMA_SPARQ_SELECTOR_COUNT && "llama_sparq: unknown selector");
    return *table[id];
}
