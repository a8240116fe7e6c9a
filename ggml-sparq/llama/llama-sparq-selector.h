// llama-sparq: libllama's selector interface. A selector decides which cells the op attends over;
// on the llama side it owns its state (its tensors beside the cache, in an object derived from
// sparq_selector_state), keeps it across rebuilds, adds its nodes to the graph and its terms to the
// cost model. The rest of libllama reaches a selector only through these traits and hooks, never by
// its name: a selector is its files (llama-sparq-select-<name>.cpp) and one row of sparq_selector_of()
// (llama-sparq-selectors.cpp). Its CPU kernels are the op's (ggml-sparq/cpu/sparq-cpu-selector.h).
#pragma once

#include "llama-sparq-cost.h"
#include "llama-sparq-state.h"

#include "ggml-sparq.h"
#include "llama-cparams.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

struct sparq_attn_build; // llama-sparq-graph-build.h

struct sparq_selector {
    // traits
    bool ranks_scores;  // ranks K^T's approximate scores: the basis, mean-V, the calibrated k and the
                        // coverage report
    bool per_head;      // may choose per query head (the GQA setting per_head applies)
    bool window_choice; // its window list (k entries) is the whole choice
    bool every_step;    // runs the op on every decode step, short contexts included (its state follows
                        // every step)

    // The hooks; any may be null.
    // Its settings (p enabled with this selector) alone (cp null) or against the context's; false
    // with a message.
    bool (*check)(const llama_sparq_params & p, const llama_cparams * cp, char * err, size_t err_size);
    // Its state made ready for settings p (enabled with this selector) before they take effect: its
    // tensors allocated, where they must live checked; false with a message.
    bool (*apply)(llama_sparq_ctx & S, const llama_sparq_params & p, char * err, size_t err_size);
    // Before a step that runs SparQ on stream strm holding n_used cells besides the ubatch's (skip):
    // its state brought up to date for them (assign_all: every used cell, for a timed step).
    void (*before_step)(llama_sparq_ctx & S, uint32_t strm, const std::vector<uint32_t> & skip, uint32_t n_used,
                        bool assign_all);
    // The local window for a budget of kk cells (null: the settings' l).
    int (*window)(int kk);
    // Its per-cell data of stream strm after the stream's cells changed (skip: the cells the next
    // ubatch writes). Runs for every selector, current or not (its state, where it has one, may
    // hold another setting's choice: each selector keeps its own current).
    void (*rebuild)(llama_sparq_ctx & S, uint32_t strm, const std::vector<uint32_t> & skip);
    // The graph: its per-cell tensor with the ubatch's new cells set (b.cells_src), beside the appends.
    void (*appends)(sparq_attn_build & b);
    // The graph: what a prompt ubatch (which runs upstream's attention) adds to its state.
    void (*prompt)(sparq_attn_build & b, ggml_tensor * q, ggml_tensor * k, ggml_tensor * kq_mask, float kq_scale);
    // Its parameters of the op (the selector's fields of ggml_sparq_attn_params) for settings p
    // (sparq_op_params: the graph's and the settings' probe alike).
    void (*op_params)(const llama_sparq_ctx & S, const llama_sparq_params & p, ggml_sparq_attn_params & op);
    // The graph: the op's selector inputs (src.sel; q4: the op's query).
    void (*op_srcs)(sparq_attn_build & b, ggml_tensor * q4, ggml_sparq_attn_srcs & src);
    // The settings' probe (sparq_op_probe): placeholders in ctx of the inputs op_srcs gives layer L
    // for a decode step of one stream over src.k's cells (shapes and types only).
    void (*probe_srcs)(ggml_context * ctx, const llama_sparq_ctx & S, const sparq_layer & L, const llama_sparq_params & p,
                       ggml_sparq_attn_srcs & src);
    // The cost model's terms of its choice (c has the cache's element sizes and d) and the decision
    // recorded (sparq_decide).
    void (*decide)(sparq_attn_build & b, sparq_cost & c);
    // What a call of an execution that has run read to choose, as its op reported it: rows of K per KV
    // head and stream (the mean over the call's), or < 0 where it reported nothing. The counters then
    // replace the cost model's estimate of those reads (c.rk) by the count.
    double (*rows_read)(const llama_sparq_ctx & S, const sparq_call_estimate & call);
    // Its own line in the log when the context goes (its counters), where it has one.
    void (*log_stats)(const llama_sparq_ctx & S);
};

// The selector of an LLAMA_SPARQ_SELECTOR_* value.
const sparq_selector & sparq_selector_of(int32_t id);

// Whether every layer's cache is in host memory (a selector that runs on the CPU only needs it);
// false with a message naming the selector.
bool sparq_cache_on_host(const llama_sparq_ctx & S, const char * selector, char * err, size_t err_size);

// Every selector's per-cell data of stream strm after its cells changed (its rebuild hook).
void sparq_selector_rebuild(llama_sparq_ctx & S, uint32_t strm, const std::vector<uint32_t> & skip);

// The names of the selectors that rank K^T's approximate scores, for a message: "a or b".
std::string sparq_ranking_selector_names();
