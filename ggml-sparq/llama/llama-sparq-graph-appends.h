// llama-sparq: the graph's appends (llama-sparq-graph-appends.cpp): a ubatch's keys and values into the
// data SparQ keeps beside a layer's cache, as nodes of the graph that writes the cache.
#pragma once

#include "llama-sparq-graph-build.h"

#include "ggml.h"

// The nodes that keep the layer's K^T, sums and counts current with the ubatch's keys k_cur and values
// v_cur (the layer's cache views k, v give the cache's types), and on a decode step push each stream's
// new cell into its device window; the selector's per-cell tensor follows (its appends hook). Sets
// b.kt_src, b.vs_src, b.ksq_src and b.vc_src, the op's sources after the appends.
void sparq_build_appends(sparq_attn_build & b, ggml_tensor * k_cur, ggml_tensor * v_cur, const ggml_tensor * k,
                         const ggml_tensor * v);

// Whether the op itself appends this step's cell (ggml_sparq_attn_srcs::cells): a decode step, K^T
// holding the cache's keys as they are, in host memory, and the op's window none or the kept one.
bool sparq_appends_in_op(const sparq_attn_build & b);
// whether the op reads the layer's kept (device) window on this step
bool sparq_reads_kept_window(const sparq_attn_build & b);
// The graph's side of the op's own append: the input's records (appends, the window's push), the
// count's view, the selector's per-cell tensor (its appends hook). The op's sources follow in the hook.
void sparq_appends_into_op(sparq_attn_build & b);

// upstream's index of the ubatch's K rows (the graph's k_idxs: stream * kv_size + cell per token), found
// at the layer's K store
ggml_tensor * sparq_k_idxs(sparq_attn_build & b);

// a per-cell tensor [kv_size, hkv, n_stream] with the ubatch's cells set to value, named name-<layer>
ggml_tensor * sparq_set_new_cells(sparq_attn_build & b, ggml_tensor * t, float value, const char * name);
