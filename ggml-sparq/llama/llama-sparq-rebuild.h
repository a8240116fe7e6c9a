// llama-sparq: a stream's K^T, sums and counts recomputed from K, V and the cells: on the host
// (llama-sparq-rebuild-host.cpp), or on the device that holds the cache (llama-sparq-rebuild-device.cpp).
#pragma once

#include "llama-sparq-state.h"

#include <cstdint>
#include <vector>

// K^T and the sums of one stream recomputed (or, with check, compared: the largest difference), leaving
// out the cells of skip (the ubatch about to run writes them); the selectors' per-cell data follows
double sparq_rebuild_stream(llama_sparq_ctx & S, uint32_t strm, const std::vector<uint32_t> & skip, bool check = false);

// the same on the device holding the cache; false where it does not apply. allow_host: host memory
// counts as a device too (the CPU backend; llama_sparq_debug_graph_rebuild)
bool sparq_rebuild_stream_device(llama_sparq_ctx & S, uint32_t strm, const std::vector<uint32_t> & skip, bool allow_host);
