// llama-sparq: libllama's selectors by their LLAMA_SPARQ_SELECTOR_* value (llama-sparq-selector.h).

#include "llama-sparq-selector.h"

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
