// llama-sparq: the fork's C API beyond upstream llama.h.
//
// SparQ attention (see docs/algorithm.md) is switched on per context after the
// context exists, so llama_context_params keeps upstream's layout:
//
//     struct llama_sparq_params p = llama_sparq_default_params();
//     p.enabled = true; p.r = 16; p.k = 128;
//     char err[256];
//     if (llama_sparq_set_params(ctx, &p, err, sizeof(err)) != 0) { fprintf(stderr, "%s\n", err); }
//
// Decode steps of full-attention layers then run GGML_OP_SPARQ_ATTN; everything
// else stays dense, and every dense fallback is counted with its reason.
#pragma once

#include "llama.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// The Python package binds the declarations between the two "cffi:" marker lines with cffi,
// from this file as installed with it (bindings/): keep that region plain C (no other
// preprocessor lines than `#define NAME <integer>` and the settings' expansion in struct
// llama_sparq_params, which the bindings expand from the same file; LLAMA_API is dropped;
// llama.h's types are used through pointers only: struct llama_context,
// ggml_backend_sched_eval_callback).
// ---- cffi: begin ----

// Bumped whenever a struct or function of this header changes incompatibly (a row added to
// llama-sparq-settings.def included). Written here only: the library's version string and the
// Python package (which refuses a library whose ABI differs from its header's) read it here.
#define LLAMA_SPARQ_ABI_VERSION 14

// "llama-sparq <version> abi <n> llama.cpp <commit>" (also declared in llama.h by patch 0001)
LLAMA_API const char * llama_sparq_version(void);

// The ABI number alone.
LLAMA_API int llama_sparq_abi_version(void);

// Why an attention call ran dense while SparQ was enabled.
enum llama_sparq_dense_reason {
    LLAMA_SPARQ_DENSE_PREFILL       = 0, // several query rows per sequence (prompt processing)
    LLAMA_SPARQ_DENSE_SHORT         = 1, // the sequence holds fewer cells than the dense threshold (min_kv)
    LLAMA_SPARQ_DENSE_SWA           = 2, // sliding-window layer (reads little already)
    LLAMA_SPARQ_DENSE_CACHE_TYPE    = 3, // K or V cache neither f16 nor f32 (quantized)
    LLAMA_SPARQ_DENSE_V_TRANS       = 4, // V cache transposed (context made without flash attention)
    LLAMA_SPARQ_DENSE_SHARED_STREAM = 5, // several sequences share one KV stream (unified KV cache)
    LLAMA_SPARQ_DENSE_ATTN_VARIANT  = 6, // an attention variant the op does not compute (a bad soft-cap, ...)
    LLAMA_SPARQ_DENSE_NO_CACHE      = 7, // attention without the KV cache (training, encoder)
    LLAMA_SPARQ_DENSE_COUNT         = 8,
};

// How the cells a decode step attends over are chosen: what each selector does, takes and needs is
// in the settings table's `selector` row (llama-sparq-settings.def), what the op does with it in
// ggml-sparq.h (enum ggml_sparq_selector, numbered alike).
enum llama_sparq_selector {
    LLAMA_SPARQ_SELECTOR_SPARQ     = 0,
    LLAMA_SPARQ_SELECTOR_ORACLE    = 1,
    LLAMA_SPARQ_SELECTOR_STREAMING = 2,
    LLAMA_SPARQ_SELECTOR_H2O       = 3,
    LLAMA_SPARQ_SELECTOR_INDEX     = 4,
    LLAMA_SPARQ_SELECTOR_COUNT     = 5,
};

// Which query heads of a GQA group choose together.
enum llama_sparq_gqa {
    LLAMA_SPARQ_GQA_SHARED   = 0, // one choice per KV head from the group's summed scores (the paper)
    LLAMA_SPARQ_GQA_PER_HEAD = 1, // each query head chooses k - l cells; the group attends over their union
    LLAMA_SPARQ_GQA_COUNT    = 2,
};

// The basis of the approximate scores (steps 1-2) and how step 1 ranks its components.
enum llama_sparq_basis {
    LLAMA_SPARQ_BASIS_MODEL  = 0, // the keys' own components ranked by |q| (the paper)
    LLAMA_SPARQ_BASIS_SCALED = 1, // the keys' own components ranked by |q| times the keys' RMS along them
                                  // (calibrated on the cache's keys at the first SparQ step); K^T unchanged
    LLAMA_SPARQ_BASIS_PCA    = 2, // per layer and KV head, the principal axes of the keys (calibrated likewise):
                                  // K^T is stored in that basis, q is rotated per step (q.k unchanged), and
                                  // the axes are ranked by |q'| times the keys' RMS along them
    LLAMA_SPARQ_BASIS_COUNT  = 3,
};

// The settings: one field per row of llama-sparq-settings.def, in its order (type, name, default,
// range and meaning there). Python's cffi bindings expand the same rows (bindings/cdef.py).
struct llama_sparq_params {
    size_t size; // sizeof(struct llama_sparq_params): set by llama_sparq_default_params()
#define LLAMA_SPARQ_SETTING(type, name, ...) type name;
#include "llama-sparq-settings.def"
};

struct llama_sparq_stats {
    size_t   size;                              // sizeof(struct llama_sparq_stats), set by the caller
    uint64_t n_sparq;                           // attention calls (layer x ubatch) run with SparQ
    uint64_t n_dense[LLAMA_SPARQ_DENSE_COUNT];  // dense calls while enabled, by reason
    double   compression;                       // mean cost-model compression M_sparq / M_dense of the SparQ calls
                                                // (a selector whose op reports the keys it read: with that count,
                                                // once the step has run; its estimate until then)
    uint64_t n_rebuilds;                        // rebuilds of K^T and the V sums after cache changes
    uint64_t extra_bytes;                       // memory taken by K^T and the V sums
    uint64_t kv_bytes;                          // the KV cache's K and V of the layers that have K^T
    int32_t  n_layers;                          // layers with SparQ data (full-attention layers of the cache)
    uint64_t n_sparq_device;                    // of n_sparq: calls whose op ran on a GPU or an RPC host (a non-CPU device):
                                                // its K^T is in that device's memory and the device supports the node
    // What the CPU op reported of its choice (the selectors that rank scores; per call, KV head and
    // stream, the stream's last query row), over the calls it reported (n_measured):
    uint64_t n_measured;
    double   mean_k;                            // cells attended (calibrated: chosen per step)
    double   coverage;                          // their estimated share of the attention mass (step 2's softmax)
    double   coverage_min;                      // the lowest of the layers' mean coverage (-1: none measured)
    int32_t  coverage_min_layer;                // that layer (-1: none)
    double   k_reach;                           // cells reaching the coverage target on that layer (window
                                                // included; the mean of its measured calls, -1: not measured)
};

// One layer's share of the counters (llama_sparq_get_layer_stats).
struct llama_sparq_layer_stats {
    size_t   size;        // sizeof(struct llama_sparq_layer_stats), set by the caller
    int32_t  layer;       // the model's layer index
    uint64_t n_measured;  // calls the op reported (CPU op, the selectors that rank scores)
    double   mean_k;      // cells attended per KV head and step
    double   coverage;    // their estimated share of the attention mass
    double   k_reach;     // cells reaching the coverage target (window included; -1: not measured)
    double   reached;     // share of the reports whose ranked cells reached the target
    double   compression; // the cost-model compression of the reported calls
};

LLAMA_API struct llama_sparq_params llama_sparq_default_params(void);

// The most KV cells per stream a context with SparQ may have: the op takes the count of
// valid cells (for the mean of V) as an f32, exact up to 2^24. Upstream does not bound the
// cache size that low, so llama_sparq_set_params refuses larger caches (-2).
#define LLAMA_SPARQ_MAX_CELLS 16777216 // 2^24

// The dense threshold that min_kv = -1 (the default) stands for, by where the cache is: below it
// SparQ is not faster than dense attention there. Host memory (and RPC hosts, which run the CPU op):
// the CPU crossover. A GPU with a fixed k: the first length measured where SparQ beat dense flash
// attention on an H200 at batch 1 (0.96x at 32K, 1.09x at 64K, 1.32x at 128K on the paper's shape,
// gpu_h200_28215da_b1.md, archived: scripts/results_archive.py fetch restores it). A GPU with the
// calibrated k: past every length measured, since no real model has been timed with it on a GPU,
// nor its diffuse units (a quarter of the cells each, through the op's list path)
#define LLAMA_SPARQ_MIN_KV_HOST 1024
#define LLAMA_SPARQ_MIN_KV_DEVICE 65536
#define LLAMA_SPARQ_MIN_KV_DEVICE_CALIBRATED 1048576

// k_min = 0: the calibrated k's floor by the cache's type. A q8_0 cell costs half the bytes of an
// f16 one, so the same bytes buy twice the cells: on Gemma 3 270M with a q8_0 cache 128 lost a
// needle at 16K that dense and the f16 cache keep, and 256 kept it, while 256 on an f16 cache
// raised SmolLM2's compression by 0.03 at equal answers (bench/README.md, "A q8_0 cache")
#define LLAMA_SPARQ_K_MIN_F16 128
#define LLAMA_SPARQ_K_MIN_QUANTIZED 256

// Validates the settings without a context, as llama_sparq_set_params does before it applies
// them (same messages): for front ends that check a configuration before loading its model.
// head_size > 0 bounds r (the smallest head size of the model's full-attention layers); <= 0:
// r is left to llama_sparq_set_params. Returns 0, or -1 with the message in err.
LLAMA_API int32_t llama_sparq_check_params(const struct llama_sparq_params * params, int32_t head_size, char * err,
                                           size_t err_size);

// Validates and applies the settings; changing them invalidates graph reuse.
// Returns 0 on success; -1 for an invalid value (err names the parameter and the
// allowed range); -2 when the context cannot run SparQ at all (err says why).
LLAMA_API int32_t llama_sparq_set_params(struct llama_context * ctx, const struct llama_sparq_params * params,
                                         char * err, size_t err_size);

// The current settings (defaults when never set). Returns 0, or -1 on a size mismatch.
LLAMA_API int32_t llama_sparq_get_params(const struct llama_context * ctx, struct llama_sparq_params * out);

// Counters since the context was made or the last reset. Returns 0, or -1 on a size mismatch.
LLAMA_API int32_t llama_sparq_get_stats(const struct llama_context * ctx, struct llama_sparq_stats * out);
LLAMA_API void    llama_sparq_reset_stats(struct llama_context * ctx);

// Layer i (0 .. n_layers - 1 of llama_sparq_stats: the layers with SparQ data, in model order) of the
// counters. Returns 0, or -1 on a size mismatch or i out of range.
LLAMA_API int32_t llama_sparq_get_layer_stats(const struct llama_context * ctx, int32_t i,
                                              struct llama_sparq_layer_stats * out);

// Brings K^T and the V sums up to date now (after a state load, say) instead of at the
// next decode step: first applies the cache's pending updates (the deferred K-shift of
// seq_add / seq_div, stream copies), as the next decode would, then rebuilds every stream
// whose cells changed, and each selector's own data (a vector index retrained where it needs it,
// every used cell in its list). A no-op when everything is current or SparQ is off.
LLAMA_API void llama_sparq_sync(struct llama_context * ctx);

// For tests and diagnosis: the largest absolute difference between the K^T / V-sum data
// SparQ keeps and a recomputation from K, V and the cells, over the layers and the streams
// whose data is current (0 when none is); -1 when SparQ has no data. A stream whose cells
// changed since its data was last brought up to date is rebuilt before its next use and is
// not compared: call llama_sparq_sync first (or after a decode step) to compare every stream.
// A local window kept on the device that differs from the host's computation, for a stream whose
// window the host holds exact, counts its differing entries (so any such difference fails a check).
LLAMA_API double llama_sparq_debug_check(struct llama_context * ctx);

// For tests without a GPU: on, the rebuilds of a cache in host memory run as the ggml graph that
// rebuilds a cache on a device (K^T and the sums in f32 products, on the CPU backend) instead of the
// host's threads. Returns 0, or -1 before SparQ was first enabled on the context.
LLAMA_API int32_t llama_sparq_debug_graph_rebuild(struct llama_context * ctx, bool on);

// For benchmarks only: fills sequence 0 of an empty KV cache with n_tokens cells at
// positions 0..n_tokens-1 holding pseudo-random K and V (zero mean, unit variance, fixed by
// seed) instead of running a prompt, so that decode can be timed after a long context
// without its prefill. The text it stands for is meaningless: use it for timing, never
// for output. Needs one KV cache with one stream (a sliding-window model's window cache gets
// the last positions it holds) and a cache type SparQ reads; not hybrid or recurrent models.
// Returns 0, or -1 with err saying why.
LLAMA_API int32_t llama_sparq_bench_fill(struct llama_context * ctx, int32_t n_tokens, uint32_t seed, char * err,
                                         size_t err_size);

// For tests without a GPU: what one computation of the context's last graph moves between the host
// and a device when its nodes run there (ggml's scheduler copies every graph input a device node
// reads, each a host-to-device copy after a stream synchronisation), and SparQ's own transfers.
// Counted on the graph as built for a CPU-only context (on a GPU context the scheduler has redirected
// the nodes' sources to its copies by then).
struct llama_sparq_graph_io {
    size_t   size;              // sizeof(struct llama_sparq_graph_io), set by the caller
    int32_t  n_inputs;          // graph inputs the nodes read (a view of an input counts apart: it is copied apart)
    int32_t  n_inputs_sparq;    // of those, SparQ's own (named sparq*)
    uint64_t input_bytes;       // their bytes
    uint64_t input_bytes_sparq;
    int32_t  n_nodes;           // the graph's nodes other than views (a kernel launch each on a GPU, before fusion)
    int32_t  n_nodes_sparq;     // of those, GGML_OP_SPARQ_ATTN nodes (the op and its write modes)
    uint64_t n_transfers;       // SparQ's own tensor reads, writes, memsets and synchronisations since the process
                                // started (upkeep, rebuilds, counters): a decode step in steady state adds none
};

// Fills out for the last graph the context computed. Returns 0, -1 on a size mismatch, -2 before a graph.
LLAMA_API int32_t llama_sparq_debug_graph_io(struct llama_context * ctx, struct llama_sparq_graph_io * out);

// For tests: the op's parameters (ggml-sparq-params.h's layout, GGML_MAX_OP_PARAMS bytes) that the
// settings' check puts to the devices for model layer il with the context's settings, for a decode
// step over n_kv cells (measure: the step on which a fixed k's coverage is measured). The graph builds
// its nodes from the same resolution: a test compares these with a captured node's. Returns 0, -1 when
// SparQ is off or the layer keeps no SparQ data, -2 when the settings make no valid node.
LLAMA_API int32_t llama_sparq_debug_op_params(struct llama_context * ctx, int32_t il, int32_t n_kv, bool measure,
                                              int32_t * op_params);

// For diagnosis: an eval callback on the context's graph computations (the cb_eval of
// llama_context_params, settable after the context exists); NULL removes it.
LLAMA_API void llama_sparq_debug_set_eval_callback(struct llama_context * ctx, ggml_backend_sched_eval_callback cb,
                                                   void * user_data);

// Not SparQ: a general addition to llama.cpp (ggml-sparq/fixes/llama-rpc-devices.cpp).
// The device list (llama_model_params.devices, NULL-terminated) for a model that offloads to
// the n_endpoints ggml RPC servers named in endpoints ("host:port" each) besides the devices
// llama.cpp would take by default: those servers' devices first, as llama.cpp orders RPC
// servers, then the registry's RPC devices, GPUs (integrated GPUs when there is no GPU). The
// servers are not added to ggml's registry (the tools' --rpc does that for the process), so a
// model loaded later without them does not use them. ggml's RPC backend aborts the process
// when it cannot connect to a server: the Python package checks the connections first. out
// holds max_out pointers (ggml_backend_dev_t). Returns the number of devices (the terminator
// not counted), or -1 with err saying why.
LLAMA_API int32_t llama_rpc_model_devices(const char * const * endpoints, int32_t n_endpoints, void ** out,
                                          int32_t max_out, char * err, size_t err_size);

// The names of the enums' values, as the front ends (Python, --sparq-* flags, llama-bench)
// accept and print them; NULL for a value out of range (0 .. <enum>_COUNT - 1).
// (the selectors' names: as the settings table's `selector` row lists them)
LLAMA_API const char * llama_sparq_selector_name(int32_t selector);
// "shared", "per_head"
LLAMA_API const char * llama_sparq_gqa_name(int32_t gqa);
// "model", "scaled", "pca"
LLAMA_API const char * llama_sparq_basis_name(int32_t basis);
// "prefill", "short", "swa", ...
LLAMA_API const char * llama_sparq_dense_reason_name(int32_t reason);

// ---- cffi: end ----

// A macro's value as a string literal (the settings' texts quote the limits above).
#define LLAMA_SPARQ_STR_(x) #x
#define LLAMA_SPARQ_STR(x) LLAMA_SPARQ_STR_(x)

#ifdef __cplusplus
}
#endif
