// llama-sparq: libllama's SparQ state of one context: the data kept beside each layer's K and V, each
// stream's currency, the settings, the counters and what feeds them, the memory SparQ allocated.
//
// Data. For every full-attention layer of the KV cache with a cache type the op reads
// (ggml_sparq_cache_type_ok) and non-transposed V, a K^T tensor [kv_size, d, n_head_kv, n_stream] (the
// keys again, cell-contiguous, same type as K; f16 of the dequantized keys for a quantized cache) and a V-sum tensor [dv, n_head_kv, n_stream] f32 with
// its Kahan compensation (same shape), allocated in the buffer type of the layer's K when
// SparQ is first enabled (llama-sparq-buffers.cpp).
//
// Upkeep. Each ubatch appends its keys to K^T (set_rows, O(d) per token and layer)
// and adds its values to the V sums (compensated), in the graph (llama-sparq-graph-appends.cpp).
// Every other change of the cache (sequence removal/copy/keep, position shifts that re-rope K,
// clearing, state load, stream copies, overwrites, anything done while SparQ was off) is detected
// through the cells' content versions (llama-sparq-cells.h, kept by llama_kv_cells through patch
// 0009): a stream's data is current while the stream's version hash equals the hash recorded when
// the data was last brought up to date, extended by the cells the ubatch about to run writes
// (O(ubatch) per step, independent of the cache size; llama-sparq-graph-input.cpp). A stream that
// is not current is rebuilt from K, V and the cells before the graph that uses it runs (rare
// operations; O(used cells * d), multi-threaded over layers and cell ranges;
// llama-sparq-rebuild-host.cpp, llama-sparq-rebuild-device.cpp). The count of valid cells and a
// decode step's local window are kept on the device too (updated by the appends' nodes).
//
// A selector's own state (its tensors, their buffers) is its own: an object derived from
// sparq_selector_state, made by its apply hook and known only to its files.
#pragma once

#include "llama-sparq-cost.h"
#include "llama-sparq.h"

#include "llama-cparams.h"

#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml.h"

#include <bitset>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

struct llama_context;
class llama_kv_cache;
class llama_batch_allocr;

// the data SparQ keeps beside a layer's K and V, brought up to date by the graph's appends and by
// rebuilds
struct sparq_layer_data {
    // [kv_size, d, n_head_kv, n_stream]: q4_1 blocks with kt_bits = 4, i8 holding e5m2 with 8, or the
    // cache's type (f16 for a quantized cache) with 16 (sparq_kt_type)
    ggml_tensor * kt   = nullptr;
    // the layer's V cache [dv * n_head_kv, kv_size, n_stream]: upstream's, or where the cache holds no V
    // (MLA: V is the first dv values of each K row) a view of K with K's row stride
    ggml_tensor * v    = nullptr;
    ggml_tensor * vsum = nullptr; // [dv, n_head_kv, n_stream] f32
    ggml_tensor * ksq  = nullptr; // [d, n_head_kv, n_stream] f32: the sum of k^2 per component (the scaled basis)
    // the V sums' compensation (Kahan summation of the appends; vsum - vcomp is the exact sum to
    // about one rounding): [dv, n_head_kv, n_stream] f32
    ggml_tensor * vcomp = nullptr;
    // [n_stream] f32: the stream's valid cells, the divisor of the mean of V (the op's v_count), kept
    // beside the sums (appended by the graph, set by a rebuild) so that no count is uploaded per step
    ggml_tensor * vcount = nullptr;
    // [l, n_stream] i32: per stream the cells of its sequence's l most recent positions, most recent
    // first (-1 after them), the op's local window on a decode step: pushed by the graph's K^T append
    // (ggml_sparq_cell_scatter_set_window) and uploaded only where the host cannot vouch for it
    // (sparq_stream_state's win_*). l is the settings' (sparq_window_cap); NULL where it is 0 or the
    // selector's window is not just the recent cells (sparq_alloc_win)
    ggml_tensor * win = nullptr;
    // upstream's Hadamard rotation of q and k (a quantized K cache, llama_sparq_ctx::hadamard): [n, n] f32 next
    // to K^T, shared by the layers in one buffer type. Outside the PCA basis K^T keeps the keys rotated back
    // and steps 1-2 rotate the query back: the rotation spreads q's largest components over all of them
    // (what it is for), and the top r of the model's own components find the cells much better
    ggml_tensor * hrot = nullptr;
    // [4, n_head_kv, n_stream] f32: what the op did per stream and KV head (ggml_sparq_attn_srcs::report),
    // written by the op where it runs; the host reads it through sparq_layer_report::entries
    ggml_tensor * report = nullptr;
};

// the PCA basis (LLAMA_SPARQ_BASIS_PCA): rot [d, d, n_head_kv] f32, rot[j + d*(m + d*h)] = component j
// of axis m of KV head h; spread [d, n_head_kv] f32, the keys' RMS along each axis
struct sparq_layer_basis {
    ggml_tensor * rot = nullptr;
    ggml_tensor * spread = nullptr;
    std::vector<float> rot_host; // the same, on the host (rebuilds rotate with it); empty: identity
};

// where the host reads a layer's report (the op's report tensor, sparq_layer_data::report): the
// tensor's own memory where it is host memory (the CPU op writes it during the step); for a device's
// tensor a copy in page-locked memory of the device's host buffer type, which libllama fills after
// each graph whose op wrote the report (llama_sparq_graph_computed, queued on the device's stream, no
// wait). Empty where the host cannot read it (an RPC host's memory): no report is then asked of the op
struct sparq_report_entries {
    float * host = nullptr;
    size_t n = 0;
    std::shared_ptr<ggml_backend_buffer> mirror_buf; // the page-locked copy of a device's report
    float * data() { return host; }
    size_t size() const { return host ? n : 0; }
    float * begin() { return data(); }
    float * end() { return data() + size(); }
    bool device() const { return mirror_buf != nullptr; }
};

// what the op reports of its choice, and the layer's counters of those reports (llama-sparq-coverage.cpp)
struct sparq_layer_report {
    // per (stream, KV head): 4 floats (ggml_sparq_attn_srcs::report); an entry the counters have taken
    // is set to SPARQ_REPORT_TAKEN (a device's copy not landed yet reads as taken: not counted)
    sparq_report_entries entries;
    uint64_t n_calls = 0;         // calls measured
    uint64_t n_reach_calls = 0;   // of those, the calls that measured the cells reaching the target
    uint64_t n_reached_calls = 0; // of those, the calls whose every head reached it
    double k_sum = 0.0;           // per call: the mean cells attended
    double cov_sum = 0.0;         // per call: the mean estimated coverage
    double reach_sum = 0.0;       // per measuring call: the mean cells reaching the target
    double compression_sum = 0.0; // per call: its compression
};

struct sparq_layer {
    int reason = -1;              // >= 0: no data for this layer, why
    const char * variant = nullptr; // LLAMA_SPARQ_DENSE_ATTN_VARIANT: sparq_attn_variant's phrase
    ggml_type type_k = GGML_TYPE_COUNT, type_v = GGML_TYPE_COUNT; // the cache's types (a refusal names them)
    int32_t il = -1;              // the model's layer index (kept: the cache may be gone when the counters log)
    int64_t n_head = 0;           // the layer's query heads
    // the attention variants the op computes (ggml_sparq_attn_params): soft-capping, ALiBi's max_bias
    // (0: none), and whether the layer's calls pass sinks and a KQ bias
    float softcap = 0.0f, max_bias = 0.0f;
    // the layer's own multiplier of its calls' logit scale, in the op's scale (Grok's out_scale: its
    // scores are capped after it), 1 for none
    float logit_mul = 1.0f;
    bool sinks = false, kq_b = false;
    sparq_layer_data data;
    sparq_layer_basis basis;
    sparq_layer_report report;
};

constexpr float SPARQ_REPORT_TAKEN = -2.0f;

// per stream: whether K^T and the V sums equal a recomputation for the cells whose
// version hash was `hash` (the stream's hash when the data was last brought up to date)
struct sparq_stream_state {
    bool valid = false;
    uint64_t hash = 0;
    // the device windows (sparq_layer_data::win) of every layer hold sequence win_seq's most recent
    // cells as of its latest position win_pos, for the cells whose version hash was win_hash: the
    // next decode step's push is exact when the stream's cells changed only by its new cell, a newer
    // position of the same sequence (llm_graph_input_sparq::set_device_windows)
    bool win_valid = false;
    int32_t win_seq = -1;
    int32_t win_pos = -1;
    uint64_t win_hash = 0;
};

// the context's counters (llama_sparq_get_stats); every access holds sparq_stats_state::mtx
struct sparq_counters {
    uint64_t n_sparq = 0;
    uint64_t n_sparq_device = 0;    // of n_sparq: the op ran on a non-CPU device (ggml-sparq/cuda/sparq-cuda.cu)
    uint64_t n_dense[LLAMA_SPARQ_DENSE_COUNT] = {};
    double   compression_sum = 0.0;
    uint64_t n_rebuilds = 0;
    uint64_t n_reads_counted = 0;   // calls whose reads the op reported (the selector's rows_read; the rest: the estimate)
};

// the PCA basis: tensors allocated on first use, calibrated at the first SparQ step
struct sparq_basis_state {
    std::vector<ggml_backend_buffer_ptr> bufs;
    ggml_context_ptr ctx;
    bool calibrated = false;
};

// upstream's Hadamard rotation of q and k (a quantized K cache)
struct sparq_hadamard_state {
    int64_t n = 0; // the matrix's size (0: upstream does not rotate)
    // K^T holds (or, after a rebuild, will hold) the keys rotated back: set with the basis whenever the data
    // is invalidated for new settings (kept while SparQ is off: the data stays what it was)
    bool kt_unrotated = false;
    std::vector<float> matrix_host; // the matrix (n x n), for the host rebuild
};

// the tensors and buffers SparQ allocates beside the cache (llama-sparq-buffers.cpp), and their bytes
struct sparq_memory_state {
    ggml_context_ptr ctx;
    std::vector<ggml_backend_buffer_ptr> bufs;
    // K^T in buffers of its own: remade when kt_bits changes (sparq_alloc_kt); kt_bits: its bits now
    ggml_context_ptr kt_ctx;
    std::vector<ggml_backend_buffer_ptr> kt_bufs;
    int32_t kt_bits = 16;
    // the device windows in buffers of their own: remade when their length changes (sparq_alloc_win);
    // win_cap: that length (0: none), win_layers: the layers that have one
    ggml_context_ptr win_ctx;
    std::vector<ggml_backend_buffer_ptr> win_bufs;
    int32_t win_cap = 0;
    size_t win_layers = 0;
    uint64_t extra_bytes = 0; // SparQ's own bytes
    uint64_t kv_bytes = 0;    // the cache's bytes, for the share
};

// one SparQ call of an execution as the counters estimated it
struct sparq_call_estimate {
    int32_t ikv, il;
    uint32_t s0, n_stream;  // the call's streams (contiguous, as the graph's views take them)
    double n_cells, md, ms; // the cells, and dense's and SparQ's bytes counted for the call
    sparq_cost c;           // its cost-model terms
};

// the context's counters and what feeds them: written by the decoding thread in set_input, read by
// llama_sparq_get_stats from any thread (llama-server's HTTP threads), so every access holds mtx
struct sparq_stats_state {
    mutable std::mutex mtx;
    sparq_counters counters;
    bool logged_host_fallback = false;
    // the calls of the last execution whose op reports the rows of K its selector read to choose
    // (the selector's rows_read): their estimate (c.rk) is replaced by the count once that execution ran
    struct reads_pending_call : sparq_call_estimate {
        int32_t selector;
    };
    std::vector<reads_pending_call> reads_pending;
    // the calls of the last execution whose op reports its choice (llama-sparq-coverage.cpp)
    struct report_pending_call : sparq_call_estimate {
        // per stream of the call: 1 where the op's row was not used (a prompt row, or a stream under the
        // dense threshold beside streams that run SparQ): its report is dropped
        std::bitset<LLAMA_MAX_SEQ> unused;
    };
    std::vector<report_pending_call> report_pending;
    // the guard: with a fixed k the first SparQ execution after set_params measures the coverage
    // (measure_due), and its reports are checked against the target once (guard_due)
    bool measure_due = true;
    bool guard_due = false;
    uint32_t logged = 0; // reasons already logged
};

// a selector's own state, derived by the selector's files (llama-sparq-selector.h)
struct sparq_selector_state {
    virtual ~sparq_selector_state() = default;
};

struct llama_sparq_ctx {
    llama_sparq_params params = llama_sparq_default_params();

    llama_context * lctx = nullptr;         // the context owning this (for its thread count)
    bool graph_rebuild_host = false;        // llama_sparq_debug_graph_rebuild: host memory rebuilt as a device's
    llama_kv_cache * kv = nullptr;          // the full-attention cache
    std::vector<sparq_layer> layers;        // by KV-cache layer index
    std::vector<sparq_stream_state> streams; // by stream
    sparq_memory_state mem; // the tensors and buffers SparQ allocated beside the cache
    // min_kv was given as -1 and resolved by where the cache is (and, on a GPU, by the kind of k):
    // the resolved value read back and passed back unchanged stays the default (re-resolved)
    bool min_kv_auto = false;
    int32_t n_layers = 0;

    sparq_stats_state stats; // the counters and what feeds them (holds its own lock)

    // the context's batch (which sequences bring several tokens to the current llama_decode)
    const llama_batch_allocr * balloc = nullptr;

    sparq_basis_state basis;
    sparq_hadamard_state hadamard;
    // by LLAMA_SPARQ_SELECTOR_* value: the selector's own state (null until its apply hook makes it)
    std::unique_ptr<sparq_selector_state> selectors[LLAMA_SPARQ_SELECTOR_COUNT];

    ~llama_sparq_ctx(); // logs the counters (llama-sparq-stats.cpp)
};

// K^T of layer L holds the keys rotated back from upstream's Hadamard rotation (outside the PCA
// basis, whose axes are found on the cache's keys as they are: sparq_hadamard_state::kt_unrotated)
inline bool sparq_unrotates(const llama_sparq_ctx & S, const sparq_layer & L) {
    return L.data.hrot && S.hadamard.kt_unrotated;
}
