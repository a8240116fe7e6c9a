// llama-sparq: additions to the GGML_OP_SPARQ_ATTN op beyond its ggml.h constructor.
#pragma once

#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

// Give a sparq_attn node the local window explicitly: win is i32 [w, n_rows, n_stream]
// with, per query row, the cells of the l most recent positions (w >= l entries used,
// -1 for none). Without it the window is the last l valid cells by cell index, which is
// the same thing only while cells are in position order.
GGML_API void ggml_sparq_attn_set_window(struct ggml_tensor * attn, struct ggml_tensor * win);

#ifdef __cplusplus
}
#endif
