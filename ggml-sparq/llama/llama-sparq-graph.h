// llama-sparq: the hook in llm_graph_context::build_attn (patch 0005) and its node budget (patch 0015).
#pragma once

#include <cstdint>

struct ggml_tensor;
struct ggml_backend_sched;
class llm_graph_result;
struct llm_graph_context;
struct llama_cparams;
class llama_kv_cache_context;

// The graph nodes the hook may add to one graph with these settings (0 with SparQ off), added to
// llama_context::graph_max_nodes: upstream sizes a graph's node table and its tensors' memory for
// its own nodes and a margin, which SparQ's appends and op, with a quantized cache's rounding and
// upstream's Hadamard rotation around them, overran on a 30-layer model.
uint32_t llama_sparq_graph_nodes(const llama_cparams & cparams);

// SparQ attention for this layer and ubatch, in the layout build_attn_mha returns
// ([dv*n_head, n_tokens]), or nullptr when the dense path must run (SparQ off, or a
// dense fallback, which is counted with its reason). A ubatch with prompt rows beside
// decode rows gets both, picked per row (the hook calls g.build_attn_mha itself). Also
// appends the ubatch's keys to K^T and its values to the V sums when the layer keeps
// SparQ data.
// k_cur / v_cur: the new keys and values (nullptr for layers that reuse another's cache).
ggml_tensor * llama_sparq_build_attn(const llm_graph_context & g, const llama_kv_cache_context * mctx,
                                     ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                                     ggml_tensor * k_cur, ggml_tensor * v_cur,
                                     ggml_tensor * kq_b, ggml_tensor * kq_mask, ggml_tensor * sinks,
                                     ggml_tensor * v_mla, float kq_scale, int il, bool is_swa);

// After llama_context computed the graph of res (patch 0017, process_ubatch): the reports its SparQ ops
// wrote on a device, copied into the host's page-locked copies on that device's stream (no wait: the
// counters read them after the step's synchronisation), as upstream copies the logits out.
void llama_sparq_graph_computed(llm_graph_result * res, ggml_backend_sched * sched);
