// llama-sparq: the one road from the settings to the op's node. The settings are resolved for a
// layer's step in one place (sparq_op_budget_of: r, k, l; sparq_op_params: every parameter of the
// op), and every attention node is made by ggml_sparq_attn_ext from those parameters: the graph hook's
// (llama-sparq-graph-hook.cpp) and the probe node that the settings' check puts to each device before
// the settings take effect (sparq_op_probe, llama-sparq-api.cpp). What is checked is what runs.
#pragma once

#include "llama-sparq-state.h"
#include "llama-sparq.h"

#include "ggml-sparq.h"

#include <cstdint>

// the step's budget: the components, the cells attended (the calibrated k's cap) and the local window
struct sparq_op_budget {
    int r = 0;
    int kk = 0;
    int l = 0;
    bool calibrated = false; // k = 0: kk is the cap, the op cuts its choice at the coverage target
    bool per_head = false;   // each query head chooses its own cells (GQA's per-head setting applies)
};

// The budget of settings p (enabled, k_min resolved) in a layer of K head size d and g query heads per
// KV head, for a step over n_kv cells (the calibrated k's cap follows it).
sparq_op_budget sparq_op_budget_of(const llama_sparq_params & p, int64_t d, int64_t n_kv, int g);

// what of a step changes the parameters besides the settings and the shapes
struct sparq_op_step {
    int64_t n_kv = 0;     // the graph's KV cells
    bool measure = false; // a fixed k's coverage measured at this step (the guard, where the report is read)
};

// The op's parameters for settings p (enabled, k_min resolved) at step st of layer L with budget b
// (sparq_op_budget_of) and the call's logit scale (times the layer's logit_mul), the layer's attention
// variants included; S holds the selectors' state their parameters follow.
ggml_sparq_attn_params sparq_op_params(const llama_sparq_ctx & S, const sparq_layer & L, const llama_sparq_params & p,
                                       const sparq_op_budget & b, const sparq_op_step & st, float scale);

// Whether the op reports into layer L's report in a step with (calibrated) a calibrated k: where the
// host reads it (sparq_report_entries); a device's only for the calibrated k, whose cells the counters count.
bool sparq_op_reports(const sparq_layer & L, bool calibrated);

// Whether layer L's op appends its decode step's cell itself (ggml_sparq_attn_srcs::cells) with settings
// p and the step's window of l cells: K^T keeps the cache's keys as they are (no PCA rotation, no
// Hadamard rotation undone), in host memory (the CPU op), and the op's window is none or the layer's
// kept one (kept_window: the step allows reading it). Else the graph appends with nodes of its own.
bool sparq_op_appends(const llama_sparq_ctx & S, const sparq_layer & L, const llama_sparq_params & p, int l,
                      bool kept_window);
// whether a decode step with a window of l cells reads layer L's kept window, where the step's rows
// allow it (win_device): a window the selector does not choose itself, within the kept length
bool sparq_op_kept_window(const sparq_layer & L, const llama_sparq_params & p, int l, bool win_device);

// The node the graph would build for a decode step of layer L (one query row per stream) over n_kv
// cells with settings p (enabled, k_min resolved), on placeholder tensors of the layer's shapes and
// types in ctx (no data), or NULL with the reason in *why. Its parameters are sparq_op_params', its
// optional sources the same parts as the graph's (window, the selector's inputs, the report).
ggml_tensor * sparq_op_probe(ggml_context * ctx, const llama_sparq_ctx & S, const sparq_layer & L,
                             const llama_sparq_params & p, int64_t n_kv, bool measure, const char ** why);
