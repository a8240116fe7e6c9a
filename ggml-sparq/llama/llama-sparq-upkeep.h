// llama-sparq: the upkeep between graphs (llama-sparq-upkeep.cpp): a stream's currency, the rebuild
// counter, and waiting for writes to land where a tensor lives.
#pragma once

#include "llama-sparq-state.h"

#include "ggml.h"

#include <cstdint>

// whether the stream's data is current for its cells as they are now
bool sparq_stream_current(const llama_sparq_ctx & S, uint32_t strm);
// counters.n_rebuilds++ (takes S.stats.mtx)
void sparq_count_rebuild(llama_sparq_ctx & S);
// the writes queued to t processed where it lives (RPC)
void sparq_wait_written(const ggml_tensor * t);
