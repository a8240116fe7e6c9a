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
// (sparq_op_budget_of) and logit scale, the layer's attention variants included; S holds the
// selectors' state their parameters follow.
ggml_sparq_attn_params sparq_op_params(const llama_sparq_ctx & S, const sparq_layer & L, const llama_sparq_params & p,
                                       const sparq_op_budget & b, const sparq_op_step & st, float scale);

// Whether the op reports into layer L's report in a step with (calibrated) a calibrated k: where the
// host reads it (sparq_report_entries); a device's only for the calibrated k, whose cells the counters count.
bool sparq_op_reports(const sparq_layer & L, bool calibrated);

// The node the graph would build for a decode step of layer L (one query row per stream) over n_kv
// cells with settings p (enabled, k_min resolved), on placeholder tensors of the layer's shapes and
// types in ctx (no data), or NULL with the reason in *why. Its parameters are sparq_op_params', its
// optional sources the same parts as the graph's (window, the selector's inputs, the report).
ggml_tensor * sparq_op_probe(ggml_context * ctx, const llama_sparq_ctx & S, const sparq_layer & L,
                             const llama_sparq_params & p, int64_t n_kv, bool measure, const char ** why);
