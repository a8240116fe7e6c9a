// llama-sparq: libllama's selectors by their LLAMA_SPARQ_SELECTOR_* value (llama-sparq-selector.h) and
// their names, and what the rest of libllama asks of all of them at once.

#include "llama-sparq-selector.h"

#include "llama-sparq-messages.h"
#include "llama-sparq-state.h"

#include <string>
#include <vector>

extern const sparq_selector sparq_sel_sparq, sparq_sel_oracle, sparq_sel_streaming, sparq_sel_h2o, sparq_sel_index;

// the selectors' names by value: the one list the front ends (Python, the flags, llama-bench) parse them from
static const char * const sparq_selector_names[LLAMA_SPARQ_SELECTOR_COUNT] = { "sparq", "oracle", "streaming", "h2o", "index" };

const char * llama_sparq_selector_name(int32_t selector) {
    return selector >= 0 && selector < LLAMA_SPARQ_SELECTOR_COUNT ? sparq_selector_names[selector] : nullptr;
}

const sparq_selector & sparq_selector_of(int32_t id) {
    static const sparq_selector * const table[LLAMA_SPARQ_SELECTOR_COUNT] = {
        &sparq_sel_sparq, &sparq_sel_oracle, &sparq_sel_streaming, &sparq_sel_h2o, &sparq_sel_index,
    };
    static_assert(LLAMA_SPARQ_SELECTOR_SPARQ == 0 && LLAMA_SPARQ_SELECTOR_ORACLE == 1 && LLAMA_SPARQ_SELECTOR_STREAMING == 2 &&
                  LLAMA_SPARQ_SELECTOR_H2O == 3 && LLAMA_SPARQ_SELECTOR_INDEX == 4 && LLAMA_SPARQ_SELECTOR_COUNT == 5,
                  "a selector without its row");
    static_assert(LLAMA_SPARQ_SELECTOR_SPARQ == GGML_SPARQ_SEL_SPARQ && LLAMA_SPARQ_SELECTOR_ORACLE == GGML_SPARQ_SEL_ORACLE &&
                  LLAMA_SPARQ_SELECTOR_STREAMING == GGML_SPARQ_SEL_STREAMING && LLAMA_SPARQ_SELECTOR_H2O == GGML_SPARQ_SEL_H2O &&
                  LLAMA_SPARQ_SELECTOR_INDEX == GGML_SPARQ_SEL_INDEX,
                  "the llama and ggml selectors are numbered alike");
    GGML_ASSERT(id >= 0 && id < LLAMA_SPARQ_SELECTOR_COUNT && "llama_sparq: unknown selector");
    return *table[id];
}

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

void sparq_selector_rebuild(llama_sparq_ctx & S, uint32_t strm, const std::vector<uint32_t> & skip) {
    for (int32_t id = 0; id < LLAMA_SPARQ_SELECTOR_COUNT; ++id) {
        if (const auto rebuild = sparq_selector_of(id).rebuild) {
            rebuild(S, strm, skip);
        }
    }
}

std::string sparq_ranking_selector_names() {
    std::vector<const char *> names;
    for (int32_t id = 0; id < LLAMA_SPARQ_SELECTOR_COUNT; ++id) {
        if (sparq_selector_of(id).ranks_scores) {
            names.push_back(sparq_selector_names[id]);
        }
    }
    std::string s;
    for (size_t i = 0; i < names.size(); ++i) {
        s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + std::string(names[i]);
    }
    return s;
}
