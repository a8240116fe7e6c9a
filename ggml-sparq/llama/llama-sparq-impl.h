// llama-sparq: libllama's internal SparQ state (per-layer data, per-stream currency, the context's
// settings and counters), the friend that reaches upstream's private members, and the internal
// functions the llama/ files share.
//
// Data. For every full-attention layer of the KV cache with an f16, f32 or q8_0 cache and
// non-transposed V, a K^T tensor [kv_size, d, n_head_kv, n_stream] (the keys again,
// cell-contiguous, same type as K; f16 of the dequantized keys for q8_0) and a V-sum tensor [dv, n_head_kv, n_stream] f32 with
// its Kahan compensation (same shape), allocated in the buffer type of the layer's K when
// SparQ is first enabled (llama-sparq-buffers.cpp).
//
// Upkeep. Each ubatch appends its keys to K^T (set_rows, O(d) per token and layer)
// and adds its values to the V sums (compensated), in the graph (llama-sparq-graph-hook.cpp).
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
#pragma once

#include "llama-sparq.h"
#include "ggml-sparq.h"

#include "llama-context.h"
#include "llama-graph.h"
#include "llama-impl.h"
#include "llama-kv-cache.h"
#include "llama-model.h"

#include "ggml-backend.h"
#include "ggml-cpp.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <bitset>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

// ---------------------------------------------------------------------------
// per-context state
// ---------------------------------------------------------------------------

// the data SparQ keeps beside a layer's K and V, brought up to date by the graph's appends and by
// rebuilds
struct sparq_layer_data {
    // [kv_size, d, n_head_kv, n_stream]: the cache's type (f16 for a quantized cache), or i8 holding
    // e5m2 with kt_bits = 8 (sparq_kt_type)
    ggml_tensor * kt   = nullptr;
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

// the per-cell state of the selectors that keep one
struct sparq_layer_selectors {
    // H2O: the accumulated attention per cell: [kv_size, n_head_kv, n_stream] f32 (allocated when
    // h2o is first selected)
    ggml_tensor * h2o = nullptr;
    // the index (allocated on first use): centroids [d, n_list, n_head_kv, n_stream] f32 and each cell's
    // list [kv_size, n_head_kv, n_stream] f32 (-1: not assigned yet; the op assigns it)
    ggml_tensor * ivf_cent = nullptr;
    ggml_tensor * ivf_list = nullptr;
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
// each graph whose op wrote the report (sparq_graph_computed, queued on the device's stream, no wait).
// Empty where the host cannot read it (an RPC host's memory): no report is then asked of the op
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
    sparq_layer_data data;
    sparq_layer_selectors sel;
    sparq_layer_basis basis;
    sparq_layer_report report;
};

constexpr float SPARQ_REPORT_TAKEN = -2.0f;

// The cost model (docs/algorithm.md, "Cost model"): bytes moved per KV head and decode step. A K or
// V element costs its cache type's bytes (f16 2, f32 4, q8_0 34/32), a K^T element K^T's (2 or 4);
// the mean of V and the selectors' other terms are counted in 2-byte units (an f16 element), so
// that with f16 everywhere the ratio is the ratio of elements moved.
struct sparq_cost {
    double d = 0.0;     // head size
    double r = 0.0;     // per cell: K^T elements read (steps 1-2), at bt bytes
    double rs = 0.0;    // per cell: the selector's own data (H2O's scores, the index's list ids), 2-byte units
    double rk = 0.0;    // per cell: K-row elements read to choose (the index's probed keys, estimated)
    double extra = 0.0; // other elements per KV head, 2-byte units (the PCA rotation, the index's centroids)
    double bk = 2.0, bv = 2.0, bt = 2.0; // bytes per element of K, V and K^T
    // dense: read n_cells rows of K and of V, write the new k and v
    double dense(double n_cells) const { return (n_cells + 1.0) * d * (bk + bv); }
    // the selection's reads, `rows` rows of K and of V, the new k and v written, vbar read and written
    double sparq(double n_cells, double rows) const {
        return n_cells * (r * bt + 2.0 * rs + rk * bk) + (std::min(rows, n_cells) + 1.0) * d * (bk + bv) +
               2.0 * (2.0 * d + extra);
    }
};

// bytes per element of a cache type (34/32 for q8_0's blocks)
inline double sparq_elem_bytes(ggml_type t) {
    return (double) ggml_row_size(t, ggml_blck_size(t)) / (double) ggml_blck_size(t);
}

// whether the selector ranks step 2's approximate scores (llama-sparq-selector.h's trait)
bool sparq_selector_ranks_scores(int32_t selector);

// k = 0 with a selector that ranks by scores: the op cuts its choice at the coverage target
inline bool sparq_is_calibrated(const llama_sparq_params & P) {
    return P.k == 0 && sparq_selector_ranks_scores(P.selector);
}

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
    uint64_t n_index_trainings = 0; // the index selector's k-means runs (logged at exit)
    uint64_t n_index_measured = 0;  // index calls whose reads were counted (the rest: the estimate)
};

// the PCA basis: tensors allocated on first use, calibrated at the first SparQ step
struct sparq_basis_state {
    std::vector<ggml_backend_buffer_ptr> bufs;
    ggml_context_ptr ctx;
    bool calibrated = false;
};

// the index selector: its tensors, their list count, and per stream the used cells its index was
// trained on (0: not trained; trained again once the stream has doubled)
struct sparq_index_state {
    std::vector<ggml_backend_buffer_ptr> bufs;
    ggml_context_ptr ctx;
    int32_t n_list = 0;
    std::vector<uint32_t> trained;
};

// the h2o selector: its scores' tensors, allocated when it is first selected
struct sparq_h2o_state {
    std::vector<ggml_backend_buffer_ptr> bufs;
    ggml_context_ptr ctx;
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

// the context's counters and what feeds them: written by the decoding thread in set_input, read by
// llama_sparq_get_stats from any thread (llama-server's HTTP threads), so every access holds mtx
struct sparq_stats_state {
    mutable std::mutex mtx;
    sparq_counters counters;
    bool logged_host_fallback = false;
    // the index selector's counted reads: the last execution's index calls, whose cost-model estimate
    // (even lists) is replaced by what the op reported once that execution has run
    struct ivf_pending_call {
        int32_t ikv;
        uint32_t s0, n_stream; // the call's streams (contiguous, as the graph's views take them)
        double n_cells, md, ms;
        sparq_cost c; // c.rk: the estimate's key elements per cell (d p / C)
    };
    std::vector<ivf_pending_call> ivf_pending;
    // the calls of the last execution whose op reports its choice (llama-sparq-coverage.cpp)
    struct report_pending_call {
        int32_t ikv, il;
        uint32_t s0, n_stream;
        double n_cells, md, ms; // the estimate counted for the call
        sparq_cost c;           // its cost-model terms
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
    sparq_index_state index;
    sparq_h2o_state h2o;
    sparq_hadamard_state hadamard;

    ~llama_sparq_ctx(); // logs the counters (llama-sparq-stats.cpp)
};

// K^T of layer L holds the keys rotated back from upstream's Hadamard rotation (outside the PCA
// basis, whose axes are found on the cache's keys as they are: sparq_hadamard_state::kt_unrotated)
inline bool sparq_unrotates(const llama_sparq_ctx & S, const sparq_layer & L) {
    return L.data.hrot && S.hadamard.kt_unrotated;
}

// the friend of llama_context, llama_kv_cache and llama_kv_cache_context (patch 0005)
struct llama_sparq_access {
    static llama_cparams & cparams(llama_context * c) { return c->cparams; }
    static const llama_batch_allocr * balloc(llama_context * c) { return c->balloc.get(); }
    static void need_reserve(llama_context * c) { c->sched_need_reserve = true; }
    static const llama_model & model(const llama_context * c) { return c->model; }
    static const std::vector<ggml_backend_ptr> & backends(llama_context * c) { return c->backends; }
    // the graph of the context's last computation (NULL before the first or after a reset)
    static llm_graph_result * last_graph(llama_context * c) { return c->gf_res_prev_active; }

    static uint32_t kv_size(const llama_kv_cache * kv) { return kv->get_size(); }
    static uint32_t n_stream(const llama_kv_cache * kv) { return kv->n_stream; }
    static bool v_trans(const llama_kv_cache * kv) { return kv->v_trans; }
    static size_t n_layers(const llama_kv_cache * kv) { return kv->layers.size(); }
    static uint32_t layer_il(const llama_kv_cache * kv, size_t ikv) { return kv->layers[ikv].il; }
    static ggml_tensor * layer_k(const llama_kv_cache * kv, size_t ikv) { return kv->layers[ikv].k; }
    static ggml_tensor * layer_v(const llama_kv_cache * kv, size_t ikv) { return kv->layers[ikv].v; }
    // upstream's Walsh-Hadamard rotation of q and k for a quantized K cache (llama_kv_cache's attn_rot_k):
    // its size, as build_input_k_rot takes it (the largest power of 2 >= 64 dividing the head size), or 0
    static int64_t k_rot_n(const llama_kv_cache * kv) {
        if (!kv->attn_rot_k || kv->n_embd_head_k_all <= 0) {
            return 0;
        }
        int64_t n = 64;
        while (kv->n_embd_head_k_all % (2 * n) == 0) {
            n *= 2;
        }
        return n;
    }
    // its matrix (n x n, row-major, symmetric: its own inverse); a cache that shares another's cells
    // keeps no copy: then the same construction as upstream's (Sylvester's, entries +-1/sqrt(n))
    static std::vector<float> k_rot_matrix(const llama_kv_cache * kv, int64_t n) {
        const auto it = kv->attn_rot_hadamard.find(n);
        if (it != kv->attn_rot_hadamard.end()) {
            return it->second;
        }
        std::vector<float> h((size_t) n * n);
        h[0] = (float) (1.0 / sqrtf((float) n));
        for (int64_t s = 1; s < n; s *= 2) {
            for (int64_t i = 0; i < s; ++i) {
                for (int64_t j = 0; j < s; ++j) {
                    const float x = h[i * n + j];
                    h[(i + s) * n + j] = x;
                    h[i * n + j + s] = x;
                    h[(i + s) * n + j + s] = -x;
                }
            }
        }
        return h;
    }
    static int32_t ikv_of(const llama_kv_cache * kv, int32_t il) {
        auto it = kv->map_layer_ids.find(il);
        return it == kv->map_layer_ids.end() ? -1 : it->second;
    }
    static const llama_kv_cells & cells(const llama_kv_cache * kv, uint32_t strm) { return kv->v_cells[strm]; }
    // the cells' content versions (patch 0009, llama-sparq-cells.h)
    static uint64_t cells_hash(const llama_kv_cells & c) { return c.sparq_ver.hash; }
    static uint64_t cell_ver_hash(const llama_kv_cells & c, uint32_t i) {
        return llama_sparq_cell_versions::mix(i, c.sparq_ver.ver[i]);
    }
    static llama_kv_cells & cells_mut(llama_kv_cache * kv, uint32_t strm) { return kv->v_cells[strm]; }
    static void set_head(llama_kv_cache * kv, uint32_t strm, uint32_t h) { kv->v_heads[strm] = h; }

    static const llama_kv_cache * cache(const llama_kv_cache_context * m) { return m->kv; }
    static const llama_kv_cache::slot_info & sinfo(const llama_kv_cache_context * m) { return m->sinfos[m->i_cur]; }
    static uint32_t n_kv(const llama_kv_cache_context * m) { return m->n_kv; }
};

// upstream's private members, as SparQ reaches them
using upstream = llama_sparq_access;

// SparQ's own transfers between the host and a backend's memory, and its synchronisations: every one
// goes through these, so that llama_sparq_debug_graph_io counts them (a decode step must make none;
// on a GPU each is a copy or a wait of the host). Process-wide.
extern std::atomic<uint64_t> sparq_n_transfers;
inline void sparq_tensor_get(const ggml_tensor * t, void * data, size_t off, size_t n) {
    sparq_n_transfers++;
    ggml_backend_tensor_get(t, data, off, n);
}
inline void sparq_tensor_set(ggml_tensor * t, const void * data, size_t off, size_t n) {
    sparq_n_transfers++;
    ggml_backend_tensor_set(t, data, off, n);
}
inline void sparq_tensor_memset(ggml_tensor * t, uint8_t value, size_t off, size_t n) {
    sparq_n_transfers++;
    ggml_backend_tensor_memset(t, value, off, n);
}
inline void sparq_backend_sync(ggml_backend_t backend) {
    sparq_n_transfers++;
    ggml_backend_synchronize(backend);
}
inline void sparq_llama_sync(llama_context * ctx) {
    sparq_n_transfers++;
    llama_synchronize(ctx);
}

// one unit of the per-(layer, KV head) work of the index training and the basis calibration
struct sparq_head_job {
    size_t ikv;
    int64_t h;
};

// ---------------------------------------------------------------------------
// shared helpers
// ---------------------------------------------------------------------------

// one element of an f16 or f32 tensor row, or of an e5m2 K^T (i8), as f32 (inline: the rebuild's and
// training's loops use it)
inline float sparq_elem_f32(const uint8_t * p, ggml_type t) {
    if (t == GGML_TYPE_I8) {
        return ggml_fp16_to_fp32(ggml_sparq_e5m2_to_f16(*p));
    }
    return t == GGML_TYPE_F16 ? ggml_fp16_to_fp32(*(const ggml_fp16_t *) p) : *(const float *) p;
}

// element o of a K^T row of type t set to x (e5m2: x rounded to f16, then to e5m2, as the appends do)
inline void sparq_kt_put(uint8_t * row, ggml_type t, size_t o, float x) {
    if (t == GGML_TYPE_I8) {
        row[o] = ggml_sparq_f16_to_e5m2(ggml_fp32_to_fp16(x));
    } else if (t == GGML_TYPE_F16) {
        ((ggml_fp16_t *) row)[o] = ggml_fp32_to_fp16(x);
    } else {
        ((float *) row)[o] = x;
    }
}

// r's default for head size d: d / 4 with a 16-bit K^T; 5 d / 16 (rounded) with an 8-bit one, whose
// step 1 then kept the approximate top-k's recall of f16 at d / 4 on SmolLM2 (the rounding to e5m2
// costs what the extra components give back) for 5/8 of its bytes (bench/coverage.py --kt-formats)
inline int32_t sparq_default_r(int64_t d, int32_t kt_bits) {
    return (int32_t) std::max<int64_t>(1, kt_bits == 8 ? (5 * d + 8) / 16 : d / 4);
}

// K^T's type for a K cache of type k with kt_bits bits: e5m2 in i8 for 8, else the cache's (f16 for
// a quantized cache: its keys dequantized)
inline ggml_type sparq_kt_type(ggml_type k, int32_t kt_bits) {
    if (kt_bits == 8) {
        return GGML_TYPE_I8;
    }
    return ggml_is_quantized(k) ? GGML_TYPE_F16 : k;
}

// n values of a cache row (f32, f16, or quantized blocks: dequantized) as f32 into out; a
// quantized row starts at a block (the offset of value i is ggml_row_size(t, i))
inline void sparq_row_f32(const void * row, ggml_type t, int64_t n, float * out) {
    if (t == GGML_TYPE_F32) {
        memcpy(out, row, (size_t) n * sizeof(float));
    } else {
        ggml_get_type_traits(t)->to_float(row, out, n);
    }
}

// llama-sparq-api.cpp: names, messages
extern const char * const sparq_reason_names[LLAMA_SPARQ_DENSE_COUNT]; // llama_sparq_dense_reason_name's
extern const char * const sparq_reason_text[LLAMA_SPARQ_DENSE_COUNT];  // for the log: why a call ran dense
// llama-sparq-stats.cpp: the counters' compression (the SparQ calls'); holds no lock (callers hold
// S.stats.mtx)
double sparq_compression(const llama_sparq_ctx & S);
// printf into err (up to n bytes; nothing when err is NULL or n is 0)
void sparq_err(char * err, size_t n, const char * fmt, ...);

// llama-sparq-buffers.cpp: the cache, the data's tensors and buffers
llama_kv_cache * sparq_find_cache(llama_memory_t mem);
// allocate the tensors of each buffer type in one zeroed buffer (kept in bufs, counted as SparQ's memory)
bool sparq_alloc_buffers(llama_sparq_ctx & S, const std::map<ggml_backend_buffer_type_t, std::vector<ggml_tensor *>> & by_buft,
                         std::vector<ggml_backend_buffer_ptr> & bufs, const char * what, char * err, size_t err_size);
// allocate K^T (of kt_bits) and the V sums for the layers of the cache that can use them
bool sparq_alloc(llama_sparq_ctx & S, const llama_model & model, int32_t kt_bits, char * err, size_t err_size);
// K^T of every SparQ layer again, of kt_bits' type (the old one freed; the caller has the streams rebuilt)
bool sparq_alloc_kt(llama_sparq_ctx & S, int32_t kt_bits, char * err, size_t err_size);
// the device windows' length for settings p (k_min resolved): the local window l where the selector's
// window is the l most recent cells, else 0 (the streaming selector's sinks come with the host's input)
int32_t sparq_window_cap(const llama_sparq_params & p);
// every SparQ layer's device window of cap entries per stream (none for 0), the old ones freed; every
// stream's window to be uploaded before its next use
bool sparq_alloc_win(llama_sparq_ctx & S, int32_t cap, char * err, size_t err_size);
// the cells of sequence seq's n most recent positions at or before pos in a stream, most recent first,
// -1 after them (the op's local window)
void sparq_recent_cells(const llama_kv_cells & cells, llama_seq_id seq, llama_pos pos, int32_t * dst, int64_t n);
// where the host reads each layer's report (sparq_report_entries), every entry SPARQ_REPORT_TAKEN
void sparq_alloc_reports(llama_sparq_ctx & S);
// what one layer or attention call brings that the model alone does not say: its graph inputs (NULL:
// none) and its head sizes
struct sparq_attn_call {
    const ggml_tensor * kq_b = nullptr;  // a bias added to the attention scores
    const ggml_tensor * sinks = nullptr; // attention sinks
    const ggml_tensor * v_mla = nullptr; // MLA's V projection
    int64_t dk = 0, dv = 0;              // K's and V's head sizes
    int64_t n_head_kv = 0, k_row = 0;    // with n_head_kv > 0: a K cache row holds n_head_kv heads of dk (k_row values)
};
// the attention variant SparQ does not compute (soft-capping, ALiBi, sinks, MLA, a KQ bias, V's head size
// unlike K's), as a phrase for the log, or NULL: of the model alone (call NULL), or of one layer or call
const char * sparq_attn_variant(llm_arch arch, const llama_hparams & hp, const sparq_attn_call * call);
// bytes [off, off + n) of a tensor, on the host
std::vector<uint8_t> sparq_get_slice(ggml_tensor * t, size_t off, size_t n);
// the PCA basis back to the identity (unit spread), not calibrated
void sparq_basis_reset(llama_sparq_ctx & S);
// allocate the PCA basis tensors (identity, unit spread) next to each layer's K^T
bool sparq_alloc_basis(llama_sparq_ctx & S, char * err, size_t err_size);
// the index selector's tensors for n_list lists (again when the count changes); every stream untrained
bool sparq_alloc_index(llama_sparq_ctx & S, int32_t n_list, char * err, size_t err_size);
// the h2o selector's scores (once; zero: no attention received yet)
bool sparq_alloc_h2o(llama_sparq_ctx & S, char * err, size_t err_size);
// one job per KV head of every layer whose tensor tensor_of(layer) is allocated (its ne[2] is the KV head count)
std::vector<sparq_head_job> sparq_head_jobs(const llama_sparq_ctx & S,
                                             const ggml_tensor * (*tensor_of)(const sparq_layer &));

// llama-sparq-index.cpp: the index selector's k-means training of one stream
void sparq_train_index(llama_sparq_ctx & S, uint32_t strm, const std::vector<uint32_t> & skip, uint32_t n_used,
                       bool assign_all = false);

// llama-sparq-basis.cpp: the PCA (rotate) or scaled basis calibrated on the cache's keys
void sparq_calibrate(llama_sparq_ctx & S, bool rotate, const std::vector<std::vector<uint32_t>> & skip);

// llama-sparq-stats.cpp: the index calls' counted reads into the counters (the caller holds S.stats.mtx)
void sparq_count_index_reads(llama_sparq_ctx & S);
// llama-sparq-coverage.cpp: the last execution's reports into the counters, the guard's warning
// (the caller holds S.stats.mtx); the reports and the guard's state cleared (new settings or a reset)
void sparq_count_reports(llama_sparq_ctx & S);
void sparq_coverage_reset(llama_sparq_ctx & S);

// llama-sparq-rebuild-host.cpp: K^T and the sums of one stream recomputed (or, with check, compared)
double sparq_rebuild_stream(llama_sparq_ctx & S, uint32_t strm, const std::vector<uint32_t> & skip, bool check = false);

// llama-sparq-rebuild-device.cpp: the same on the device holding the cache; false where it does not apply.
// allow_host: host memory counts as a device too (the CPU backend; llama_sparq_debug_graph_rebuild)
bool sparq_rebuild_stream_device(llama_sparq_ctx & S, uint32_t strm, const std::vector<uint32_t> & skip, bool allow_host);

// llama-sparq-upkeep.cpp: stream currency, the rebuild counter, the selectors' per-cell data on a rebuild
// whether the stream's data is current for its cells as they are now
bool sparq_stream_current(const llama_sparq_ctx & S, uint32_t strm);
void sparq_wait_written(const ggml_tensor * t); // the writes queued to t processed where it lives (RPC)
void sparq_count_rebuild(llama_sparq_ctx & S); // counters.n_rebuilds++ (takes S.stats.mtx)
// H2O's scores and the index's list ids of one stream after its cells changed (skip: the cells the ubatch writes)
void sparq_selector_rebuild(llama_sparq_ctx & S, uint32_t strm, const std::vector<uint32_t> & skip);
// the index of one stream trained again (sparq_train_index), counted in n_index_trainings
void sparq_retrain_index(llama_sparq_ctx & S, uint32_t strm, const std::vector<uint32_t> & skip, uint32_t n_used,
                         bool assign_all);
