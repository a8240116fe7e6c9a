// llama-sparq: the vector index's state, shared by its llama-side hooks (llama-sparq-select-index.cpp)
// and its training (llama-sparq-index.cpp).
#pragma once

#include "llama-sparq-state.h"

#include "ggml-cpp.h"
#include "ggml.h"

#include <cstdint>
#include <vector>

// its tensors (allocated on first use) per KV-cache layer: centroids [d, n_list + 1, n_head_kv, n_stream]
// f32 (the extra row: what the op read, ggml_sparq_attn_params::index_reads) and each cell's list
// [kv_size, n_head_kv, n_stream] f32 (-1: not assigned yet; the op assigns it); their list count, and
// per stream the used cells its index was trained on (0: not trained; trained again once the stream
// has doubled)
struct sparq_index_state : sparq_selector_state {
    std::vector<ggml_backend_buffer_ptr> bufs;
    ggml_context_ptr ctx;
    std::vector<ggml_tensor *> cent, list; // by KV-cache layer (NULL: no SparQ data there)
    int32_t n_list = 0;
    std::vector<uint32_t> trained;
    uint64_t n_trainings = 0; // k-means runs (logged at exit; S.stats.mtx)
};

// the k-means training of one stream's index (skip: the cells the next ubatch writes), its list ids
// reset, or with assign_all every used cell assigned to its nearest list
void sparq_train_index(const llama_sparq_ctx & S, sparq_index_state & X, uint32_t strm, const std::vector<uint32_t> & skip,
                       uint32_t n_used, bool assign_all);
