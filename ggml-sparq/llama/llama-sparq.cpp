// llama-sparq: the fork's additions to libllama: version, the SparQ C API, the
// KV-cache data SparQ needs (K^T and the V sums), and the graph hook.
//
// Data. For every full-attention layer of the KV cache with an f16/f32 cache and
// non-transposed V, a K^T tensor [kv_size, d, n_head_kv, n_stream] (the keys again,
// cell-contiguous, same type as K) and a V-sum tensor [dv, n_head_kv, n_stream] f32 with
// its Kahan compensation (same shape), allocated in the buffer type of the layer's K when
// SparQ is first enabled.
//
// Upkeep. Each ubatch appends its keys to K^T (set_rows, O(d) per token and layer)
// and adds its values to the V sums (compensated), in the graph. Every other change of the cache
// (sequence removal/copy/keep, position shifts that re-rope K, clearing, state load,
// stream copies, overwrites, anything done while SparQ was off) is detected through
// the cells' content versions (ggml-sparq/llama-sparq-cells.h, kept by llama_kv_cells
// through patch 0009): a stream's data is current while the stream's version hash
// equals the hash recorded when the data was last brought up to date, extended by the
// cells the ubatch about to run writes (O(ubatch) per step, independent of the cache
// size). A stream that is not current is rebuilt from K, V and the cells before the
// graph that uses it runs (rare operations; O(used cells * d), multi-threaded over
// layers and cell ranges). The count of valid cells is a graph input.

#include "llama-sparq.h"
#include "llama-sparq-graph.h"
#include "llama-sparq-version.h"
#include "ggml-sparq.h"

#include "llama-context.h"
#include "llama-graph.h"
#include "llama-impl.h"
#include "llama-kv-cache.h"
#include "llama-kv-cache-iswa.h"
#include "llama-memory-hybrid.h"
#include "llama-model.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <string>
#include <vector>

const char * llama_sparq_version(void) {
    return "llama-sparq " LLAMA_SPARQ_VERSION_STR " abi " LLAMA_SPARQ_ABI_STR " llama.cpp " LLAMA_SPARQ_UPSTREAM_COMMIT_STR;
}

int llama_sparq_abi_version(void) {
    static_assert(LLAMA_SPARQ_ABI_VERSION == LLAMA_SPARQ_ABI_NUM, "llama-sparq.h and CMakeLists.txt disagree on the ABI");
    return LLAMA_SPARQ_ABI_VERSION;
}

static const char * const sparq_reason_names[LLAMA_SPARQ_DENSE_COUNT] = {
    "prefill", "short", "swa", "cache_type", "v_trans", "shared_stream", "attn_variant", "no_cache",
};

static const char * const sparq_reason_text[LLAMA_SPARQ_DENSE_COUNT] = {
    "several query rows per sequence (prompt processing)",
    "fewer KV cells than the dense threshold",
    "sliding-window layer",
    "K or V cache is not f16/f32",
    "V cache is transposed (make the context with flash attention on or auto)",
    "several sequences share one KV stream (unified KV cache; use one stream per sequence)",
    "ALiBi, soft-capping, attention sinks, KQ bias, MLA or differing K/V head sizes",
    "attention without the KV cache",
};

const char * llama_sparq_dense_reason_name(int32_t reason) {
    return reason >= 0 && reason < LLAMA_SPARQ_DENSE_COUNT ? sparq_reason_names[reason] : nullptr;
}

struct llama_sparq_params llama_sparq_default_params(void) {
    llama_sparq_params p;
    memset(&p, 0, sizeof(p));
    p.size     = sizeof(p);
    p.enabled  = false;
    p.r        = 0;
    p.k        = 128;
    p.l        = -1;
    p.min_kv   = 1024;
    p.all_rows = false;
    p.selector = LLAMA_SPARQ_SELECTOR_SPARQ;
    p.gqa      = LLAMA_SPARQ_GQA_SHARED;
    p.mean_v   = true;
    p.basis    = LLAMA_SPARQ_BASIS_SCALED; // keeps Gemma 3's answers where the paper's ranking loses them (README "Accuracy")
    p.index_lists = 256;
    p.index_probe = 16;
    return p;
}

// the names of the enums' values: the one list the front ends (Python, the flags, llama-bench) use
static const char * const sparq_selector_names[LLAMA_SPARQ_SELECTOR_COUNT] = { "sparq", "oracle", "streaming", "h2o", "index" };
static const char * const sparq_gqa_names[LLAMA_SPARQ_GQA_COUNT] = { "shared", "per_head" };
static const char * const sparq_basis_names[LLAMA_SPARQ_BASIS_COUNT] = { "model", "scaled", "pca" };

const char * llama_sparq_selector_name(int32_t selector) {
    return selector >= 0 && selector < LLAMA_SPARQ_SELECTOR_COUNT ? sparq_selector_names[selector] : nullptr;
}

const char * llama_sparq_gqa_name(int32_t gqa) {
    return gqa >= 0 && gqa < LLAMA_SPARQ_GQA_COUNT ? sparq_gqa_names[gqa] : nullptr;
}

const char * llama_sparq_basis_name(int32_t basis) {
    return basis >= 0 && basis < LLAMA_SPARQ_BASIS_COUNT ? sparq_basis_names[basis] : nullptr;
}

// "0 (sparq), 1 (oracle)": the allowed values of an enum setting, for the error messages
static std::string sparq_allowed_names(const char * const * names, int n) {
    std::string s;
    for (int i = 0; i < n; ++i) {
        s += (i ? ", " : "") + std::to_string(i) + " (" + names[i] + ")";
    }
    return s;
}


// ---------------------------------------------------------------------------
// per-context state
// ---------------------------------------------------------------------------

struct sparq_layer {
    ggml_tensor * kt   = nullptr; // [kv_size, d, n_head_kv, n_stream]
    ggml_tensor * vsum = nullptr; // [dv, n_head_kv, n_stream] f32
    ggml_tensor * ksq  = nullptr; // [d, n_head_kv, n_stream] f32: the sum of k^2 per component (the scaled basis)
    // the V sums' compensation (Kahan summation of the appends; vsum - vcomp is the exact sum to
    // about one rounding): [dv, n_head_kv, n_stream] f32
    ggml_tensor * vcomp = nullptr;
    // the H2O selector's accumulated attention per cell: [kv_size, n_head_kv, n_stream] f32
    ggml_tensor * h2o = nullptr;
    // the index selector (allocated on first use): centroids [d, n_list, n_head_kv, n_stream] f32 and
    // each cell's list [kv_size, n_head_kv, n_stream] f32 (-1: not assigned yet; the op assigns it)
    ggml_tensor * ivf_cent = nullptr;
    ggml_tensor * ivf_list = nullptr;
    int reason = -1;              // >= 0: no data for this layer, why
    // the PCA basis (LLAMA_SPARQ_BASIS_PCA): rot [d, d, n_head_kv] f32, rot[j + d*(m + d*h)] =
    // component j of axis m of KV head h; spread [d, n_head_kv] f32, the keys' RMS along each axis
    ggml_tensor * rot = nullptr;
    ggml_tensor * spread = nullptr;
    std::vector<float> rot_host;  // the same, on the host (rebuilds rotate with it); empty: identity
};

// per stream: whether K^T and the V sums equal a recomputation for the cells whose
// version hash was `hash` (the stream's hash when the data was last brought up to date)
struct sparq_stream_state {
    bool valid = false;
    uint64_t hash = 0;
};

struct llama_sparq_ctx {
    llama_sparq_params params = llama_sparq_default_params();

    llama_context * lctx = nullptr;         // the context owning this (for its thread count)
    llama_kv_cache * kv = nullptr;          // the full-attention cache
    std::vector<sparq_layer> layers;        // by KV-cache layer index
    std::vector<sparq_stream_state> streams; // by stream
    ggml_context_ptr ctx;
    std::vector<ggml_backend_buffer_ptr> bufs;
    uint64_t extra_bytes = 0;
    uint64_t kv_bytes = 0;
    int32_t n_layers = 0;

    // counters: written by the decoding thread in set_input, read by llama_sparq_get_stats
    // from any thread (llama-server's HTTP threads), so every access holds mtx
    mutable std::mutex mtx;
    uint64_t n_sparq = 0;
    uint64_t n_sparq_device = 0; // of n_sparq: the op ran on a non-CPU device (ggml-sparq/sparq-cuda.cu)
    bool logged_host_fallback = false;
    uint64_t n_dense[LLAMA_SPARQ_DENSE_COUNT] = {};
    double   compression_sum = 0.0;
    uint64_t n_rebuilds = 0;
    uint64_t n_index_trainings = 0; // the index selector's k-means runs (logged at exit)
    // the index selector's counted reads: the last execution's index calls, whose cost-model estimate
    // (even lists) is replaced by what the op reported once that execution has run
    struct ivf_pending_call {
        int32_t ikv;
        uint32_t s0, n_stream; // the call's streams (contiguous, as the graph's views take them)
        double S, md, ms, d, est_per_cell; // est_per_cell: the estimate's key elements per cell (d p / C)
    };
    std::vector<ivf_pending_call> ivf_pending;
    uint64_t n_index_measured = 0; // index calls whose reads were counted (the rest: the estimate)
    uint32_t logged = 0; // reasons already logged

    // the context's batch (which sequences bring several tokens to the current llama_decode)
    const llama_batch_allocr * balloc = nullptr;

    // the PCA basis: tensors allocated on first use, calibrated at the first SparQ step
    std::vector<ggml_backend_buffer_ptr> basis_bufs;
    ggml_context_ptr basis_ctx;
    bool calibrated = false;

    // the index selector: its tensors, their list count, and per stream the used cells its index
    // was trained on (0: not trained; trained again once the stream has doubled)
    std::vector<ggml_backend_buffer_ptr> ivf_bufs;
    ggml_context_ptr ivf_ctx;
    int32_t ivf_n_list = 0;
    std::vector<uint32_t> ivf_trained;
    int32_t basis_in_data = LLAMA_SPARQ_BASIS_MODEL; // the basis K^T was last built in

    ~llama_sparq_ctx();
};

// the friend of llama_context, llama_kv_cache and llama_kv_cache_context (patch 0005)
struct llama_sparq_access {
    static llama_cparams & cparams(llama_context * c) { return c->cparams; }
    static const llama_batch_allocr * balloc(llama_context * c) { return c->balloc.get(); }
    static void need_reserve(llama_context * c) { c->sched_need_reserve = true; }
    static const llama_model & model(const llama_context * c) { return c->model; }
    static const std::vector<ggml_backend_ptr> & backends(llama_context * c) { return c->backends; }

    static uint32_t kv_size(const llama_kv_cache * kv) { return kv->get_size(); }
    static uint32_t n_stream(const llama_kv_cache * kv) { return kv->n_stream; }
    static bool v_trans(const llama_kv_cache * kv) { return kv->v_trans; }
    static size_t n_layers(const llama_kv_cache * kv) { return kv->layers.size(); }
    static uint32_t layer_il(const llama_kv_cache * kv, size_t ikv) { return kv->layers[ikv].il; }
    static ggml_tensor * layer_k(const llama_kv_cache * kv, size_t ikv) { return kv->layers[ikv].k; }
    static ggml_tensor * layer_v(const llama_kv_cache * kv, size_t ikv) { return kv->layers[ikv].v; }
    static int32_t ikv_of(const llama_kv_cache * kv, int32_t il) {
        auto it = kv->map_layer_ids.find(il);
        return it == kv->map_layer_ids.end() ? -1 : it->second;
    }
    static const llama_kv_cells & cells(const llama_kv_cache * kv, uint32_t strm) { return kv->v_cells[strm]; }
    // the cells' content versions (patch 0009, ggml-sparq/llama-sparq-cells.h)
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

using A = llama_sparq_access;

static void sparq_err(char * err, size_t n, const char * fmt, ...) {
    if (!err || n == 0) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
}

static llama_kv_cache * sparq_find_cache(llama_memory_t mem) {
    if (auto * kv = dynamic_cast<llama_kv_cache *>(mem)) {
        return kv;
    }
    if (auto * iswa = dynamic_cast<llama_kv_cache_iswa *>(mem)) {
        return iswa->get_base();
    }
    if (auto * hyb = dynamic_cast<llama_memory_hybrid *>(mem)) {
        return hyb->get_mem_attn();
    }
    return nullptr;
}

static bool sparq_cache_type_ok(ggml_type t) {
    return t == GGML_TYPE_F16 || t == GGML_TYPE_F32;
}

// allocate the tensors of each buffer type in one zeroed buffer (kept in bufs, counted as SparQ's memory)
static bool sparq_alloc_buffers(llama_sparq_ctx & S,
                                const std::map<ggml_backend_buffer_type_t, std::vector<ggml_tensor *>> & by_buft,
                                std::vector<ggml_backend_buffer_ptr> & bufs, const char * what, char * err,
                                size_t err_size) {
    for (const auto & [buft, tensors] : by_buft) {
        size_t total = 0;
        for (ggml_tensor * t : tensors) {
            total += GGML_PAD(ggml_backend_buft_get_alloc_size(buft, t), ggml_backend_buft_get_alignment(buft));
        }
        ggml_backend_buffer_t buf = ggml_backend_buft_alloc_buffer(buft, total + ggml_backend_buft_get_alignment(buft));
        if (!buf) {
            sparq_err(err, err_size, "SparQ: cannot allocate %.1f MiB for %s in %s", total / 1048576.0, what,
                      ggml_backend_buft_name(buft));
            return false;
        }
        ggml_tallocr ta = ggml_tallocr_new(buf);
        for (ggml_tensor * t : tensors) {
            ggml_tallocr_alloc(&ta, t);
        }
        ggml_backend_buffer_clear(buf, 0);
        ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
        S.extra_bytes += ggml_backend_buffer_get_size(buf);
        bufs.emplace_back(buf);
    }
    return true;
}

// allocate K^T and the V sums for the layers of the cache that can use them
static bool sparq_alloc(llama_sparq_ctx & S, const llama_model & model, char * err, size_t err_size) {
    const llama_kv_cache * kv = S.kv;
    const uint32_t kv_size = A::kv_size(kv), n_stream = A::n_stream(kv);
    const size_t nl = A::n_layers(kv);
    S.layers.assign(nl, sparq_layer());
    S.streams.assign(n_stream, sparq_stream_state());

    ggml_init_params ip = { (nl * 5 + 1) * ggml_tensor_overhead(), nullptr, true };
    S.ctx.reset(ggml_init(ip));
    std::map<ggml_backend_buffer_type_t, std::vector<ggml_tensor *>> by_buft;
    for (size_t ikv = 0; ikv < nl; ++ikv) {
        const uint32_t il = A::layer_il(kv, ikv);
        ggml_tensor * k = A::layer_k(kv, ikv);
        ggml_tensor * v = A::layer_v(kv, ikv);
        sparq_layer & L = S.layers[ikv];
        if (model.hparams.is_swa(il)) {
            L.reason = LLAMA_SPARQ_DENSE_SWA;
            continue;
        }
        if (!sparq_cache_type_ok(k->type) || !sparq_cache_type_ok(v->type)) {
            L.reason = LLAMA_SPARQ_DENSE_CACHE_TYPE;
            continue;
        }
        if (A::v_trans(kv)) {
            L.reason = LLAMA_SPARQ_DENSE_V_TRANS;
            continue;
        }
        const int64_t dk = model.hparams.n_embd_head_k(il), dv = model.hparams.n_embd_head_v(il);
        const int64_t hkv = model.hparams.n_head_kv(il);
        if (dk != dv || dk * hkv != k->ne[0]) {
            L.reason = LLAMA_SPARQ_DENSE_ATTN_VARIANT;
            continue;
        }
        L.kt = ggml_new_tensor_4d(S.ctx.get(), k->type, kv_size, dk, hkv, n_stream);
        L.vsum = ggml_new_tensor_3d(S.ctx.get(), GGML_TYPE_F32, dv, hkv, n_stream);
        L.ksq = ggml_new_tensor_3d(S.ctx.get(), GGML_TYPE_F32, dk, hkv, n_stream);
        ggml_format_name(L.ksq, "sparq_ksq_l%u", il);
        L.vcomp = ggml_new_tensor_3d(S.ctx.get(), GGML_TYPE_F32, dv, hkv, n_stream);
        ggml_format_name(L.kt, "sparq_kt_l%u", il);
        ggml_format_name(L.vsum, "sparq_vsum_l%u", il);
        ggml_format_name(L.vcomp, "sparq_vcomp_l%u", il);
        L.h2o = ggml_new_tensor_3d(S.ctx.get(), GGML_TYPE_F32, kv_size, hkv, n_stream);
        ggml_format_name(L.h2o, "sparq_h2o_l%u", il);
        ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(k->buffer);
        by_buft[buft].push_back(L.kt);
        by_buft[buft].push_back(L.vsum);
        by_buft[buft].push_back(L.ksq);
        by_buft[buft].push_back(L.vcomp);
        by_buft[buft].push_back(L.h2o);
        S.kv_bytes += ggml_nbytes(k) + ggml_nbytes(v);
        S.n_layers++;
    }
    if (!sparq_alloc_buffers(S, by_buft, S.bufs, "K^T and the V sums", err, err_size)) {
        return false;
    }
    LLAMA_LOG_INFO("%s: SparQ data for %d of %zu KV-cache layers: K^T + V sums = %.2f MiB "
                   "(+%.0f%% of those layers' K and V, %.2f MiB)\n", __func__, S.n_layers, nl,
                   S.extra_bytes / 1048576.0, S.kv_bytes ? 100.0 * S.extra_bytes / S.kv_bytes : 0.0,
                   S.kv_bytes / 1048576.0);
    return true;
}

static std::vector<uint8_t> sparq_get_slice(ggml_tensor * t, size_t off, size_t n) {
    std::vector<uint8_t> buf(n);
    ggml_backend_tensor_get(t, buf.data(), off, n);
    return buf;
}

static float sparq_elem_f32(const uint8_t * p, ggml_type t) {
    return t == GGML_TYPE_F16 ? ggml_fp16_to_fp32(*(const ggml_fp16_t *) p) : *(const float *) p;
}

// the PCA basis back to the identity (unit spread), not calibrated
static void sparq_basis_reset(llama_sparq_ctx & S) {
    for (sparq_layer & L : S.layers) {
        if (!L.rot) {
            continue;
        }
        const int64_t d = L.rot->ne[0], hkv = L.rot->ne[2];
        std::vector<float> eye((size_t) d * d * hkv, 0.0f), one((size_t) d * hkv, 1.0f);
        for (int64_t h = 0; h < hkv; ++h) {
            for (int64_t j = 0; j < d; ++j) {
                eye[(size_t) (h * d + j) * d + j] = 1.0f;
            }
        }
        ggml_backend_tensor_set(L.rot, eye.data(), 0, eye.size() * sizeof(float));
        ggml_backend_tensor_set(L.spread, one.data(), 0, one.size() * sizeof(float));
        L.rot_host.clear();
    }
}

// allocate the PCA basis tensors (identity, unit spread) next to each layer's K^T
static bool sparq_alloc_basis(llama_sparq_ctx & S, char * err, size_t err_size) {
    if (S.basis_ctx) {
        return true;
    }
    ggml_init_params ip = { (S.layers.size() * 2 + 1) * ggml_tensor_overhead(), nullptr, true };
    S.basis_ctx.reset(ggml_init(ip));
    std::map<ggml_backend_buffer_type_t, std::vector<ggml_tensor *>> by_buft;
    for (sparq_layer & L : S.layers) {
        if (!L.kt) {
            continue;
        }
        const int64_t d = L.kt->ne[1], hkv = L.kt->ne[2];
        L.rot = ggml_new_tensor_3d(S.basis_ctx.get(), GGML_TYPE_F32, d, d, hkv);
        L.spread = ggml_new_tensor_2d(S.basis_ctx.get(), GGML_TYPE_F32, d, hkv);
        ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(L.kt->buffer);
        by_buft[buft].push_back(L.rot);
        by_buft[buft].push_back(L.spread);
    }
    if (!sparq_alloc_buffers(S, by_buft, S.basis_bufs, "the PCA basis", err, err_size)) {
        return false;
    }
    sparq_basis_reset(S);
    return true;
}

// the index selector's tensors for n_list lists (again when the count changes); every stream untrained
static bool sparq_alloc_index(llama_sparq_ctx & S, int32_t n_list, char * err, size_t err_size) {
    if (S.ivf_ctx && S.ivf_n_list == n_list) {
        return true;
    }
    for (auto & b : S.ivf_bufs) {
        S.extra_bytes -= ggml_backend_buffer_get_size(b.get());
    }
    S.ivf_bufs.clear();
    ggml_init_params ip = { (S.layers.size() * 2 + 1) * ggml_tensor_overhead(), nullptr, true };
    S.ivf_ctx.reset(ggml_init(ip));
    std::map<ggml_backend_buffer_type_t, std::vector<ggml_tensor *>> by_buft;
    for (sparq_layer & L : S.layers) {
        L.ivf_cent = L.ivf_list = nullptr;
        if (!L.kt) {
            continue;
        }
        const int64_t kv_size = L.kt->ne[0], d = L.kt->ne[1], hkv = L.kt->ne[2], ns = L.kt->ne[3];
        // one row more than the lists: the op reports there what it read (ggml_sparq_attn_set_index_reads)
        L.ivf_cent = ggml_new_tensor_4d(S.ivf_ctx.get(), GGML_TYPE_F32, d, n_list + 1, hkv, ns);
        L.ivf_list = ggml_new_tensor_3d(S.ivf_ctx.get(), GGML_TYPE_F32, kv_size, hkv, ns);
        ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(L.kt->buffer);
        by_buft[buft].push_back(L.ivf_cent);
        by_buft[buft].push_back(L.ivf_list);
    }
    S.ivf_n_list = 0;
    {
        std::lock_guard<std::mutex> lock(S.mtx);
        S.ivf_pending.clear(); // they name the tensors replaced here
    }
    if (!sparq_alloc_buffers(S, by_buft, S.ivf_bufs, "the vector index", err, err_size)) {
        S.ivf_ctx.reset();
        return false;
    }
    S.ivf_n_list = n_list;
    S.ivf_trained.assign(S.streams.size(), 0);
    return true;
}

// The nearest of C centroids to each of the n rows of x (n x d): argmin |c|^2 - 2 x.c, ties to
// the lower index (the op's rule). centT is the centroids transposed (d x C), so the distances of
// a few rows to all centroids accumulate in vertical multiply-adds over the centroids; dist holds
// SPARQ_ASSIGN_ROWS x C floats. Training the index runs this for every used cell against every
// centroid (a 1M-cell stream of 8 KV heads against 1024 lists: 10^12 multiply-adds), so on x86-64
// with GCC it is also compiled for AVX2+FMA and AVX-512 and the loader picks the clone the CPU runs
// (libllama is otherwise built for the baseline ISA); the clones differ only in rounding.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define SPARQ_ISA_CLONES __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define SPARQ_ISA_CLONES
#endif
#define SPARQ_ASSIGN_ROWS 4
SPARQ_ISA_CLONES
static void sparq_assign(const float * x, int64_t n, const float * centT, const float * cn2, int64_t C, int64_t d,
                         int32_t * out, float * dist) {
    for (int64_t i0 = 0; i0 < n; i0 += SPARQ_ASSIGN_ROWS) {
        const int64_t nr = std::min<int64_t>(SPARQ_ASSIGN_ROWS, n - i0);
        for (int64_t i = 0; i < nr; ++i) {
            float * di = dist + i * C;
            for (int64_t c = 0; c < C; ++c) {
                di[c] = cn2[c];
            }
        }
        for (int64_t j = 0; j < d; ++j) {
            const float * cj = centT + j * C;
            for (int64_t i = 0; i < nr; ++i) {
                const float xj = -2.0f * x[(i0 + i) * d + j];
                float * di = dist + i * C;
                for (int64_t c = 0; c < C; ++c) {
                    di[c] += xj * cj[c];
                }
            }
        }
        for (int64_t i = 0; i < nr; ++i) {
            const float * di = dist + i * C;
            float best = INFINITY;
            int32_t bi = 0;
            for (int64_t c = 0; c < C; ++c) {
                if (di[c] < best) {
                    best = di[c];
                    bi = (int32_t) c;
                }
            }
            out[i0 + i] = bi;
        }
    }
}

// |c|^2 of the C centroids (C x d) and their transpose (d x C), for sparq_assign
static void sparq_centroid_prep(const float * cent, int64_t C, int64_t d, float * cn2, float * centT) {
    for (int64_t c = 0; c < C; ++c) {
        float s2 = 0.0f;
        for (int64_t j = 0; j < d; ++j) {
            s2 += cent[c * d + j] * cent[c * d + j];
            centT[j * C + c] = cent[c * d + j];
        }
        cn2[c] = s2;
    }
}

// Lloyd's k-means (L2) of the n rows of x (n x d) into C centroids, started from C rows spread
// evenly over x; a list left empty keeps its centroid
static void sparq_kmeans(const std::vector<float> & x, int64_t n, int64_t d, int64_t C, int iters, float * cent) {
    for (int64_t c = 0; c < C; ++c) {
        const int64_t i = n > 0 ? (c * n) / C : 0;
        for (int64_t j = 0; j < d; ++j) {
            cent[c * d + j] = n > 0 ? x[i * d + j] : 0.0f;
        }
    }
    if (n == 0) {
        return;
    }
    std::vector<int32_t> asg(n);
    std::vector<double> sum((size_t) C * d);
    std::vector<int64_t> cnt(C);
    std::vector<float> cn2(C), centT((size_t) d * C), dist((size_t) SPARQ_ASSIGN_ROWS * C);
    for (int it = 0; it < iters; ++it) {
        sparq_centroid_prep(cent, C, d, cn2.data(), centT.data());
        sparq_assign(x.data(), n, centT.data(), cn2.data(), C, d, asg.data(), dist.data());
        std::fill(sum.begin(), sum.end(), 0.0);
        std::fill(cnt.begin(), cnt.end(), 0);
        for (int64_t i = 0; i < n; ++i) {
            cnt[asg[i]]++;
            for (int64_t j = 0; j < d; ++j) {
                sum[(size_t) asg[i] * d + j] += x[i * d + j];
            }
        }
        for (int64_t c = 0; c < C; ++c) {
            if (cnt[c] > 0) {
                for (int64_t j = 0; j < d; ++j) {
                    cent[c * d + j] = (float) (sum[(size_t) c * d + j] / cnt[c]);
                }
            }
        }
    }
}

// Trains the index of one stream on its used cells' keys (but `skip`, which the next ubatch
// writes): per layer and KV head, k-means on at most 16 keys per list (evenly spaced over the
// cells), 6 iterations. Every list id of the stream is reset to -1 (the op assigns each cell to
// its nearest centroid when it next reads it), or with assign_all set here to the used cells'
// nearest centroid (llama_sparq_sync: the work done before a timed step). Threads over (layer, KV head).
static void sparq_train_index(llama_sparq_ctx & S, uint32_t strm, const std::vector<uint32_t> & skip, uint32_t n_used,
                              bool assign_all = false) {
    const llama_kv_cache * kv = S.kv;
    const uint32_t kv_size = A::kv_size(kv);
    const llama_kv_cells & cells = A::cells(kv, strm);
    const int64_t C = S.ivf_n_list;
    std::vector<uint32_t> all;
    for (uint32_t c = cells.used_min(); c < cells.used_max_p1(); ++c) {
        if (!cells.is_empty(c) && std::find(skip.begin(), skip.end(), c) == skip.end()) {
            all.push_back(c);
        }
    }
    std::vector<uint32_t> use = all;
    const size_t n_max = (size_t) 16 * C;
    if (use.size() > n_max) {
        std::vector<uint32_t> sub(n_max);
        for (size_t i = 0; i < n_max; ++i) {
            sub[i] = use[(i * use.size()) / n_max];
        }
        use.swap(sub);
    }
    struct job { size_t ikv; int64_t h; };
    std::vector<job> jobs;
    for (size_t ikv = 0; ikv < S.layers.size(); ++ikv) {
        if (S.layers[ikv].ivf_cent) {
            for (int64_t h = 0; h < S.layers[ikv].ivf_cent->ne[2]; ++h) {
                jobs.push_back({ ikv, h });
            }
        }
    }
    std::atomic<size_t> next{0};
    auto work = [&]() {
        for (size_t ji; (ji = next++) < jobs.size();) {
            const sparq_layer & L = S.layers[jobs[ji].ikv];
            ggml_tensor * k = A::layer_k(kv, jobs[ji].ikv);
            const int64_t d = L.ivf_cent->ne[0], h = jobs[ji].h;
            const size_t esz = ggml_type_size(k->type);
            std::vector<float> x(use.size() * d);
            std::vector<uint8_t> row((size_t) d * esz);
            for (size_t i = 0; i < use.size(); ++i) {
                ggml_backend_tensor_get(k, row.data(), strm * k->nb[2] + (size_t) use[i] * k->nb[1] + (size_t) h * d * esz,
                                        row.size());
                for (int64_t j = 0; j < d; ++j) {
                    x[i * d + j] = sparq_elem_f32(row.data() + j * esz, k->type);
                }
            }
            std::vector<float> cent((size_t) C * d);
            sparq_kmeans(x, (int64_t) use.size(), d, C, 6, cent.data());
            ggml_backend_tensor_set(L.ivf_cent, cent.data(), strm * L.ivf_cent->nb[3] + h * L.ivf_cent->nb[2],
                                    cent.size() * sizeof(float));
            std::vector<float> lists(kv_size, -1.0f);
            if (assign_all) {
                // in batches of cells: their keys in f32, then their nearest centroids
                constexpr size_t NB = 256;
                std::vector<float> cn2(C), centT((size_t) d * C), dist((size_t) SPARQ_ASSIGN_ROWS * C), kf(NB * d);
                std::vector<int32_t> asg(NB);
                sparq_centroid_prep(cent.data(), C, d, cn2.data(), centT.data());
                for (size_t b0 = 0; b0 < all.size(); b0 += NB) {
                    const size_t nb = std::min(NB, all.size() - b0);
                    for (size_t i = 0; i < nb; ++i) {
                        ggml_backend_tensor_get(k, row.data(),
                                                strm * k->nb[2] + (size_t) all[b0 + i] * k->nb[1] + (size_t) h * d * esz,
                                                row.size());
                        for (int64_t j = 0; j < d; ++j) {
                            kf[i * d + j] = sparq_elem_f32(row.data() + j * esz, k->type);
                        }
                    }
                    sparq_assign(kf.data(), (int64_t) nb, centT.data(), cn2.data(), C, d, asg.data(), dist.data());
                    for (size_t i = 0; i < nb; ++i) {
                        lists[all[b0 + i]] = (float) asg[i];
                    }
                }
            }
            ggml_backend_tensor_set(L.ivf_list, lists.data(), strm * L.ivf_list->nb[2] + h * L.ivf_list->nb[1],
                                    lists.size() * sizeof(float));
        }
    };
    const int nth = std::max(1, std::min<int>((int) jobs.size(),
                                              S.lctx ? (int) A::cparams(S.lctx).n_threads : 1));
    std::vector<std::thread> th;
    for (int t = 1; t < nth; ++t) {
        th.emplace_back(work);
    }
    work();
    for (auto & t : th) {
        t.join();
    }
    S.ivf_trained[strm] = std::max<uint32_t>(1, n_used);
}

// eigen-decomposition of a symmetric n x n matrix (row-major, destroyed) by cyclic Jacobi
// rotations: eigenvalues in ev, eigenvectors in the columns of V (row-major)
static void sparq_jacobi(std::vector<double> & A, int n, std::vector<double> & ev, std::vector<double> & V) {
    V.assign((size_t) n * n, 0.0);
    for (int i = 0; i < n; ++i) {
        V[(size_t) i * n + i] = 1.0;
    }
    for (int sweep = 0; sweep < 60; ++sweep) {
        double off = 0.0, diag = 0.0;
        for (int i = 0; i < n; ++i) {
            diag += A[(size_t) i * n + i] * A[(size_t) i * n + i];
            for (int j = i + 1; j < n; ++j) {
                off += A[(size_t) i * n + j] * A[(size_t) i * n + j];
            }
        }
        if (off <= 1e-22 * diag || off == 0.0) {
            break;
        }
        for (int p = 0; p < n - 1; ++p) {
            for (int q = p + 1; q < n; ++q) {
                const double apq = A[(size_t) p * n + q];
                if (fabs(apq) < 1e-300) {
                    continue;
                }
                const double app = A[(size_t) p * n + p], aqq = A[(size_t) q * n + q];
                const double theta = (aqq - app) / (2.0 * apq);
                const double t = (theta >= 0 ? 1.0 : -1.0) / (fabs(theta) + sqrt(theta * theta + 1.0));
                const double c = 1.0 / sqrt(t * t + 1.0), sn = t * c;
                for (int k = 0; k < n; ++k) { // columns p, q
                    const double akp = A[(size_t) k * n + p], akq = A[(size_t) k * n + q];
                    A[(size_t) k * n + p] = c * akp - sn * akq;
                    A[(size_t) k * n + q] = sn * akp + c * akq;
                }
                for (int k = 0; k < n; ++k) { // rows p, q
                    const double apk = A[(size_t) p * n + k], aqk = A[(size_t) q * n + k];
                    A[(size_t) p * n + k] = c * apk - sn * aqk;
                    A[(size_t) q * n + k] = sn * apk + c * aqk;
                }
                for (int k = 0; k < n; ++k) {
                    const double vkp = V[(size_t) k * n + p], vkq = V[(size_t) k * n + q];
                    V[(size_t) k * n + p] = c * vkp - sn * vkq;
                    V[(size_t) k * n + q] = sn * vkp + c * vkq;
                }
            }
        }
    }
    ev.resize(n);
    for (int i = 0; i < n; ++i) {
        ev[i] = A[(size_t) i * n + i];
    }
}

// the PCA basis of every layer and KV head from the keys the cache holds now (all streams):
// the eigenvectors of the keys' second moment, by falling variance
// skip: per stream, the cells the current ubatch writes (their K is not in the cache yet)
static void sparq_calibrate(llama_sparq_ctx & S, bool rotate, const std::vector<std::vector<uint32_t>> & skip) {
    const llama_kv_cache * kv = S.kv;
    const uint32_t kv_size = A::kv_size(kv), n_stream = A::n_stream(kv);
    struct job { size_t ikv; int64_t h; };
    std::vector<job> jobs;
    for (size_t ikv = 0; ikv < S.layers.size(); ++ikv) {
        if (S.layers[ikv].rot) {
            S.layers[ikv].rot_host.assign(rotate ? ggml_nelements(S.layers[ikv].rot) : 0, 0.0f);
            for (int64_t h = 0; h < S.layers[ikv].rot->ne[2]; ++h) {
                jobs.push_back({ ikv, h });
            }
        }
    }
    // the keys of each layer, all streams, on the host once
    std::vector<std::vector<float>> spread(S.layers.size());
    std::vector<std::vector<double>> mom(jobs.size());
    for (size_t ikv = 0; ikv < S.layers.size(); ++ikv) {
        sparq_layer & L = S.layers[ikv];
        if (!L.rot) {
            continue;
        }
        spread[ikv].assign(ggml_nelements(L.spread), 1.0f);
        ggml_tensor * k = A::layer_k(kv, ikv);
        const int64_t d = L.rot->ne[0];
        for (size_t ji = 0; ji < jobs.size(); ++ji) {
            if (jobs[ji].ikv == ikv) {
                mom[ji].assign((size_t) d * d, 0.0);
            }
        }
        std::vector<float> row(k->ne[0]);
        for (uint32_t strm = 0; strm < n_stream; ++strm) {
            const llama_kv_cells & cells = A::cells(kv, strm);
            const std::vector<uint8_t> kb = sparq_get_slice(k, strm * k->nb[2], (size_t) kv_size * k->nb[1]);
            for (uint32_t c = 0; c < kv_size; ++c) {
                if (cells.is_empty(c) ||
                    (strm < skip.size() && std::find(skip[strm].begin(), skip[strm].end(), c) != skip[strm].end())) {
                    continue;
                }
                const uint8_t * kr = kb.data() + (size_t) c * k->nb[1];
                for (int64_t j = 0; j < k->ne[0]; ++j) {
                    row[j] = sparq_elem_f32(kr + j * ggml_type_size(k->type), k->type);
                }
                for (size_t ji = 0; ji < jobs.size(); ++ji) {
                    if (jobs[ji].ikv != ikv) {
                        continue;
                    }
                    const float * x = row.data() + jobs[ji].h * d;
                    double * M = mom[ji].data();
                    if (!rotate) {
                        // the scaled basis needs the diagonal only
                        for (int64_t a = 0; a < d; ++a) {
                            M[a * d + a] += (double) x[a] * x[a];
                        }
                        continue;
                    }
                    for (int64_t a = 0; a < d; ++a) {
                        const double xa = x[a];
                        for (int64_t b = a; b < d; ++b) {
                            M[a * d + b] += xa * x[b];
                        }
                    }
                }
            }
        }
    }
    // eigen-decompositions in parallel
    const int nth = std::max(1, std::min<int>((int) jobs.size(), (int) std::thread::hardware_concurrency()));
    std::vector<std::thread> th;
    for (int t = 0; t < nth; ++t) {
        th.emplace_back([&, t] {
            for (size_t ji = t; ji < jobs.size(); ji += nth) {
                sparq_layer & L = S.layers[jobs[ji].ikv];
                const int d = (int) L.rot->ne[0];
                const int64_t h = jobs[ji].h;
                std::vector<double> & M = mom[ji];
                for (int a = 0; a < d; ++a) {
                    for (int b = 0; b < a; ++b) {
                        M[(size_t) a * d + b] = M[(size_t) b * d + a];
                    }
                }
                if (!rotate) {
                    // the model's own axes: the keys' RMS per component
                    double top = 1e-30;
                    for (int j = 0; j < d; ++j) {
                        top = std::max(top, M[(size_t) j * d + j]);
                    }
                    for (int j = 0; j < d; ++j) {
                        spread[jobs[ji].ikv][(size_t) h * d + j] = (float) sqrt(std::max(M[(size_t) j * d + j], 1e-6 * top));
                    }
                    continue;
                }
                std::vector<double> ev, V;
                sparq_jacobi(M, d, ev, V);
                std::vector<int> order(d);
                for (int i = 0; i < d; ++i) {
                    order[i] = i;
                }
                std::sort(order.begin(), order.end(), [&](int x, int y) { return ev[x] > ev[y]; });
                const double top = std::max(ev[order[0]], 1e-30);
                for (int m = 0; m < d; ++m) {
                    const int src = order[m];
                    for (int j = 0; j < d; ++j) {
                        L.rot_host[(size_t) (h * d + m) * d + j] = (float) V[(size_t) j * d + src];
                    }
                    // the keys' RMS along the axis (a floor keeps every axis selectable)
                    spread[jobs[ji].ikv][(size_t) h * d + m] = (float) sqrt(std::max(ev[src], 1e-6 * top));
                }
            }
        });
    }
    for (auto & t : th) {
        t.join();
    }
    for (size_t ikv = 0; ikv < S.layers.size(); ++ikv) {
        sparq_layer & L = S.layers[ikv];
        if (L.rot) {
            if (rotate) {
                ggml_backend_tensor_set(L.rot, L.rot_host.data(), 0, L.rot_host.size() * sizeof(float));
            }
            ggml_backend_tensor_set(L.spread, spread[ikv].data(), 0, spread[ikv].size() * sizeof(float));
        }
    }
    S.calibrated = true;
}

// ---------------------------------------------------------------------------
// C API
// ---------------------------------------------------------------------------

int32_t llama_sparq_set_params(struct llama_context * ctx, const struct llama_sparq_params * p, char * err, size_t err_size) {
    if (err && err_size) {
        err[0] = '\0';
    }
    if (!ctx || !p) {
        sparq_err(err, err_size, "SparQ: ctx and params must not be NULL");
        return -1;
    }
    if (p->size != sizeof(llama_sparq_params)) {
        sparq_err(err, err_size, "SparQ: params.size is %zu, this library's struct llama_sparq_params is %zu bytes "
                  "(initialise it with llama_sparq_default_params())", p->size, sizeof(llama_sparq_params));
        return -1;
    }
    const llama_model & model = A::model(ctx);
    const auto & hp = model.hparams;
    // the smallest head size of the full-attention layers bounds r
    int64_t d_min = INT64_MAX;
    for (uint32_t il = 0; il < hp.n_layer(); ++il) {
        if (!hp.is_swa(il) && hp.n_embd_head_k(il) > 0) {
            d_min = std::min<int64_t>(d_min, hp.n_embd_head_k(il));
        }
    }
    if (d_min == INT64_MAX) {
        d_min = hp.n_embd_head_k();
    }
    if (p->r < 0 || p->r > d_min) {
        sparq_err(err, err_size, "SparQ: r = %d is out of range: allowed 1..%lld (the head size), or 0 for head size / 4",
                  p->r, (long long) d_min);
        return -1;
    }
    if (p->k < 1 || p->k > GGML_SPARQ_K_MAX) {
        sparq_err(err, err_size, "SparQ: k = %d is out of range: allowed 1..%d", p->k, GGML_SPARQ_K_MAX);
        return -1;
    }
    if (p->l < -1 || p->l > p->k) {
        sparq_err(err, err_size, "SparQ: l = %d is out of range: allowed 0..k (k = %d), or -1 for k / 4", p->l, p->k);
        return -1;
    }
    if (p->selector < 0 || p->selector >= LLAMA_SPARQ_SELECTOR_COUNT) {
        sparq_err(err, err_size, "SparQ: selector = %d is unknown: allowed %s", p->selector,
                  sparq_allowed_names(sparq_selector_names, LLAMA_SPARQ_SELECTOR_COUNT).c_str());
        return -1;
    }
    if (p->gqa < 0 || p->gqa >= LLAMA_SPARQ_GQA_COUNT) {
        sparq_err(err, err_size, "SparQ: gqa = %d is unknown: allowed %s", p->gqa,
                  sparq_allowed_names(sparq_gqa_names, LLAMA_SPARQ_GQA_COUNT).c_str());
        return -1;
    }
    if (p->basis < 0 || p->basis >= LLAMA_SPARQ_BASIS_COUNT) {
        sparq_err(err, err_size, "SparQ: basis = %d is unknown: allowed %s", p->basis,
                  sparq_allowed_names(sparq_basis_names, LLAMA_SPARQ_BASIS_COUNT).c_str());
        return -1;
    }
    if (p->min_kv < 0) {
        sparq_err(err, err_size, "SparQ: min_kv = %d is out of range: allowed min_kv >= 0", p->min_kv);
        return -1;
    }
    if (p->index_lists < 1 || p->index_lists > 65536) {
        sparq_err(err, err_size, "SparQ: index_lists = %d is out of range: allowed 1..65536", p->index_lists);
        return -1;
    }
    if (p->index_probe < 1 || p->index_probe > p->index_lists) {
        sparq_err(err, err_size, "SparQ: index_probe = %d is out of range: allowed 1..index_lists (index_lists = %d)",
                  p->index_probe, p->index_lists);
        return -1;
    }
    const bool h2o = p->enabled && p->selector == LLAMA_SPARQ_SELECTOR_H2O;
    const bool index = p->enabled && p->selector == LLAMA_SPARQ_SELECTOR_INDEX;
    if (h2o && p->all_rows) {
        sparq_err(err, err_size, "SparQ: all_rows = 1 does not apply to selector h2o: its prompt rows are dense and "
                  "scored, its decode rows choose on the scores");
        return -1;
    }
    llama_cparams & cp = A::cparams(ctx);
    if (h2o && cp.n_seq_max > 1) {
        sparq_err(err, err_size, "SparQ: selector h2o needs a context for one sequence (n_seq_max = 1, here %u): its "
                  "scores follow one prompt and its decode steps", cp.n_seq_max);
        return -2;
    }
    if (!p->enabled) {
        if (cp.sparq) {
            cp.sparq->params = *p;
            A::need_reserve(ctx);
        }
        return 0;
    }
    if (!cp.sparq) {
        llama_kv_cache * kv = sparq_find_cache(ctx->get_memory());
        if (!kv) {
            sparq_err(err, err_size, "SparQ: this context has no attention KV cache (recurrent or embedding model?)");
            return -2;
        }
        if (A::kv_size(kv) > (uint32_t) LLAMA_SPARQ_MAX_CELLS) {
            sparq_err(err, err_size, "SparQ: the KV cache has %u cells per stream; SparQ supports up to %u (2^24: the "
                      "op counts the valid cells in f32)", A::kv_size(kv), (uint32_t) LLAMA_SPARQ_MAX_CELLS);
            return -2;
        }
        auto S = std::make_shared<llama_sparq_ctx>();
        S->lctx = ctx;
        S->kv = kv;
        S->balloc = A::balloc(ctx);
        if (!sparq_alloc(*S, model, err, err_size)) {
            return -2;
        }
        cp.sparq = S;
    }
    llama_sparq_ctx & Sq = *cp.sparq;
    if (h2o || index) {
        for (const sparq_layer & L : Sq.layers) {
            if (L.h2o && !ggml_backend_buffer_is_host(L.h2o->buffer)) {
                sparq_err(err, err_size, "SparQ: selector %s runs on the CPU and needs the KV cache in host memory "
                          "(here on %s): use --no-kv-offload / offload_kqv = false", h2o ? "h2o" : "index",
                          ggml_backend_buffer_name(L.h2o->buffer));
                return -2;
            }
        }
    }
    if (index && !sparq_alloc_index(Sq, p->index_lists, err, err_size)) {
        return -2;
    }
    if (index && (Sq.params.selector != LLAMA_SPARQ_SELECTOR_INDEX || !Sq.params.enabled)) {
        std::fill(Sq.ivf_trained.begin(), Sq.ivf_trained.end(), 0); // the index is trained at the next step
    }
    if (p->basis == LLAMA_SPARQ_BASIS_PCA && !sparq_alloc_basis(Sq, err, err_size)) {
        return -2;
    }
    if (p->basis != Sq.params.basis || !Sq.params.enabled) {
        // switched on (nothing kept the data while SparQ was off) or a new basis: every stream is rebuilt
        // before its next use, in the new basis (a calibrated one at the next SparQ step)
        Sq.calibrated = false;
        sparq_basis_reset(Sq);
        for (auto & st : Sq.streams) {
            st.valid = false;
        }
    }
    Sq.params = *p;
    // graphs built with the old settings must not be reused
    A::need_reserve(ctx);
    return 0;
}

int32_t llama_sparq_get_params(const struct llama_context * ctx, struct llama_sparq_params * out) {
    if (!out || out->size != sizeof(llama_sparq_params)) {
        return -1;
    }
    const auto & cp = A::cparams(const_cast<llama_context *>(ctx));
    *out = cp.sparq ? cp.sparq->params : llama_sparq_default_params();
    return 0;
}

// The index calls of the last execution: their estimated key reads replaced by the op's count
// (per KV head and stream of the call, the stream's last row; a row that ran dense reports -1 and
// keeps the estimate). Holds S.mtx. Called when the next execution's counters are taken and by
// llama_sparq_get_stats; on another thread than the decoding one it may read the count of a step
// still running, which is a count of the same layer one step later.
static void sparq_count_index_reads(llama_sparq_ctx & S) {
    for (const auto & p : S.ivf_pending) {
        const ggml_tensor * c = p.ikv >= 0 && p.ikv < (int32_t) S.layers.size() ? S.layers[p.ikv].ivf_cent : nullptr;
        if (!c) {
            continue;
        }
        double sum = 0.0;
        int64_t n = 0;
        bool ok = true;
        for (uint32_t st = p.s0; st < p.s0 + p.n_stream && ok; ++st) {
            for (int64_t h = 0; h < c->ne[2] && ok; ++h) {
                float v = -1.0f;
                ggml_backend_tensor_get(c, &v, st * c->nb[3] + h * c->nb[2] + (size_t) S.ivf_n_list * c->nb[1], sizeof(v));
                ok = v >= 0.0f;
                sum += v;
                n++;
            }
        }
        if (!ok || n == 0) {
            continue;
        }
        // the estimate's S d p / C key elements become the counted rows' (mean over KV heads and streams)
        const double ms = p.ms - p.S * p.est_per_cell + (sum / (double) n) * p.d;
        S.compression_sum += (ms - p.ms) / p.md;
        S.n_index_measured++;
    }
    S.ivf_pending.clear();
}

int32_t llama_sparq_get_stats(const struct llama_context * ctx, struct llama_sparq_stats * out) {
    if (!out || out->size != sizeof(llama_sparq_stats)) {
        return -1;
    }
    const size_t size = out->size;
    memset(out, 0, sizeof(*out));
    out->size = size;
    const auto & cp = A::cparams(const_cast<llama_context *>(ctx));
    if (cp.sparq) {
        llama_sparq_ctx & S = *cp.sparq;
        std::lock_guard<std::mutex> lock(S.mtx);
        sparq_count_index_reads(S);
        out->n_sparq = S.n_sparq;
        memcpy(out->n_dense, S.n_dense, sizeof(out->n_dense));
        out->compression = S.n_sparq ? S.compression_sum / S.n_sparq : 0.0;
        out->n_rebuilds = S.n_rebuilds;
        out->extra_bytes = S.extra_bytes;
        out->kv_bytes = S.kv_bytes;
        out->n_layers = S.n_layers;
        out->n_sparq_device = S.n_sparq_device;
    }
    return 0;
}

void llama_sparq_reset_stats(struct llama_context * ctx) {
    auto & cp = A::cparams(ctx);
    if (cp.sparq) {
        llama_sparq_ctx & S = *cp.sparq;
        std::lock_guard<std::mutex> lock(S.mtx);
        S.n_sparq = 0;
        S.n_sparq_device = 0;
        memset(S.n_dense, 0, sizeof(S.n_dense));
        S.compression_sum = 0.0;
        S.n_rebuilds = 0;
        S.ivf_pending.clear();
        S.n_index_measured = 0;
    }
}

// the counters once more when the context goes (the tools' logs show whether SparQ ran)
llama_sparq_ctx::~llama_sparq_ctx() {
    uint64_t nd = 0;
    char buf[256] = "";
    size_t o = 0;
    for (int i = 0; i < LLAMA_SPARQ_DENSE_COUNT; ++i) {
        nd += n_dense[i];
        if (n_dense[i] && o < sizeof(buf)) {
            o += snprintf(buf + o, sizeof(buf) - o, "%s%s %llu", o ? ", " : "", sparq_reason_names[i],
                          (unsigned long long) n_dense[i]);
        }
    }
    LLAMA_LOG_INFO("llama_sparq: counters: SparQ calls = %llu, dense calls = %llu%s%s%s, compression = %.4f, rebuilds = %llu, "
                   "SparQ calls on a GPU = %llu\n",
                   (unsigned long long) n_sparq, (unsigned long long) nd, o ? " (" : "", buf, o ? ")" : "",
                   n_sparq ? compression_sum / n_sparq : 0.0, (unsigned long long) n_rebuilds,
                   (unsigned long long) n_sparq_device);
    if (n_index_trainings) {
        LLAMA_LOG_INFO("llama_sparq: the vector index (selector index, %d lists) was trained %llu times; the keys its "
                       "calls read were counted for %llu calls (the others: estimated from even lists)\n", ivf_n_list,
                       (unsigned long long) n_index_trainings, (unsigned long long) n_index_measured);
    }
}

// ---------------------------------------------------------------------------
// keeping K^T and the V sums equal to a recomputation
// ---------------------------------------------------------------------------


// f16 -> f32 for every bit pattern (built once; thread-safe initialisation)
static const float * sparq_f16_table() {
    static const std::vector<float> tab = [] {
        std::vector<float> t(65536);
        for (uint32_t i = 0; i < 65536; ++i) {
            t[i] = ggml_fp16_to_fp32((ggml_fp16_t) i);
        }
        return t;
    }();
    return tab.data();
}

// runs f(0..n_jobs-1) on up to n_threads threads (the caller's included)
template <typename F>
static void sparq_parallel(int n_threads, size_t n_jobs, F && f) {
    const int nth = (int) std::max<size_t>(1, std::min<size_t>((size_t) std::max(1, n_threads), n_jobs));
    std::atomic<size_t> next{0};
    auto work = [&]() {
        for (size_t j; (j = next.fetch_add(1, std::memory_order_relaxed)) < n_jobs;) {
            f(j);
        }
    };
    std::vector<std::thread> th;
    th.reserve(nth - 1);
    for (int t = 1; t < nth; ++t) {
        th.emplace_back(work);
    }
    work();
    for (auto & t : th) {
        t.join();
    }
}

// a view of rows [c0, c1) of one stream of a [E, kv_size, n_stream] cache tensor (K or V):
// the tensor's memory when it is in host memory, else a copy
struct sparq_rows {
    const uint8_t * p = nullptr;
    std::vector<uint8_t> copy;
    sparq_rows(const ggml_tensor * t, uint32_t strm, uint32_t c0, uint32_t c1) {
        const size_t off = strm * t->nb[2] + (size_t) c0 * t->nb[1], n = (size_t) (c1 - c0) * t->nb[1];
        if (ggml_backend_buffer_is_host(t->buffer)) {
            p = (const uint8_t *) t->data + off;
        } else {
            copy.resize(n);
            ggml_backend_tensor_get(t, copy.data(), off, n);
            p = copy.data();
        }
    }
};

// The device of every layer's K, V, K^T and sums when all are in one non-host (GPU) buffer
// type's memory, else NULL (with allow_host, host memory counts too: the CPU device).
static ggml_backend_dev_t sparq_data_device(const llama_sparq_ctx & S, bool allow_host) {
    ggml_backend_dev_t dev = nullptr;
    for (size_t ikv = 0; ikv < S.layers.size(); ++ikv) {
        const sparq_layer & L = S.layers[ikv];
        if (!L.kt) {
            continue;
        }
        for (const ggml_tensor * t : { (const ggml_tensor *) L.kt, (const ggml_tensor *) L.vsum, (const ggml_tensor *) L.ksq,
                                       (const ggml_tensor *) L.vcomp, (const ggml_tensor *) A::layer_k(S.kv, ikv),
                                       (const ggml_tensor *) A::layer_v(S.kv, ikv) }) {
            if (!t->buffer || (!allow_host && ggml_backend_buffer_is_host(t->buffer))) {
                return nullptr;
            }
            ggml_backend_dev_t d = ggml_backend_buft_get_device(ggml_backend_buffer_get_type(t->buffer));
            if (!d && allow_host && ggml_backend_buffer_is_host(t->buffer)) {
                d = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU); // ggml's CPU buffer type names no device
            }
            if (!d || (dev && d != dev)) {
                return nullptr;
            }
            dev = d;
        }
    }
    return dev;
}

// The rebuild of one stream on the device that holds the cache (issue 12, item 3): a ggml graph
// per layer on the context's backend for that device transposes K into K^T and sums V and k^2
// over the stream's used cells (minus `skip`), in chunks of cells, in device memory; only a 0/1
// weight per used cell goes to the device, no layer comes to the host. The sums are f32 products
// (cuBLAS) with a zero compensation, not the host path's f64 sums. Returns false where it does not
// apply (the data in host memory, the PCA basis, no backend for the device): the host path runs.
static bool sparq_rebuild_stream_device(llama_sparq_ctx & S, uint32_t strm, const std::vector<uint32_t> & skip) {
    if (!S.lctx) {
        return false;
    }
    for (const sparq_layer & L : S.layers) {
        if (L.kt && !L.rot_host.empty()) {
            return false; // K^T in the PCA basis: the host path rotates
        }
    }
    // LLAMA_SPARQ_GRAPH_REBUILD=1: the graph rebuild for host memory too (on the CPU backend), so that
    // the tests check it on machines without a GPU
    const char * gr = getenv("LLAMA_SPARQ_GRAPH_REBUILD");
    ggml_backend_dev_t dev = sparq_data_device(S, gr && atoi(gr) != 0);
    if (!dev) {
        return false;
    }
    ggml_backend_t backend = nullptr;
    for (const auto & b : A::backends(S.lctx)) {
        if (ggml_backend_get_device(b.get()) == dev) {
            backend = b.get();
        }
    }
    if (!backend) {
        return false;
    }
    const llama_kv_cache * kv = S.kv;
    const llama_kv_cells & cells = A::cells(kv, strm);
    const uint32_t kv_size = A::kv_size(kv);
    const uint32_t u0 = cells.used_min(), u1 = cells.used_max_p1();
    const uint32_t nu = u1 > u0 ? u1 - u0 : 0;
    std::vector<float> w(std::max<uint32_t>(nu, 1), 0.0f);
    for (uint32_t c = u0; c < u1; ++c) {
        w[c - u0] = cells.is_empty(c) ? 0.0f : 1.0f;
    }
    for (uint32_t c : skip) {
        if (c >= u0 && c < u1) {
            w[c - u0] = 0.0f;
        }
    }
    constexpr uint32_t chunk = 16384; // cells per product: bounds the f32 temporaries
    ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));
    ggml_backend_synchronize(backend);
    for (size_t ikv = 0; ikv < S.layers.size(); ++ikv) {
        sparq_layer & L = S.layers[ikv];
        if (!L.kt) {
            continue;
        }
        ggml_tensor * k = A::layer_k(kv, ikv);
        ggml_tensor * v = A::layer_v(kv, ikv);
        const int64_t E = k->ne[0], Ev = v->ne[0];
        const size_t esz = ggml_type_size(k->type);
        ggml_backend_tensor_memset(L.vcomp, 0, strm * L.vcomp->nb[2], Ev * sizeof(float));
        if (nu == 0) {
            ggml_backend_tensor_memset(L.vsum, 0, strm * L.vsum->nb[2], Ev * sizeof(float));
            ggml_backend_tensor_memset(L.ksq, 0, strm * L.ksq->nb[2], E * sizeof(float));
            continue;
        }
        const size_t n_nodes = 16 * ((nu + chunk - 1) / chunk) + 16;
        ggml_init_params ip = { n_nodes * ggml_tensor_overhead() + ggml_graph_overhead_custom(n_nodes, false), nullptr, true };
        ggml_context_ptr ctx(ggml_init(ip));
        ggml_context * c0 = ctx.get();
        ggml_cgraph * gf = ggml_new_graph_custom(c0, n_nodes, false);
        ggml_tensor * wt = ggml_new_tensor_2d(c0, GGML_TYPE_F32, 1, nu);
        ggml_set_input(wt);
        ggml_tensor * vacc = nullptr;
        ggml_tensor * kacc = nullptr;
        for (uint32_t a = 0; a < nu; a += chunk) {
            const uint32_t n = std::min(chunk, nu - a), cell = u0 + a;
            ggml_tensor * kc = ggml_view_2d(c0, k, E, n, k->nb[1], strm * k->nb[2] + (size_t) cell * k->nb[1]);
            ggml_tensor * vc = ggml_view_2d(c0, v, Ev, n, v->nb[1], strm * v->nb[2] + (size_t) cell * v->nb[1]);
            // K^T rows [cell, cell + n) of the stream: element (cell c, component j) at j * kv_size + c
            ggml_tensor * ktd = ggml_view_2d(c0, L.kt, n, E, (size_t) kv_size * esz, strm * L.kt->nb[3] + (size_t) cell * esz);
            ggml_build_forward_expand(gf, ggml_cpy(c0, ggml_transpose(c0, kc), ktd));
            ggml_tensor * wc = ggml_view_2d(c0, wt, 1, n, wt->nb[1], (size_t) a * sizeof(float));
            ggml_tensor * vf = v->type == GGML_TYPE_F32 ? vc : ggml_cast(c0, vc, GGML_TYPE_F32);
            ggml_tensor * kf = ggml_sqr(c0, k->type == GGML_TYPE_F32 ? kc : ggml_cast(c0, kc, GGML_TYPE_F32));
            ggml_tensor * vp = ggml_out_prod(c0, vf, wc); // [Ev, 1]: sum over the cells of w * v
            ggml_tensor * kp = ggml_out_prod(c0, kf, wc); // [E, 1]
            vacc = vacc ? ggml_add(c0, vacc, vp) : vp;
            kacc = kacc ? ggml_add(c0, kacc, kp) : kp;
        }
        ggml_build_forward_expand(gf, ggml_cpy(c0, ggml_reshape_1d(c0, vacc, Ev),
                                               ggml_view_1d(c0, L.vsum, Ev, strm * L.vsum->nb[2])));
        ggml_build_forward_expand(gf, ggml_cpy(c0, ggml_reshape_1d(c0, kacc, E),
                                               ggml_view_1d(c0, L.ksq, E, strm * L.ksq->nb[2])));
        if (!ggml_gallocr_alloc_graph(galloc, gf)) {
            GGML_ABORT("llama_sparq: the device rebuild could not allocate its temporaries on %s", ggml_backend_dev_name(dev));
        }
        ggml_backend_tensor_set(wt, w.data(), 0, (size_t) nu * sizeof(float));
        if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) {
            GGML_ABORT("llama_sparq: the device rebuild failed on %s", ggml_backend_dev_name(dev));
        }
    }
    ggml_gallocr_free(galloc);
    return true;
}

// Recompute K^T and the V sum of one stream from K, V and the cells, over the used cells
// only ([used_min, used_max_p1); K^T entries of empty cells are masked and left as they
// are), leaving the V values of the cells in `skip` out (the ubatch about to run writes
// them, its graph appends them). Multi-threaded over layers and cell ranges. With check
// set, compare the kept data with the recomputation instead of writing it, and return
// the largest absolute difference.
// H2O's scores are the attention the cells received, which K and V cannot tell: a rebuild keeps
// the scores of the cells still in use (a removal or a position shift leaves each cell's history)
// and zeroes the empty cells and those the next ubatch writes. A state load or a copy from another
// stream brings no scores: those cells keep what this context had there (0 in a fresh context).
// The index follows K: after a rebuild (cells moved or removed, keys re-roped, a state loaded,
// the cache cleared) the stream's index is trained again at its next step, its list ids reset.
static void sparq_selector_rebuild(llama_sparq_ctx & S, uint32_t strm, const std::vector<uint32_t> & skip) {
    const llama_kv_cells & cells = A::cells(S.kv, strm);
    const uint32_t kv_size = A::kv_size(S.kv);
    if (strm < S.ivf_trained.size()) {
        S.ivf_trained[strm] = 0;
    }
    for (sparq_layer & L : S.layers) {
        if (L.ivf_list) {
            std::vector<float> none((size_t) L.ivf_list->ne[0] * L.ivf_list->ne[1], -1.0f);
            ggml_backend_tensor_set(L.ivf_list, none.data(), strm * L.ivf_list->nb[2], none.size() * sizeof(float));
        }
        if (!L.h2o) {
            continue;
        }
        if (!ggml_backend_buffer_is_host(L.h2o->buffer)) {
            ggml_backend_tensor_memset(L.h2o, 0, strm * L.h2o->nb[2], L.h2o->nb[2]); // h2o never runs there
            continue;
        }
        for (int64_t h = 0; h < L.h2o->ne[1]; ++h) {
            float * row = (float *) ((char *) L.h2o->data + strm * L.h2o->nb[2] + h * L.h2o->nb[1]);
            for (uint32_t c = 0; c < kv_size; ++c) {
                if (cells.is_empty(c)) {
                    row[c] = 0.0f;
                }
            }
            for (uint32_t c : skip) {
                if (c < kv_size) {
                    row[c] = 0.0f;
                }
            }
        }
    }
}

static double sparq_rebuild_stream(llama_sparq_ctx & S, uint32_t strm, const std::vector<uint32_t> & skip,
                                   bool check = false) {
    if (!check) {
        sparq_selector_rebuild(S, strm, skip);
    }
    if (!check && getenv("LLAMA_SPARQ_HOST_REBUILD") == nullptr && sparq_rebuild_stream_device(S, strm, skip)) {
        return 0.0; // done on the device (LLAMA_SPARQ_HOST_REBUILD=1 forces the host path, for comparisons)
    }
    const llama_kv_cache * kv = S.kv;
    const llama_kv_cells & cells = A::cells(kv, strm);
    const uint32_t kv_size = A::kv_size(kv);
    const uint32_t u0 = cells.used_min(), u1 = cells.used_max_p1();
    const uint32_t nu = u1 > u0 ? u1 - u0 : 0;

    // what to leave out of the V sums, over [u0, u1)
    std::vector<uint8_t> out(nu, 0);
    for (uint32_t c : skip) {
        if (c >= u0 && c < u1) {
            out[c - u0] = 1;
        }
    }

    // jobs: (layer, cell range); ranges of >= 256 cells, about 4 jobs per thread in all
    const int nth = std::max(1, S.lctx ? (int) A::cparams(S.lctx).n_threads : (int) std::thread::hardware_concurrency());
    std::vector<size_t> lay;
    for (size_t ikv = 0; ikv < S.layers.size(); ++ikv) {
        if (S.layers[ikv].kt) {
            lay.push_back(ikv);
        }
    }
    const size_t want = std::max<size_t>(1, (4 * (size_t) nth + lay.size() - 1) / std::max<size_t>(1, lay.size()));
    const uint32_t chunk = std::max<uint32_t>(256, (uint32_t) ((nu + want - 1) / want));
    const uint32_t n_chunks = nu ? (nu + chunk - 1) / chunk : 1;
    struct job_out {
        std::vector<double> vs, ks;
        double diff = 0.0;
    };
    std::vector<job_out> res(lay.size() * n_chunks);

    sparq_parallel(nth, res.size(), [&](size_t jid) {
        const size_t ikv = lay[jid / n_chunks];
        const uint32_t a = u0 + (uint32_t) (jid % n_chunks) * chunk, b = std::min(u1, a + chunk);
        sparq_layer & L = S.layers[ikv];
        const ggml_tensor * k = A::layer_k(kv, ikv);
        const ggml_tensor * v = A::layer_v(kv, ikv);
        const size_t E = k->ne[0], Ev = v->ne[0];
        const size_t esz = ggml_type_size(k->type), vesz = ggml_type_size(v->type);
        job_out & R = res[jid];
        R.vs.assign(Ev, 0.0);
        R.ks.assign(E, 0.0);
        if (b <= a) {
            return;
        }
        const sparq_rows kr(k, strm, a, b), vr(v, strm, a, b);

        // sums over the used cells of the range (V, and the squares of K for the scaled basis's
        // weights): f32 partial sums over blocks of 256 cells (vectorised; f16 through a table),
        // accumulated in f64
        const float * f16 = sparq_f16_table();
        auto sum_rows = [&](const uint8_t * p, size_t nb1, ggml_type type, size_t n, bool squares, double * acc) {
            std::vector<float> blk(n);
            for (uint32_t c0 = a; c0 < b; c0 += 256) {
                const uint32_t c1 = std::min(b, c0 + 256);
                std::fill(blk.begin(), blk.end(), 0.0f);
                float * __restrict bs = blk.data();
                for (uint32_t c = c0; c < c1; ++c) {
                    if (cells.is_empty(c) || out[c - u0]) {
                        continue;
                    }
                    const uint8_t * row = p + (size_t) (c - a) * nb1;
                    if (type == GGML_TYPE_F16) {
                        const uint16_t * __restrict x = (const uint16_t *) row;
                        for (size_t j = 0; j < n; ++j) {
                            const float f = f16[x[j]];
                            bs[j] += squares ? f * f : f;
                        }
                    } else {
                        const float * __restrict x = (const float *) row;
                        for (size_t j = 0; j < n; ++j) {
                            bs[j] += squares ? x[j] * x[j] : x[j];
                        }
                    }
                }
                for (size_t j = 0; j < n; ++j) {
                    acc[j] += bs[j];
                }
            }
        };
        sum_rows(vr.p, v->nb[1], v->type, Ev, false, R.vs.data());
        sum_rows(kr.p, k->nb[1], k->type, E, true, R.ks.data());

        // K^T rows [a, b): element (cell c, component j) at (j * kv_size + c) of the stream
        const uint32_t n = b - a;
        const size_t kt_off = strm * L.kt->nb[3];
        const bool kt_host = ggml_backend_buffer_is_host(L.kt->buffer);
        std::vector<uint8_t> tr; // [E][n] when K^T is not in host memory, or for a check
        uint8_t * dst = nullptr;
        size_t ld = kv_size;     // leading dimension of dst, in elements
        if (kt_host && !check) {
            dst = (uint8_t *) L.kt->data + kt_off + (size_t) a * esz;
        } else {
            tr.resize((size_t) E * n * esz);
            dst = tr.data();
            ld = n;
        }
        // transpose in tiles of 256 cells x 64 components: the tile's source rows stay in
        // cache, and each destination row gets 512 contiguous bytes (f16) per tile
        const size_t rs = k->nb[1];
        for (uint32_t c0 = 0; c0 < n; c0 += 256) {
            const uint32_t c1 = std::min(n, c0 + 256);
            for (size_t j0 = 0; j0 < E; j0 += 64) {
                const size_t j1 = std::min(E, j0 + 64);
                if (esz == 2) {
                    for (size_t j = j0; j < j1; ++j) {
                        uint16_t * d = (uint16_t *) dst + j * ld;
                        const uint8_t * sp = kr.p + j * 2;
                        for (uint32_t c = c0; c < c1; ++c) {
                            d[c] = *(const uint16_t *) (sp + (size_t) c * rs);
                        }
                    }
                } else {
                    for (size_t j = j0; j < j1; ++j) {
                        uint32_t * d = (uint32_t *) dst + j * ld;
                        const uint8_t * sp = kr.p + j * 4;
                        for (uint32_t c = c0; c < c1; ++c) {
                            d[c] = *(const uint32_t *) (sp + (size_t) c * rs);
                        }
                    }
                }
            }
        }
        if (!L.rot_host.empty()) {
            // K^T in the PCA basis: k' = P^T k per KV head, rounded to the cache type
            const size_t d = L.rot->ne[0];
            std::vector<float> x(E);
            for (uint32_t c = 0; c < n; ++c) {
                const uint8_t * row = kr.p + (size_t) c * rs;
                for (size_t j = 0; j < E; ++j) {
                    x[j] = sparq_elem_f32(row + j * esz, k->type);
                }
                for (size_t h = 0; h < E / d; ++h) {
                    for (size_t mm = 0; mm < d; ++mm) {
                        const float * pm = L.rot_host.data() + (h * d + mm) * d;
                        double acc = 0.0;
                        for (size_t j = 0; j < d; ++j) {
                            acc += (double) pm[j] * x[h * d + j];
                        }
                        const size_t o = (h * d + mm) * ld + c;
                        if (esz == 2) {
                            ((ggml_fp16_t *) dst)[o] = ggml_fp32_to_fp16((float) acc);
                        } else {
                            ((float *) dst)[o] = (float) acc;
                        }
                    }
                }
            }
        }
        if (check) {
            // the kept rows, as they are
            std::vector<uint8_t> cur((size_t) n * esz);
            for (size_t j = 0; j < E; ++j) {
                const size_t off = kt_off + ((size_t) j * kv_size + a) * esz;
                if (kt_host) {
                    memcpy(cur.data(), (const uint8_t *) L.kt->data + off, cur.size());
                } else {
                    ggml_backend_tensor_get(L.kt, cur.data(), off, cur.size());
                }
                for (uint32_t c = a; c < b; ++c) {
                    if (cells.is_empty(c)) {
                        continue; // unused cells are masked: their K^T entries do not matter
                    }
                    const size_t o = (size_t) (c - a) * esz;
                    R.diff = std::max(R.diff, (double) fabsf(sparq_elem_f32(&cur[o], k->type) -
                                                             sparq_elem_f32(&tr[j * n * esz + o], k->type)));
                }
            }
        } else if (!kt_host) {
            for (size_t j = 0; j < E; ++j) {
                ggml_backend_tensor_set(L.kt, tr.data() + j * n * esz, kt_off + ((size_t) j * kv_size + a) * esz, (size_t) n * esz);
            }
        }
    });

    // the V sums: the ranges' partial sums in order (the same result for any thread count)
    double max_diff = 0.0;
    for (size_t li = 0; li < lay.size(); ++li) {
        sparq_layer & L = S.layers[lay[li]];
        const size_t Ev = A::layer_v(kv, lay[li])->ne[0];
        const size_t Ek = A::layer_k(kv, lay[li])->ne[0];
        std::vector<double> vs(Ev, 0.0), ks(Ek, 0.0);
        for (uint32_t ch = 0; ch < n_chunks; ++ch) {
            const job_out & R = res[li * n_chunks + ch];
            max_diff = std::max(max_diff, R.diff);
            for (size_t j = 0; j < Ev; ++j) {
                vs[j] += R.vs[j];
            }
            for (size_t j = 0; j < Ek && j < R.ks.size(); ++j) {
                ks[j] += R.ks[j];
            }
        }
        // the sum rounded to f32, and the rounding as the appends' starting compensation
        std::vector<float> vsf(vs.begin(), vs.end()), ksf(ks.begin(), ks.end()), vcf(Ev);
        for (size_t j = 0; j < Ev; ++j) {
            vcf[j] = (float) ((double) vsf[j] - vs[j]);
        }
        if (check) {
            std::vector<float> cur(Ev), curk(Ek);
            ggml_backend_tensor_get(L.vsum, cur.data(), strm * L.vsum->nb[2], Ev * sizeof(float));
            ggml_backend_tensor_get(L.ksq, curk.data(), strm * L.ksq->nb[2], Ek * sizeof(float));
            for (size_t j = 0; j < Ev; ++j) {
                max_diff = std::max(max_diff, (double) fabsf(cur[j] - vsf[j]));
            }
            for (size_t j = 0; j < Ek; ++j) {
                // relative: a sum of squares grows with the cells (f32 appends)
                max_diff = std::max(max_diff, (double) fabsf(curk[j] - ksf[j]) / std::max(1.0f, ksf[j]));
            }
        } else {
            ggml_backend_tensor_set(L.vsum, vsf.data(), strm * L.vsum->nb[2], Ev * sizeof(float));
            ggml_backend_tensor_set(L.ksq, ksf.data(), strm * L.ksq->nb[2], Ek * sizeof(float));
            ggml_backend_tensor_set(L.vcomp, vcf.data(), strm * L.vcomp->nb[2], Ev * sizeof(float));
        }
    }
    return max_diff;
}

// whether the stream's data is current for its cells as they are now
static bool sparq_stream_current(const llama_sparq_ctx & S, uint32_t strm) {
    const sparq_stream_state & st = S.streams[strm];
    return st.valid && st.hash == A::cells_hash(A::cells(S.kv, strm));
}

static void sparq_count_rebuild(llama_sparq_ctx & S) {
    std::lock_guard<std::mutex> lock(S.mtx);
    S.n_rebuilds++;
}

void llama_sparq_sync(struct llama_context * ctx) {
    auto & cp = A::cparams(ctx);
    if (!cp.sparq || cp.sparq->n_layers == 0 || !cp.sparq->params.enabled) {
        return;
    }
    // pending cache updates first (the deferred K-shift after seq_add / seq_div, stream copies):
    // the data must be rebuilt from K as the next decode step will see it
    ctx->memory_update(false);
    llama_synchronize(ctx);
    llama_sparq_ctx & S = *cp.sparq;
    for (uint32_t strm = 0; strm < A::n_stream(S.kv); ++strm) {
        if (sparq_stream_current(S, strm)) {
            continue;
        }
        sparq_rebuild_stream(S, strm, {});
        sparq_count_rebuild(S);
        S.streams[strm].hash = A::cells_hash(A::cells(S.kv, strm));
        S.streams[strm].valid = true;
    }
    // the index selector: trained and every used cell in its list now, not in the next step
    if (S.params.selector == LLAMA_SPARQ_SELECTOR_INDEX && S.ivf_ctx) {
        for (uint32_t strm = 0; strm < A::n_stream(S.kv); ++strm) {
            const uint32_t n_used = A::cells(S.kv, strm).get_used();
            if (n_used > 0 && (S.ivf_trained[strm] == 0 || n_used >= 2 * (uint64_t) S.ivf_trained[strm])) {
                sparq_train_index(S, strm, {}, n_used, true);
                std::lock_guard<std::mutex> lock(S.mtx);
                S.n_index_trainings++;
            }
        }
    }
}

// splitmix64: a fast, seedable stream for the synthetic fill
static inline uint64_t sparq_splitmix(uint64_t & x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// fills a whole K or V tensor with zero-mean, unit-variance values (triangular: the sum
// of two uniforms, rescaled); each tensor has its own seed
static void sparq_fill_tensor(ggml_tensor * t, uint64_t seed) {
    const size_t n = ggml_nelements(t);
    const size_t chunk = 1 << 20;
    std::vector<float> f(chunk);
    std::vector<uint8_t> out(chunk * ggml_type_size(t->type));
    uint64_t x = seed;
    for (size_t i0 = 0; i0 < n; i0 += chunk) {
        const size_t m = std::min(chunk, n - i0);
        for (size_t i = 0; i < m; i += 2) { // two values per draw, each the sum of two 16-bit uniforms
            const uint64_t r = sparq_splitmix(x);
            const float u0 = (float) (r & 0xFFFF) + (float) ((r >> 16) & 0xFFFF);
            const float u1 = (float) ((r >> 32) & 0xFFFF) + (float) (r >> 48);
            f[i] = (u0 - 65535.0f) * (2.4494897f / 65535.0f); // unit variance: var(2 uniforms) = 1/6
            if (i + 1 < m) {
                f[i + 1] = (u1 - 65535.0f) * (2.4494897f / 65535.0f);
            }
        }
        if (t->type == GGML_TYPE_F16) {
            ggml_fp32_to_fp16_row(f.data(), (ggml_fp16_t *) out.data(), (int64_t) m);
            ggml_backend_tensor_set(t, out.data(), i0 * sizeof(ggml_fp16_t), m * sizeof(ggml_fp16_t));
        } else {
            ggml_backend_tensor_set(t, f.data(), i0 * sizeof(float), m * sizeof(float));
        }
    }
}

int32_t llama_sparq_bench_fill(struct llama_context * ctx, int32_t n_tokens, uint32_t seed, char * err,
                               size_t err_size) {
    if (err && err_size) {
        err[0] = '\0';
    }
    if (!ctx) {
        sparq_err(err, err_size, "synthetic fill: ctx must not be NULL");
        return -1;
    }
    llama_memory_t mem = llama_get_memory(ctx);
    auto * kv = dynamic_cast<llama_kv_cache *>(mem);
    if (!kv) {
        sparq_err(err, err_size, "synthetic fill: the model's memory is not one plain KV cache (sliding-window, "
                  "hybrid and recurrent models need a real prefill)");
        return -1;
    }
    const uint32_t size = A::kv_size(kv);
    if (A::n_stream(kv) != 1) {
        sparq_err(err, err_size, "synthetic fill: the KV cache has %u streams; only one is supported", A::n_stream(kv));
        return -1;
    }
    if (n_tokens < 1 || (uint32_t) n_tokens > size) {
        sparq_err(err, err_size, "synthetic fill: n_tokens is %d; allowed 1..%u (the KV cache size)", n_tokens, size);
        return -1;
    }
    llama_kv_cells & cells = A::cells_mut(kv, 0);
    if (cells.get_used() != 0) {
        sparq_err(err, err_size, "synthetic fill: the KV cache holds %u cells; clear it first", cells.get_used());
        return -1;
    }
    for (size_t ikv = 0; ikv < A::n_layers(kv); ++ikv) {
        for (ggml_tensor * t : { A::layer_k(kv, ikv), A::layer_v(kv, ikv) }) {
            if (t->type != GGML_TYPE_F16 && t->type != GGML_TYPE_F32) {
                sparq_err(err, err_size, "synthetic fill: cache tensor %s is %s; only f16 and f32 are supported",
                          t->name, ggml_type_name(t->type));
                return -1;
            }
        }
    }
    llama_synchronize(ctx);
    for (size_t ikv = 0; ikv < A::n_layers(kv); ++ikv) { // K and V of a layer side by side
        std::thread tv(sparq_fill_tensor, A::layer_v(kv, ikv), ((uint64_t) seed << 32) ^ (2 * ikv + 1));
        sparq_fill_tensor(A::layer_k(kv, ikv), ((uint64_t) seed << 32) ^ (2 * ikv));
        tv.join();
    }
    for (int32_t i = 0; i < n_tokens; ++i) {
        cells.pos_set(i, i);
        cells.seq_add(i, 0);
    }
    A::set_head(kv, 0, (uint32_t) n_tokens % size);
    return 0; // the cells' new versions (pos_set) make the next step rebuild K^T and the V sums
}

void llama_sparq_debug_set_eval_callback(struct llama_context * ctx, ggml_backend_sched_eval_callback cb,
                                         void * user_data) {
    llama_cparams & cp = A::cparams(ctx);
    cp.cb_eval = cb;
    cp.cb_eval_user_data = user_data;
}

double llama_sparq_debug_check(struct llama_context * ctx) {
    auto & cp = A::cparams(ctx);
    if (!cp.sparq || cp.sparq->n_layers == 0) {
        return -1.0;
    }
    llama_synchronize(ctx);
    llama_sparq_ctx & S = *cp.sparq;
    double d = 0.0;
    for (uint32_t strm = 0; strm < A::n_stream(S.kv); ++strm) {
        // a stream that is not current is rebuilt before its next use: nothing to compare
        if (sparq_stream_current(S, strm)) {
            d = std::max(d, sparq_rebuild_stream(S, strm, {}, true));
        }
    }
    return d;
}

// ---------------------------------------------------------------------------
// the graph input: append indices, valid-cell counts, upkeep, counters
// ---------------------------------------------------------------------------

struct sparq_decision {
    int il;
    int reason;   // -1: SparQ
    int d, r, k;  // for the cost model: head size, components read from K^T, the k setting
    int rows;     // the most rows of K and V a step reads (k, or g * (k - l) + l with per-head choice)
    int extra;    // other elements read per KV head (the PCA rotation)
    int ikv = -1; // the index selector: the cache layer whose centroids' extra row holds the op's read count
    int est_per_cell = 0; // the index: of r, the key elements per cell the estimate assumes (d p / C)
    // where the op runs: 0 the CPU (K^T in host memory); 1 the device holding K^T (it supports the
    // node); 2 the CPU although K^T is in device memory (the device does not support the node)
    int device = 0;
    std::string device_name = {};
};

// the most cells in use among the streams of the ubatch (the context length the dense threshold is about:
// the graph's KV view is padded to 256 cells, which would make a 1000-token context count as 1024)
static uint32_t sparq_used_max(const llama_kv_cache_context * m) {
    const auto & si = A::sinfo(m);
    uint32_t n = 0;
    for (uint32_t s = 0; s < si.n_stream(); ++s) {
        n = std::max(n, A::cells(A::cache(m), si.strm[s]).get_used());
    }
    return n;
}

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

// the mode of a ubatch over n_stream streams; prompt (optional): per stream, whether its sequence is a prompt
static int sparq_rows_mode(const llama_sparq_ctx & S, const llama_ubatch & ub, uint32_t n_stream,
                           std::vector<uint8_t> * prompt = nullptr) {
    if (prompt) {
        prompt->assign(n_stream, 0);
    }
    // several rows per stream are prompt rows and dense anyway (or all SparQ in all-rows mode)
    if (S.params.all_rows || !S.balloc || n_stream == 0 || ub.n_tokens != n_stream || !ub.seq_id) {
        return SPARQ_ROWS_SPARQ;
    }
    uint32_t n = 0;
    for (uint32_t s = 0; s < n_stream; ++s) {
        const llama_seq_id seq = ub.seq_id[s][0];
        const bool p = seq >= 0 && seq < LLAMA_MAX_SEQ && S.balloc->seq_pos_max(seq) > S.balloc->seq_pos_min(seq);
        n += p;
        if (prompt) {
            (*prompt)[s] = p;
        }
    }
    return n == 0 ? SPARQ_ROWS_SPARQ : n == n_stream ? SPARQ_ROWS_DENSE : SPARQ_ROWS_MIXED;
}

class llm_graph_input_sparq : public llm_graph_input_i {
public:
    llm_graph_input_sparq(std::shared_ptr<llama_sparq_ctx> S, const llama_kv_cache_context * mctx)
        : S(std::move(S)), mctx(mctx) {}

    void set_input(const llama_ubatch * ubatch) override;
    bool can_reuse(const llm_graph_params & params) override;

    std::shared_ptr<llama_sparq_ctx> S;
    const llama_kv_cache_context * mctx;

    std::map<int64_t, ggml_tensor *> kt_idxs;  // by n_embd_k_gqa: [n_tokens * E] i64
    ggml_tensor * v_count = nullptr;           // [n_stream] f32
    ggml_tensor * win = nullptr;               // [w, n_tps, n_stream] i32: cells of the l most recent positions
    int win_recent = 0;                        // of w: the recent ones (l); the streaming selector's sinks follow
    bool appends = false;                      // this graph appends to K^T and the V sums
    int  short_ctx = -1;                       // built with the streams under min_kv cells (1) or not (0); -1 unused
    int  rows_mode = SPARQ_ROWS_SPARQ;         // sparq_rows_mode of the ubatch the graph was built for
    ggml_tensor * pick = nullptr;              // SPARQ_ROWS_MIXED: [n_tokens] i32, per token its row of [SparQ; dense]
    std::vector<sparq_decision> decisions;     // one per attention layer of this graph
};

static const llama_kv_cache_context * sparq_base_mctx(const llama_memory_context_i * m) {
    if (auto * kc = dynamic_cast<const llama_kv_cache_context *>(m)) {
        return kc;
    }
    if (auto * iswa = dynamic_cast<const llama_kv_cache_iswa_context *>(m)) {
        return iswa->get_base();
    }
    if (auto * hyb = dynamic_cast<const llama_memory_hybrid_context *>(m)) {
        return hyb->get_attn();
    }
    return nullptr;
}

bool llm_graph_input_sparq::can_reuse(const llm_graph_params & params) {
    const llama_kv_cache_context * m = sparq_base_mctx(params.mctx);
    if (!m || A::cache(m) != S->kv) {
        return false;
    }
    mctx = m;
    bool ok = true;
    for (auto & [E, t] : kt_idxs) {
        ok &= t->ne[0] == (int64_t) params.ubatch.n_tokens * E;
    }
    if (v_count) {
        ok &= v_count->ne[0] == (int64_t) A::sinfo(m).n_stream();
    }
    if (win) {
        ok &= win->ne[1] * win->ne[2] == (int64_t) params.ubatch.n_tokens;
    }
    // prompt rows beside decode rows: the graph holds SparQ, dense attention or both
    ok &= rows_mode == sparq_rows_mode(*S, params.ubatch, A::sinfo(m).n_stream());
    if (short_ctx >= 0) {
        // the graph holds SparQ or dense attention by the dense threshold: rebuild when the context crosses it
        ok &= short_ctx == (int) (sparq_used_max(m) < (uint32_t) S->params.min_kv);
    }
    return ok;
}

void llm_graph_input_sparq::set_input(const llama_ubatch * ubatch) {
    llama_sparq_ctx & St = *S;
    const llama_kv_cache * kv = St.kv;
    const auto & si = A::sinfo(mctx);
    const uint32_t kv_size = A::kv_size(kv);

    // K^T element (cell c, component j, stream s) is row s*kv_size*E + j*kv_size + c of the flat view
    for (auto & [E, t] : kt_idxs) {
        GGML_ASSERT(ggml_backend_buffer_is_host(t->buffer));
        int64_t * data = (int64_t *) t->data;
        GGML_ASSERT((int64_t) ubatch->n_tokens == (int64_t) si.size() * si.n_stream());
        for (uint32_t s = 0; s < si.n_stream(); ++s) {
            const int64_t offs = (int64_t) si.strm[s] * kv_size * E;
            for (uint32_t i = 0; i < si.size(); ++i) {
                const int64_t tok = (int64_t) s * si.size() + i;
                const int64_t c = si.idxs[s][i];
                for (int64_t j = 0; j < E; ++j) {
                    data[tok * E + j] = offs + j * kv_size + c;
                }
            }
        }
    }

    // the PCA basis is calibrated on the cache's keys at the first step that runs SparQ; K^T is then
    // rebuilt in it (this graph rotates its own appends with the tensors written here)
    if (St.params.basis == LLAMA_SPARQ_BASIS_PCA && !St.calibrated && St.basis_ctx &&
        std::any_of(decisions.begin(), decisions.end(), [](const sparq_decision & dc) { return dc.reason < 0; })) {
        std::vector<std::vector<uint32_t>> fresh(A::n_stream(kv));
        for (uint32_t s = 0; s < si.n_stream(); ++s) {
            fresh[si.strm[s]].assign(si.idxs[s].begin(), si.idxs[s].end());
        }
        sparq_calibrate(St, true, fresh);
        for (auto & st : St.streams) {
            st.valid = false;
        }
    }

    // upkeep: the data of a stream is current when the stream's cells are those it was
    // brought up to date for plus the cells this ubatch writes, which were empty (the
    // version hash then changed by exactly those cells' terms); else it is rebuilt. O(ubatch).
    for (uint32_t s = 0; s < si.n_stream(); ++s) {
        const uint32_t strm = si.strm[s];
        const llama_kv_cells & cells = A::cells(kv, strm);
        sparq_stream_state & st = St.streams[strm];
        if (!appends) {
            st.valid = false;
            continue;
        }
        uint64_t want = st.hash;
        for (uint32_t i = 0; i < si.size(); ++i) {
            want ^= A::cell_ver_hash(cells, si.idxs[s][i]);
        }
        if (!st.valid || A::cells_hash(cells) != want) {
            sparq_rebuild_stream(St, strm, si.idxs[s]);
            sparq_count_rebuild(St);
        }
        st.hash = A::cells_hash(cells);
        st.valid = true;
    }

    // the index selector: a stream's index is trained at its first step with it, and again once the
    // stream holds twice the cells it was trained on (its list ids are then reset: the op reassigns)
    if (St.params.selector == LLAMA_SPARQ_SELECTOR_INDEX && St.ivf_ctx && appends &&
        std::any_of(decisions.begin(), decisions.end(), [](const sparq_decision & dc) { return dc.reason < 0; })) {
        for (uint32_t s = 0; s < si.n_stream(); ++s) {
            const uint32_t strm = si.strm[s];
            const llama_kv_cells & cells = A::cells(kv, strm);
            const uint32_t n_used = cells.get_used() > si.size() ? cells.get_used() - si.size() : 0;
            if (St.ivf_trained[strm] == 0 || n_used >= 2 * (uint64_t) St.ivf_trained[strm]) {
                sparq_train_index(St, strm, si.idxs[s], n_used);
                std::lock_guard<std::mutex> lock(St.mtx);
                St.n_index_trainings++;
            }
        }
    }

    if (v_count) {
        GGML_ASSERT(ggml_backend_buffer_is_host(v_count->buffer));
        float * data = (float *) v_count->data;
        for (uint32_t s = 0; s < si.n_stream(); ++s) {
            data[s] = (float) A::cells(kv, si.strm[s]).get_used();
        }
    }

    // prompt rows beside decode rows (one row per stream): each token's row of [SparQ; dense]
    if (pick) {
        GGML_ASSERT(ggml_backend_buffer_is_host(pick->buffer));
        std::vector<uint8_t> prompt;
        const int mode = sparq_rows_mode(St, *ubatch, si.n_stream(), &prompt);
        GGML_ASSERT(mode == rows_mode && (int64_t) ubatch->n_tokens == pick->ne[0]);
        int32_t * data = (int32_t *) pick->data;
        for (uint32_t s = 0; s < si.n_stream(); ++s) {
            data[s] = prompt[s] ? (int32_t) (ubatch->n_tokens + s) : (int32_t) s;
        }
    }

    // the local window: per query row, the cells of its sequence's l most recent positions
    if (win) {
        GGML_ASSERT(ggml_backend_buffer_is_host(win->buffer));
        int32_t * data = (int32_t *) win->data;
        const int64_t nw = win->ne[0], n_tps = win->ne[1];
        for (uint32_t s = 0; s < si.n_stream(); ++s) {
            const llama_kv_cells & cells = A::cells(kv, si.strm[s]);
            for (int64_t i = 0; i < n_tps; ++i) {
                const int64_t tok = (int64_t) s * n_tps + i;
                int32_t * dst = data + tok * nw;
                std::fill(dst, dst + nw, -1);
                const llama_seq_id seq = ubatch->seq_id[tok][0];
                const auto & sp = cells.seq_pos_get(seq);
                auto it = sp.upper_bound({ ubatch->pos[tok], UINT32_MAX });
                const auto end = it;
                for (int64_t j = 0; j < win_recent && it != sp.begin(); ++j) {
                    --it;
                    dst[j] = (int32_t) it->second;
                }
                // the streaming selector: then the cells of the earliest positions (the attention sinks)
                auto first = sp.begin();
                for (int64_t j = win_recent; j < nw && first != end; ++j, ++first) {
                    dst[j] = (int32_t) first->second;
                }
            }
        }
    }

    // counters: this graph's decisions, once per execution
    const double S_ = std::max<double>(1.0, sparq_used_max(mctx));
    std::lock_guard<std::mutex> lock(St.mtx);
    sparq_count_index_reads(St); // the previous execution has run
    for (const sparq_decision & dc : decisions) {
        if (dc.reason < 0) { // SparQ ran (for every row, or for the decode rows beside prompt rows)
            St.n_sparq++;
            St.n_sparq_device += dc.device == 1;
            if (dc.device == 2 && !St.logged_host_fallback) {
                St.logged_host_fallback = true;
                LLAMA_LOG_WARN("%s: SparQ runs on the CPU for layer %d: K^T is on %s, which does not support this "
                               "SPARQ_ATTN node (its log says why); the scheduler copies the cache across every step\n",
                               __func__, dc.il, dc.device_name.c_str());
            }
            const double md = 2.0 * S_ * dc.d + 2.0 * dc.d;
            const double ms = S_ <= dc.k ? md : S_ * dc.r + 2.0 * std::min<double>(dc.rows, S_) * dc.d + 4.0 * dc.d + dc.extra;
            St.compression_sum += ms / md;
            if (dc.ikv >= 0 && S_ > dc.k) {
                // (its capacity stays across steps: no allocation once warm)
                St.ivf_pending.push_back({ dc.ikv, si.s0, si.n_stream(), S_, md, ms, (double) dc.d,
                                           (double) dc.est_per_cell });
            }
        } else {
            St.n_dense[dc.reason]++;
            if (!(St.logged & (1u << dc.reason))) {
                St.logged |= 1u << dc.reason;
                LLAMA_LOG_INFO("%s: SparQ on, dense attention where: %s (first seen on layer %d; counted in the stats)\n",
                               __func__, sparq_reason_text[dc.reason], dc.il);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// the graph hook
// ---------------------------------------------------------------------------

ggml_tensor * llama_sparq_build_attn(const llm_graph_context & g, const llama_kv_cache_context * mctx,
                                     ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                                     ggml_tensor * k_cur, ggml_tensor * v_cur,
                                     ggml_tensor * kq_b, ggml_tensor * kq_mask, ggml_tensor * sinks,
                                     ggml_tensor * v_mla, float kq_scale, int il, bool is_swa) {
    const auto & cp = g.cparams;
    if (!cp.sparq || !cp.sparq->params.enabled) {
        return nullptr;
    }
    llama_sparq_ctx & S = *cp.sparq;
    const llama_sparq_params & P = S.params;
    ggml_context * ctx0 = g.ctx0;

    // the graph's SparQ input (one per graph, shared by its layers)
    llm_graph_input_sparq * inp = nullptr;
    for (auto & in : g.res->inputs) {
        if ((inp = dynamic_cast<llm_graph_input_sparq *>(in.get())) != nullptr) {
            break;
        }
    }
    const bool same_cache = mctx && A::cache(mctx) == S.kv;
    if (!inp) {
        // the graph's memory context (plain, iswa or hybrid) gives the full-attention cache's
        const llama_kv_cache_context * base = same_cache ? mctx : sparq_base_mctx(g.mctx);
        if (base && A::cache(base) == S.kv) {
            inp = (llm_graph_input_sparq *) g.res->add_input(std::make_unique<llm_graph_input_sparq>(cp.sparq, base));
            inp->rows_mode = sparq_rows_mode(S, g.ubatch, A::sinfo(base).n_stream());
        }
    }
    auto decide = [&](int reason, int d, int r, int kk, int rows, int extra = 0) {
        if (inp) {
            inp->decisions.push_back({ il, reason, d, r, kk, rows, extra });
        }
    };

    if (is_swa || (mctx && !same_cache)) {
        decide(LLAMA_SPARQ_DENSE_SWA, 0, 0, 0, 0);
        return nullptr;
    }
    if (!mctx || cp.training) {
        return nullptr; // not a cache-backed layer: nothing to count against
    }
    const int32_t ikv = A::ikv_of(S.kv, il);
    if (ikv < 0 || !S.layers[ikv].kt) {
        decide(ikv < 0 ? LLAMA_SPARQ_DENSE_NO_CACHE : S.layers[ikv].reason, 0, 0, 0, 0);
        return nullptr;
    }
    sparq_layer & L = S.layers[ikv];

    const int64_t n_stream = k->ne[3];
    const int64_t n_tokens = q->ne[2];
    const int64_t n_tps    = n_tokens / n_stream;
    const int64_t n_kv     = k->ne[2];
    const int64_t d        = k->ne[0];
    const int64_t hkv      = k->ne[1];
    const int r  = P.r > 0 ? P.r : std::max<int>(1, (int) d / 4); // the default: head size / 4 (README "Accuracy")
    const int kk = P.k;
    const bool streaming = P.selector == LLAMA_SPARQ_SELECTOR_STREAMING;
    const bool h2o = P.selector == LLAMA_SPARQ_SELECTOR_H2O;
    const bool index = P.selector == LLAMA_SPARQ_SELECTOR_INDEX;
    GGML_ASSERT((!index || L.ivf_list) && "llama_sparq: the index selector without its tensors (llama_sparq_set_params allocates them)");
    // streaming (LM-Infinite): the first min(16, k/2) positions and the k - that most recent
    const int l  = streaming ? kk - std::min(16, kk / 2) : P.l >= 0 ? P.l : kk / 4;
    const int g_size = (int) (q->ne[1] / std::max<int64_t>(1, hkv));
    const bool per_head = P.gqa == LLAMA_SPARQ_GQA_PER_HEAD && g_size > 1 && !streaming && !h2o;

    // appends keep K^T and the V sums current on every ubatch that writes this layer's cache
    // (prompt ubatches too: cheaper than rebuilding the data at the next decode step)
    const bool appends = k_cur && v_cur;
    ggml_tensor * kt_src = L.kt;
    ggml_tensor * vs_src = L.vsum;
    ggml_tensor * ksq_src = L.ksq;
    ggml_tensor * h2o_src = L.h2o;
    ggml_tensor * ivf_src = L.ivf_list;
    const auto & si = A::sinfo(mctx);
    if (appends) {
        inp->appends = true;
        const int64_t E = k_cur->ne[0] * k_cur->ne[1];
        ggml_tensor *& idx = inp->kt_idxs[E];
        if (!idx) {
            idx = ggml_new_tensor_1d(ctx0, GGML_TYPE_I64, n_tokens * E);
            ggml_set_input(idx);
            ggml_set_name(idx, "sparq_kt_idxs");
        }
        ggml_tensor * rows = ggml_reshape_2d(ctx0, L.kt, 1, ggml_nelements(L.kt));
        ggml_tensor * kin = ggml_is_contiguous(k_cur) ? k_cur : ggml_cont(ctx0, k_cur);
        if (P.basis == LLAMA_SPARQ_BASIS_PCA && L.rot) {
            // K^T in the PCA basis: rotate the keys as the cache holds them (rounded to its type)
            ggml_tensor * kc = ggml_reshape_3d(ctx0, kin, d, hkv, n_tokens);
            if (k->type != GGML_TYPE_F32) {
                kc = ggml_cast(ctx0, ggml_cast(ctx0, kc, k->type), GGML_TYPE_F32);
            }
            kc = ggml_cont(ctx0, ggml_permute(ctx0, kc, 0, 2, 1, 3));             // [d, n_tokens, hkv]
            kc = ggml_mul_mat(ctx0, L.rot, kc);                                     // [d, n_tokens, hkv]
            kin = ggml_cont(ctx0, ggml_permute(ctx0, kc, 0, 2, 1, 3));            // [d, hkv, n_tokens]
        }
        ggml_tensor * src = ggml_reshape_2d(ctx0, kin, 1, n_tokens * E);
        kt_src = ggml_set_rows(ctx0, rows, src, idx);
        ggml_build_forward_expand(g.gf, kt_src);

        // V sums of the ubatch's streams: += the new values
        const int64_t Ev = v_cur->ne[0] * v_cur->ne[1];
        ggml_tensor * vv = ggml_reshape_3d(ctx0, ggml_is_contiguous(v_cur) ? v_cur : ggml_cont(ctx0, v_cur), Ev, n_tps, n_stream);
        if (v->type != GGML_TYPE_F32) {
            // sum what the cache holds (the values rounded to its type), so the sums equal a recomputation
            vv = ggml_cast(ctx0, ggml_cast(ctx0, vv, v->type), GGML_TYPE_F32);
        }
        ggml_tensor * add;
        if (n_tps == 1) {
            add = ggml_reshape_2d(ctx0, vv, Ev, n_stream);
        } else {
            add = ggml_sum_rows(ctx0, ggml_cont(ctx0, ggml_permute(ctx0, vv, 1, 0, 2, 3))); // [1, Ev, ns]
            add = ggml_reshape_2d(ctx0, add, Ev, n_stream);
        }
        // Kahan summation: y = x - c, t = s + y, c = (t - s) - y, s = t. A plain f32 += loses up to
        // half an ulp of the sum per append: at 1M cells of unit-scale V (|sum| ~ 1e3 for zero-mean
        // values, up to ~1e6 otherwise) 1000 decode steps drift by ~3e-3 from a recomputation (more
        // than llama_sparq_debug_check's 1e-3 in the tests); compensated, the sum stays within about
        // one rounding of the exact one however many appends follow a rebuild
        ggml_tensor * s0 = ggml_view_2d(ctx0, L.vsum, Ev, n_stream, L.vsum->nb[2], si.s0 * L.vsum->nb[2]);
        ggml_tensor * c0 = ggml_view_2d(ctx0, L.vcomp, Ev, n_stream, L.vcomp->nb[2], si.s0 * L.vcomp->nb[2]);
        ggml_tensor * y = ggml_sub(ctx0, ggml_cast(ctx0, add, GGML_TYPE_F32), c0);
        ggml_tensor * t = ggml_add(ctx0, s0, y);
        // the new compensation is computed from s0 before s0 is overwritten (graph order)
        ggml_build_forward_expand(g.gf, ggml_cpy(ctx0, ggml_sub(ctx0, ggml_sub(ctx0, t, s0), y), c0));
        vs_src = ggml_cpy(ctx0, t, s0);
        ggml_build_forward_expand(g.gf, vs_src);

        // sums of k^2 per component (the scaled basis's weights), of the keys as the cache holds them
        ggml_tensor * kk2 = ggml_reshape_3d(ctx0, ggml_is_contiguous(k_cur) ? k_cur : ggml_cont(ctx0, k_cur), E, n_tps, n_stream);
        if (k->type != GGML_TYPE_F32) {
            kk2 = ggml_cast(ctx0, ggml_cast(ctx0, kk2, k->type), GGML_TYPE_F32);
        }
        kk2 = ggml_sqr(ctx0, kk2);
        ggml_tensor * kadd = n_tps == 1 ? ggml_reshape_2d(ctx0, kk2, E, n_stream) :
            ggml_reshape_2d(ctx0, ggml_sum_rows(ctx0, ggml_cont(ctx0, ggml_permute(ctx0, kk2, 1, 0, 2, 3))), E, n_stream);
        ggml_tensor * kdst = ggml_view_2d(ctx0, L.ksq, E, n_stream, L.ksq->nb[2], si.s0 * L.ksq->nb[2]);
        ksq_src = ggml_add_inplace(ctx0, kdst, kadd);
        ggml_build_forward_expand(g.gf, ksq_src);

        // a per-cell tensor [kv_size, hkv, n_stream] with the ubatch's cells set to value: entry (cell c,
        // KV head j, stream s) is at s*kv_size*hkv + j*kv_size + c, K^T's indexing with E = hkv
        auto set_new_cells = [&](ggml_tensor * t, float value, const char * name) {
            ggml_tensor *& hidx = inp->kt_idxs[hkv];
            if (!hidx) {
                hidx = ggml_new_tensor_1d(ctx0, GGML_TYPE_I64, n_tokens * hkv);
                ggml_set_input(hidx);
                ggml_set_name(hidx, "sparq_kt_idxs");
            }
            ggml_tensor * fill = ggml_fill(ctx0, ggml_new_tensor_2d(ctx0, GGML_TYPE_F32, 1, n_tokens * hkv), value);
            ggml_tensor * out = ggml_set_rows(ctx0, ggml_reshape_2d(ctx0, t, 1, ggml_nelements(t)), fill, hidx);
            ggml_format_name(out, "%s-%d", name, il); // llama_sparq.capture reads the tensor here, before the op
            ggml_build_forward_expand(g.gf, out);
            return out;
        };
        if (h2o) {
            h2o_src = set_new_cells(L.h2o, 0.0f, "sparq_h2o"); // H2O: no attention received yet
        }
        if (index) {
            ivf_src = set_new_cells(L.ivf_list, -1.0f, "sparq_ivf"); // the index: in no list yet (the op assigns them)
        }
    }

    int reason = -1;
    if (kq_b || sinks || v_mla || g.hparams.attn_soft_cap || g.hparams.f_max_alibi_bias > 0.0f ||
        g.arch == LLM_ARCH_GROK || v->ne[0] != d) {
        reason = LLAMA_SPARQ_DENSE_ATTN_VARIANT;
    } else if (cp.kv_unified && cp.n_seq_max > 1) {
        reason = LLAMA_SPARQ_DENSE_SHARED_STREAM;
    } else if ((n_tps > 1 && !P.all_rows) || (inp && inp->rows_mode == SPARQ_ROWS_DENSE)) {
        reason = LLAMA_SPARQ_DENSE_PREFILL; // prompt rows only
    } else if (!h2o) { // H2O runs the op on every decode step: its scores follow every step
        const bool is_short = sparq_used_max(mctx) < (uint32_t) P.min_kv;
        if (inp) {
            inp->short_ctx = is_short;
        }
        if (is_short) {
            reason = LLAMA_SPARQ_DENSE_SHORT;
        }
    }
    // H2O's scores of the new cells (views of the stream's scores, after the zeroing above)
    ggml_tensor * h2o3 = h2o && appends ? ggml_view_3d(ctx0, h2o_src, n_kv, hkv, n_stream, L.h2o->nb[1], L.h2o->nb[2],
                                                        si.s0 * L.h2o->nb[2]) : nullptr;
    if (h2o3 && reason == LLAMA_SPARQ_DENSE_PREFILL) {
        // H2O's prompt: the dense attention's weights summed over the prompt rows (column sums of the
        // causal attention matrix) and over the query heads of each group, added to the scores; the
        // attention itself stays upstream's. [n_kv, n_tps, n_head, ns] weights, f32: prompt ubatches only
        ggml_tensor * q4 = ggml_permute(ctx0, ggml_view_4d(ctx0, q, q->ne[0], q->ne[1], n_tps, n_stream, q->nb[1], q->nb[2],
                                                         q->nb[2] * n_tps, 0), 0, 2, 1, 3);
        ggml_tensor * kq = ggml_mul_mat(ctx0, ggml_permute(ctx0, k, 0, 2, 1, 3), q4);
        ggml_mul_mat_set_prec(kq, GGML_PREC_F32);
        kq = ggml_soft_max_ext(ctx0, kq, kq_mask, kq_scale, 0.0f);
        ggml_tensor * cs = ggml_sum_rows(ctx0, ggml_cont(ctx0, ggml_permute(ctx0, kq, 1, 0, 2, 3))); // [1, n_kv, n_head, ns]
        cs = ggml_reshape_4d(ctx0, cs, n_kv, g_size, hkv, n_stream);
        cs = ggml_sum_rows(ctx0, ggml_cont(ctx0, ggml_permute(ctx0, cs, 1, 0, 2, 3)));              // [1, n_kv, hkv, ns]
        ggml_build_forward_expand(g.gf, ggml_add_inplace(ctx0, h2o3, ggml_reshape_3d(ctx0, cs, n_kv, hkv, n_stream)));
    }
    if (reason >= 0 || !appends) {
        // SparQ needs this ubatch's keys in K^T: without appends (k_cur == nullptr) stay dense
        decide(reason >= 0 ? reason : LLAMA_SPARQ_DENSE_NO_CACHE, 0, 0, 0, 0);
        return nullptr;
    }
    // cost model: the oracle reads all d components; per-head choice reads up to g * (k - l) + l rows;
    // the baselines (the paper's Appendix G): streaming 2kd + 2d, H2O 2kd + 2d + 2S (its scores read
    // and written), neither reading or writing the mean of V
    if (streaming || h2o) {
        decide(-1, (int) d, h2o ? 2 : 0, kk, kk, -2 * (int) d);
    } else if (index) {
        // the index: its centroids (f32: 2 elements each), the list ids (f32), and the keys of the probed
        // lists, index_probe / index_lists of the cells when the lists are even (an estimate: the counters
        // do not see the lists' sizes), then k rows of K and V
        // (per-head search: each query head probes its own lists, up to g times as many, and picks its own
        // k - l cells, the group attending over their union)
        // (the op reports the rows it read; once that step has run the counters replace the estimate
        // by them: sparq_count_index_reads)
        const int C = S.ivf_n_list, np = std::min(per_head ? g_size * P.index_probe : P.index_probe, C);
        const int est = (int) (((int64_t) d * np + C / 2) / C);
        decide(-1, (int) d, 2 + est, kk, per_head ? g_size * (kk - l) + l : kk, 2 * C * (int) d - 2 * (int) d);
        if (inp && !inp->decisions.empty()) {
            inp->decisions.back().ikv = ikv;
            inp->decisions.back().est_per_cell = est;
        }
    } else {
        decide(-1, (int) d, P.selector == LLAMA_SPARQ_SELECTOR_ORACLE ? (int) d : r, kk, per_head ? g_size * (kk - l) + l : kk,
               // the PCA rotation (f32 d x d per KV head) is read every step; the scaled basis's d weights are
               // left out (like vbar's, a 1/S share of the step)
               P.basis == LLAMA_SPARQ_BASIS_PCA && L.rot ? 2 * (int) d * (int) d : 0);
    }

    if (!inp->v_count) {
        inp->v_count = ggml_new_tensor_1d(ctx0, GGML_TYPE_F32, n_stream);
        ggml_set_input(inp->v_count);
        ggml_set_name(inp->v_count, "sparq_v_count");
    }

    // the layout of build_attn_mha: q [d, n_tps, n_head, ns], k/v [d, n_kv, n_head_kv, ns]
    ggml_tensor * q4 = ggml_view_4d(ctx0, q, q->ne[0], q->ne[1], n_tps, n_stream, q->nb[1], q->nb[2], q->nb[2] * n_tps, 0);
    q4 = ggml_permute(ctx0, q4, 0, 2, 1, 3);
    ggml_tensor * k4 = ggml_permute(ctx0, k, 0, 2, 1, 3);
    ggml_tensor * v4 = ggml_permute(ctx0, v, 0, 2, 1, 3);
    ggml_tensor * kt4 = ggml_view_4d(ctx0, kt_src, n_kv, d, hkv, n_stream, L.kt->nb[1], L.kt->nb[2], L.kt->nb[3],
                                     si.s0 * L.kt->nb[3]);
    ggml_tensor * vs3 = ggml_view_3d(ctx0, vs_src, v->ne[0], hkv, n_stream, L.vsum->nb[1], L.vsum->nb[2], 0);
    if (q4->type != GGML_TYPE_F32) {
        q4 = ggml_cast(ctx0, q4, GGML_TYPE_F32);
    }
    ggml_tensor * cur = ggml_sparq_attn(ctx0, q4, k4, kt4, v4, vs3, inp->v_count, kq_mask, r, kk, l, kq_scale);
    static_assert(LLAMA_SPARQ_SELECTOR_SPARQ == GGML_SPARQ_SEL_SPARQ && LLAMA_SPARQ_SELECTOR_ORACLE == GGML_SPARQ_SEL_ORACLE &&
                  LLAMA_SPARQ_SELECTOR_STREAMING == GGML_SPARQ_SEL_STREAMING && LLAMA_SPARQ_SELECTOR_H2O == GGML_SPARQ_SEL_H2O &&
                  LLAMA_SPARQ_SELECTOR_INDEX == GGML_SPARQ_SEL_INDEX,
                  "the llama and ggml selectors are numbered alike");
    ggml_sparq_attn_set_selector(cur, P.selector,
                                 (per_head ? GGML_SPARQ_FLAG_PER_HEAD : 0) |
                                 (P.mean_v && !streaming && !h2o && !index ? 0 : GGML_SPARQ_FLAG_NO_MEAN_V));
    if (h2o) {
        ggml_sparq_attn_set_h2o(cur, h2o3);
    } else if (index) {
        ggml_tensor * cent = ggml_view_4d(ctx0, L.ivf_cent, d, S.ivf_n_list, hkv, n_stream, L.ivf_cent->nb[1],
                                          L.ivf_cent->nb[2], L.ivf_cent->nb[3], si.s0 * L.ivf_cent->nb[3]);
        ggml_tensor * lists = ggml_view_3d(ctx0, ivf_src, n_kv, hkv, n_stream, L.ivf_list->nb[1], L.ivf_list->nb[2],
                                           si.s0 * L.ivf_list->nb[2]);
        ggml_sparq_attn_set_index(cur, cent, lists, std::min(P.index_probe, S.ivf_n_list));
        ggml_sparq_attn_set_index_reads(cur); // into row ivf_n_list of L.ivf_cent: the counters read it
    } else if (P.basis == LLAMA_SPARQ_BASIS_PCA && L.rot) {
        // the query in the PCA basis of its KV head (query head h uses rot[h / g], as GQA maps heads)
        ggml_tensor * q_sel = ggml_mul_mat(ctx0, L.rot, ggml_cont(ctx0, q4)); // [d, n_tps, n_head, ns]
        ggml_sparq_attn_set_basis(cur, q_sel, L.spread);
    } else if (P.basis == LLAMA_SPARQ_BASIS_SCALED && !streaming && !index) {
        // weights: the keys' RMS per component over the stream's cells; sqrt of the sums of squares
        // (the count is common to all components and cancels in step 1's ranking and in tau)
        ggml_tensor * ks3 = ggml_view_3d(ctx0, ksq_src, d, hkv, n_stream, L.ksq->nb[1], L.ksq->nb[2], 0);
        ggml_sparq_attn_set_basis(cur, nullptr, ggml_sqrt(ctx0, ks3));
    }
    if (l > 0 || streaming) {
        // streaming: the window's l cells, then the k - l cells of the earliest positions
        const int w = streaming ? kk : l;
        if (!inp->win) {
            inp->win = ggml_new_tensor_3d(ctx0, GGML_TYPE_I32, w, n_tps, n_stream);
            ggml_set_input(inp->win);
            ggml_set_name(inp->win, "sparq_win");
            inp->win_recent = l;
        }
        GGML_ASSERT(inp->win->ne[0] == w && inp->win_recent == l);
        ggml_sparq_attn_set_window(cur, inp->win);
    }
    ggml_format_name(cur, "sparq_attn-%d", il);
    {
        // where the scheduler will run the op: with the layer's K^T (allocated like weights) when
        // that device supports the node, else on the CPU (counted in n_sparq_device, logged)
        ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(L.kt->buffer);
        ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
        if (dev && ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU && !ggml_backend_buffer_is_host(L.kt->buffer)) {
            sparq_decision & dc = inp->decisions.back();
            dc.device = ggml_backend_dev_supports_op(dev, cur) ? 1 : 2;
            dc.device_name = ggml_backend_dev_name(dev);
        }
    }
    ggml_tensor * out = ggml_reshape_2d(ctx0, cur, cur->ne[0] * cur->ne[1], cur->ne[2] * cur->ne[3]);
    if (inp->rows_mode == SPARQ_ROWS_MIXED) {
        // prompt rows beside decode rows: the prompt rows get upstream's dense attention, as alone;
        // the pick copies rows, so each is bit-identical to the one it comes from
        ggml_tensor * dense = g.build_attn_mha(q, k, v, kq_b, kq_mask, sinks, v_mla, 0, kq_scale, il);
        GGML_ASSERT(dense->type == GGML_TYPE_F32 && ggml_are_same_shape(dense, out));
        if (!inp->pick) {
            inp->pick = ggml_new_tensor_1d(ctx0, GGML_TYPE_I32, n_tokens);
            ggml_set_input(inp->pick);
            ggml_set_name(inp->pick, "sparq_pick");
        }
        out = ggml_get_rows(ctx0, ggml_concat(ctx0, out, dense, 1), inp->pick);
    }
    return out;
}
