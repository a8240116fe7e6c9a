// llama-sparq: the basis of steps 1-2 (llama-sparq-basis.cpp): the PCA basis's tensors beside each
// layer's K^T, and the PCA or scaled basis calibrated on the cache's keys.
#pragma once

#include "llama-sparq-state.h"

#include <cstddef>
#include <cstdint>
#include <vector>

// allocate the PCA basis tensors (identity, unit spread) next to each layer's K^T
bool sparq_alloc_basis(llama_sparq_ctx & S, char * err, size_t err_size);
// the PCA basis back to the identity (unit spread), not calibrated
void sparq_basis_reset(llama_sparq_ctx & S);
// the PCA (rotate) or scaled basis calibrated on the keys the cache holds now (skip: per stream, the
// cells the current ubatch writes)
void sparq_calibrate(llama_sparq_ctx & S, bool rotate, const std::vector<std::vector<uint32_t>> & skip);
