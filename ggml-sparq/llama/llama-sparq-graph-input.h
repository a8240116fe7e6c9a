// llama-sparq: the graph's SparQ input (llm_graph_input_sparq: the row picks, and the window where the
// device's does not apply, set per ubatch with the upkeep and the counters; the appends take upstream's
// K row index, and the counts and a decode step's window are kept on the device, so a steady decode step
// uploads nothing) and the per-layer decisions the graph hook records in it; shared by the graph hook
// and the input.
#pragma once

#include "llama-sparq-impl.h"

#include "llama-graph.h"

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
    sparq_cost cost; // the cost model's terms (the index: cost.rk, the key elements per cell the estimate assumes, d p / C)
    int ikv = -1; // the index selector: the cache layer whose centroids' extra row holds the op's read count
    // where the op runs: 0 the CPU (K^T in host memory); 1 the device holding K^T (it supports the
    // node); 2 the CPU although K^T is in device memory (the device does not support the node)
    int device = 0;
    std::string device_name = {};
    bool report = false; // the op reports its choice into the layer's report (ikv_rep)
    int ikv_rep = -1;
};

// How the query rows of a ubatch split between SparQ and upstream's dense attention, decided
// per ubatch at graph build (graph reuse keeps the decision: can_reuse compares it). A sequence
// that brings several tokens to the current llama_decode is prompt processing even where the
// equal split gives it one row per stream (llama-server batches one slot's prompt beside other
// slots' decode steps): alone those rows run upstream's dense attention (build_attn_mha), so they
// run exactly that here too. No stream brings a prompt: SparQ only. Every stream does: the dense
// path (counted as `prefill`). Some do: both, and each token's row is copied from the one that
// applies (a bit-exact pick); the dense attention of the decode rows is then wasted work, once
// per llama_decode that mixes a prompt with decode steps.
enum sparq_rows_mode { SPARQ_ROWS_SPARQ = 0, SPARQ_ROWS_DENSE = 1, SPARQ_ROWS_MIXED = 2 };

// Decode rows that run dense as their sequence would alone (a stretch of them): a stream under the
// dense threshold (min_kv) beside longer ones. A ubatch's decode rows of a layer may be: none so
// (SparQ), all (the layer runs dense, counted as `short`), or some (both run and each row is picked,
// like prompt rows beside decode rows). A sequence's steps so do not depend on the sequences decoded
// beside it.
enum sparq_stretch_mode { SPARQ_STRETCH_NONE = 0, SPARQ_STRETCH_ALL = 1, SPARQ_STRETCH_SOME = 2 };
enum sparq_row_kind { SPARQ_ROW_SPARQ = 0, SPARQ_ROW_SHORT = 1 };
struct sparq_stretch {
    int mode = SPARQ_STRETCH_NONE;
    std::vector<uint8_t> rows; // per stream of the ubatch: its decode row's sparq_row_kind
};

// llama-sparq-graph-hook.cpp:
// the mode of a ubatch over n_stream streams; prompt (optional): per stream, whether its sequence is a prompt
int sparq_rows_mode(const llama_sparq_ctx & S, const llama_ubatch & ub, uint32_t n_stream,
                    std::vector<uint8_t> * prompt = nullptr);
// the stretch mode for the streams of si (prompt: per stream, from sparq_rows_mode), and its rows
int sparq_stretch_rows(const llama_sparq_ctx & S, const llama_kv_cache::slot_info & si, const std::vector<uint8_t> & prompt,
                       std::vector<uint8_t> & rows);
// the most cells in use among the streams of the ubatch (the context length the dense threshold is about:
// the graph's KV view is padded to 256 cells, which would make a 1000-token context count as 1024)
uint32_t sparq_used_max(const llama_kv_cache_context * m);
// The cells under which a graph builds none of SparQ's nodes (no appends, no op: dense's graph), for a
// context whose ubatches hold at most n_ubatch tokens; 0: every graph appends. skipped: whether a graph
// over the ubatch of m does (its longest stream, this ubatch's cells included, under the floor; or a
// context of sparq_dense_always)
uint32_t sparq_append_floor(const llama_sparq_ctx & S, uint32_t n_ubatch);
bool sparq_appends_skipped(const llama_sparq_ctx & S, const llama_kv_cache_context * m, const llama_cparams & cp);
// several sequences share one unified KV stream (SparQ's sums are per stream: dense, shared_stream)
bool sparq_shared_stream(const llama_cparams & cp);
// the reason every step of the context runs dense, whatever its length (shared_stream; short: min_kv over
// a stream's cells), or -1
int sparq_dense_always(const llama_sparq_ctx & S, const llama_cparams & cp);
// the full-attention cache's context of a memory context (plain, iSWA or hybrid), or NULL
const llama_kv_cache_context * sparq_base_mctx(const llama_memory_context_i * m);

// llama-sparq-graph-input.cpp:
// whether each row of a decode ubatch (one token per stream) has its sequence's latest position in its
// stream at its new cell, which the device windows' push then puts in front (the op reads them only then)
bool sparq_rows_latest(const llama_sparq_ctx & S, const llama_ubatch & ub, const llama_kv_cache::slot_info & si);

class llm_graph_input_sparq : public llm_graph_input_i {
public:
    llm_graph_input_sparq(std::shared_ptr<llama_sparq_ctx> S, const llama_kv_cache_context * mctx)
        : S(std::move(S)), mctx(mctx) {}

    void set_input(const llama_ubatch * ubatch) override;
    bool can_reuse(const llm_graph_params & params) override;

    std::shared_ptr<llama_sparq_ctx> S;
    const llama_kv_cache_context * mctx;

    ggml_tensor * win = nullptr;               // [w, n_tps, n_stream] i32: cells of the l most recent positions
    int win_recent = 0;                        // of w: the recent ones (l); the streaming selector's sinks follow
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
    void train_index_if_due();
    void set_pick(const llama_ubatch * ubatch, const std::vector<uint8_t> & prompt);
    void set_window(const llama_ubatch * ubatch);
    void set_device_windows(const llama_ubatch * ubatch);
};
