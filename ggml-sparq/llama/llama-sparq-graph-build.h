// llama-sparq: one attention call as the graph hook builds it (sparq_attn_build), shared by the
// hook (llama-sparq-graph-hook.cpp), its appends (llama-sparq-graph-appends.cpp) and the selectors'
// graph hooks (llama-sparq-select-*.cpp).
#pragma once

#include "llama-sparq-cost.h"
#include "llama-sparq-graph-input.h"
#include "llama-sparq-op.h"
#include "llama-sparq-selector.h"
#include "llama-sparq-state.h"
#include "llama-sparq-upstream.h"

#include "llama-graph.h"
#include "llama-kv-cache.h"

#include <algorithm>
#include <cstdint>

// a decision of this call recorded in the graph's input (for the counters), where there is one
inline void sparq_decide(llm_graph_input_sparq * inp, int il, int reason, int kk = 0, int rows = 0,
                         const sparq_cost & cost = {}) {
    if (inp) {
        inp->decisions.push_back({ il, reason, kk, rows, cost });
    }
}

// one attention call that may run SparQ: its layer's data, the shapes, the settings as they apply to
// this layer, and the op's sources (the kept tensors, or the graph's appends to them)
struct sparq_attn_build {
    const llm_graph_context & g;
    ggml_context * ctx0;
    llama_sparq_ctx & S;
    const llama_sparq_params & P;
    sparq_layer & L;
    llm_graph_input_sparq * inp;
    const llama_kv_cache::slot_info & si;
    int il;
    int32_t ikv;

    int64_t n_stream, n_tokens, n_tps, n_kv, d, hkv;
    int r, kk, l, g_size;
    sparq_op_budget budget; // r, kk, l, calibrated and per_head as the op's parameters take them (sparq_op_budget_of)
    const sparq_selector * sel;
    bool per_head;
    bool calibrated; // k = 0: kk is the cap of the calibrated k, the op cuts its choice at the coverage target
    bool stretch = false; // some decode rows, not all, run dense as alone (under the dense threshold:
                          // SPARQ_STRETCH_SOME): upstream's attention, picked
    bool win_pushed = false;       // the K^T append (or the op) pushes the step's cells into the layer's device window
    bool appends_in_op = false;    // the op appends the step's cell itself (sparq_appends_in_op)

    ggml_tensor * kt_src, * vs_src, * ksq_src;
    ggml_tensor * cells_src = nullptr; // the selector's per-cell tensor with the ubatch's cells set (its appends hook)
    ggml_tensor * k_idxs = nullptr;    // sparq_k_idxs, once found
    ggml_tensor * vc_src = nullptr;    // the streams' valid-cell counts after the appends (the op's v_count)

    sparq_attn_build(const llm_graph_context & g, const llama_kv_cache_context * mctx, llama_sparq_ctx & S,
                     llm_graph_input_sparq * inp, int il, int32_t ikv, const ggml_tensor * q, const ggml_tensor * k)
        : g(g), ctx0(g.ctx0), S(S), P(S.params), L(S.layers[ikv]), inp(inp), si(upstream::sinfo(mctx)), il(il), ikv(ikv) {
        n_stream = k->ne[3];
        n_tokens = q->ne[2];
        n_tps    = n_tokens / n_stream;
        n_kv     = k->ne[2];
        d        = k->ne[0];
        hkv      = k->ne[1];
        sel = &sparq_selector_of(P.selector);
        g_size = (int) (q->ne[1] / std::max<int64_t>(1, hkv));
        budget = sparq_op_budget_of(P, d, n_kv, g_size);
        r = budget.r;
        kk = budget.kk;
        l = budget.l;
        calibrated = budget.calibrated;
        per_head = budget.per_head;
        kt_src = L.data.kt;
        vs_src = L.data.vsum;
        ksq_src = L.data.ksq;
    }
};

