// llama-sparq: the graph's SparQ input (llm_graph_input_sparq: the row picks, and the window where the
// device's does not apply, set per ubatch with the upkeep and the counters; the appends take upstream's
// K row index, and the counts and a decode step's window are kept on the device, so a steady decode step
// uploads nothing) and the per-layer decisions the graph hook records in it; shared by the graph hook
// and the input.
#pragma once

#include "llama-sparq-cost.h"
#include "llama-sparq-rows.h"
#include "llama-sparq-state.h"

#include "llama-graph.h"
#include "llama-kv-cache.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

// one attention call of a graph: SparQ (reason -1) or why dense, and the cost model's terms
struct sparq_decision {
    int il;
    int reason;   // -1: SparQ
    int k;        // the k setting
    int rows;     // the most rows of K and V a step reads (k, or g * (k - l) + l with per-head choice)
    sparq_cost cost; // the cost model's terms (cost.rk: the key elements per cell the selector's reads are estimated at)
    int ikv = -1; // SparQ: the call's KV-cache layer
    // where the op runs: 0 the CPU (K^T in host memory); 1 the device holding K^T (it supports the
    // node); 2 the CPU although K^T is in device memory (the device does not support the node)
    int device = 0;
    std::string device_name = {};
    bool report = false; // the op reports its choice into the layer's report
};

class llm_graph_input_sparq : public llm_graph_input_i {
public:
    llm_graph_input_sparq(std::shared_ptr<llama_sparq_ctx> S, const llama_kv_cache_context * mctx)
        : S(std::move(S)), mctx(mctx) {}

    void set_input(const llama_ubatch * ubatch) override;
    bool can_reuse(const llm_graph_params & params) override;

    std::shared_ptr<llama_sparq_ctx> S;
    const llama_kv_cache_context * mctx;

    ggml_tensor * win = nullptr;               // [w, n_tps, n_stream] i32: cells of the l most recent positions
    int win_recent = 0;                        // of w: the recent ones (l); a whole choice's earliest cells follow
    // the KV layers whose K^T append pushes the step's cells into their device windows (a decode step);
    // win_device: the ubatch's rows allow the ops to read those (sparq_rows_latest; graph reuse compares
    // it), win_read: some layer's op reads its device window (sparq_layer_data::win) instead of win
    std::vector<int32_t> win_layers;
    bool win_device = false;
    bool win_read = false;
    bool appends = false;                      // this graph appends to K^T and the V sums
    int  short_ctx = -1;                       // built with the streams under min_kv cells (1) or not (0); -1 unused
    bool skip = false;                         // built without SparQ's nodes (sparq_appends_skipped; graph reuse compares it)
    int  rows_mode = SPARQ_ROWS_SPARQ;         // sparq_rows_mode of the ubatch the graph was built for
    int  measure = -1;                         // built measuring the coverage of a fixed k (1) or not (0); -1 unused
    std::map<int32_t, sparq_stretch> stretch;  // by KV layer: the stretches the graph was built for
    ggml_tensor * pick = nullptr;              // SPARQ_ROWS_MIXED: [n_tokens] i32, per token its row of [SparQ; dense]
    std::map<int32_t, ggml_tensor *> layer_pick; // by KV layer, SPARQ_STRETCH_SOME: the same with its stretches' rows
    std::vector<sparq_decision> decisions;     // one per attention layer of this graph
    // the ops that write their layer's report: KV layer, first stream, streams (a device's is copied to
    // the host after the graph ran: sparq_graph_computed)
    struct report_write { int32_t ikv; uint32_t s0; int64_t n_stream; };
    std::vector<report_write> reports;
    std::vector<uint8_t> prompt_buf, rows_buf; // per-ubatch scratch (their capacity stays: no allocation once warm)
    std::vector<uint8_t> win_exact;            // per stream of the ubatch: its device windows need no upload
    std::vector<int32_t> win_buf;              // the device windows' rows before the push, when uploaded

private:
    // the steps of set_input, in its order (the counters follow in set_input itself)
    bool runs_sparq() const;                   // some attention call of this graph runs SparQ
    void calibrate_if_due();
    void keep_streams_current();
    void selector_before_step();
    void set_pick(const llama_ubatch * ubatch, const std::vector<uint8_t> & prompt);
    void set_window(const llama_ubatch * ubatch);
    void set_device_windows(const llama_ubatch * ubatch);
};
