// llama-sparq: selector index (top-k over an inverted-file index of the keys) on the llama side: its
// state (llama-sparq-index.h) allocated and kept, each cell's list id, -1 for new cells (the op files
// them), the centroids and lists given to the op, its cost, the reads the op counted, and the lists
// reset on a rebuild. The k-means training is llama-sparq-index.cpp's.

#include "llama-sparq-buffers.h"
#include "llama-sparq-cost.h"
#include "llama-sparq-graph-appends.h"
#include "llama-sparq-graph-build.h"
#include "llama-sparq-index.h"
#include "llama-sparq-selector.h"
#include "llama-sparq-state.h"
#include "llama-sparq-transfers.h"
#include "llama-sparq-upstream.h"

#include "ggml-backend.h"
#include "ggml-sparq.h"
#include "llama-impl.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

static sparq_index_state * index_of(const llama_sparq_ctx & S) {
    return static_cast<sparq_index_state *>(S.selectors[LLAMA_SPARQ_SELECTOR_INDEX].get());
}

// its tensors for n_list lists (again when the count changes); every stream untrained
static bool index_alloc(llama_sparq_ctx & S, int32_t n_list, char * err, size_t err_size) {
    if (!S.selectors[LLAMA_SPARQ_SELECTOR_INDEX]) {
        S.selectors[LLAMA_SPARQ_SELECTOR_INDEX] = std::make_unique<sparq_index_state>();
    }
    sparq_index_state & X = *index_of(S);
    if (X.ctx && X.n_list == n_list) {
        return true;
    }
    for (auto & b : X.bufs) {
        S.mem.extra_bytes -= ggml_backend_buffer_get_size(b.get());
    }
    X.bufs.clear();
    ggml_init_params ip = { (S.layers.size() * 2 + 1) * ggml_tensor_overhead(), nullptr, true };
    X.ctx.reset(ggml_init(ip));
    X.cent.assign(S.layers.size(), nullptr);
    X.list.assign(S.layers.size(), nullptr);
    std::map<ggml_backend_buffer_type_t, std::vector<ggml_tensor *>> by_buft;
    for (size_t ikv = 0; ikv < S.layers.size(); ++ikv) {
        const sparq_layer & L = S.layers[ikv];
        if (!L.data.kt) {
            continue;
        }
        const int64_t kv_size = L.data.kt->ne[0], d = L.data.kt->ne[1], hkv = L.data.kt->ne[2], ns = L.data.kt->ne[3];
        // one row more than the lists: the op reports there what it read (ggml_sparq_attn_params::index_reads)
        X.cent[ikv] = ggml_new_tensor_4d(X.ctx.get(), GGML_TYPE_F32, d, n_list + 1, hkv, ns);
        X.list[ikv] = ggml_new_tensor_3d(X.ctx.get(), GGML_TYPE_F32, kv_size, hkv, ns);
        ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(L.data.kt->buffer);
        by_buft[buft].push_back(X.cent[ikv]);
        by_buft[buft].push_back(X.list[ikv]);
    }
    X.n_list = 0;
    {
        // the calls waiting for their counted reads name the tensors replaced here
        std::lock_guard<std::mutex> lock(S.stats.mtx);
        auto & pending = S.stats.reads_pending;
        pending.erase(std::remove_if(pending.begin(), pending.end(),
                                     [](const auto & p) { return p.selector == LLAMA_SPARQ_SELECTOR_INDEX; }),
                      pending.end());
    }
    if (!sparq_alloc_buffers(S, by_buft, X.bufs, "the vector index", err, err_size)) {
        X.ctx.reset();
        X.cent.assign(S.layers.size(), nullptr);
        X.list.assign(S.layers.size(), nullptr);
        return false;
    }
    X.n_list = n_list;
    X.trained.assign(S.streams.size(), 0);
    return true;
}

// new cells are in no list yet: the op assigns them
static void index_appends(sparq_attn_build & b) {
    b.cells_src = sparq_set_new_cells(b, index_of(b.S)->list[b.ikv], -1.0f, "sparq_ivf");
}

// the lists probed per query (at most the lists there are), and the rows it read reported into row
// n_list of the centroids (the counters read it)
static void index_op_params(const llama_sparq_ctx & S, const llama_sparq_params & p, ggml_sparq_attn_params & op) {
    const sparq_index_state * X = index_of(S);
    const int32_t n_list = X && X->n_list > 0 ? X->n_list : p.index_lists;
    op.n_probe = std::max(1, std::min(p.index_probe, n_list));
    op.index_reads = true;
}

static void index_op_srcs(sparq_attn_build & b, ggml_tensor *, ggml_sparq_attn_srcs & src) {
    const sparq_index_state * X = index_of(b.S);
    GGML_ASSERT(X && X->list[b.ikv] && "llama_sparq: the index selector without its tensors (llama_sparq_set_params allocates them)");
    ggml_context * ctx0 = b.ctx0;
    const int64_t d = b.d, hkv = b.hkv, n_stream = b.n_stream;
    ggml_tensor * c = X->cent[b.ikv];
    const ggml_tensor * li = X->list[b.ikv];
    src.sel[0] = ggml_view_4d(ctx0, c, d, X->n_list, hkv, n_stream, c->nb[1], c->nb[2], c->nb[3], b.si.s0 * c->nb[3]);
    src.sel[1] = ggml_view_3d(ctx0, b.cells_src, b.n_kv, hkv, n_stream, li->nb[1], li->nb[2], b.si.s0 * li->nb[2]);
}

static void index_probe_srcs(ggml_context * ctx, const llama_sparq_ctx & S, const sparq_layer &, const llama_sparq_params & p,
                             ggml_sparq_attn_srcs & src) {
    const int64_t d = src.q->ne[0], hkv = src.k->ne[2];
    const sparq_index_state * X = index_of(S);
    const int64_t n_list = X && X->n_list > 0 ? X->n_list : p.index_lists;
    // one row more than the lists: where the op reports the rows it read
    ggml_tensor * cent = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, d, n_list + 1, hkv, 1);
    src.sel[0] = ggml_view_4d(ctx, cent, d, n_list, hkv, 1, cent->nb[1], cent->nb[2], cent->nb[3], 0);
    src.sel[1] = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, src.k->ne[1], hkv, 1);
}

// its centroids (f32: 2 elements each), the list ids (f32), and the keys of the probed lists,
// index_probe / index_lists of the cells when the lists are even (an estimate: the counters do not
// see the lists' sizes), then k rows of K and V. Per-head search: each query head probes its own
// lists, up to g times as many, and picks its own k - l cells, the group attending over their
// union. The op reports the rows it read; once that step has run the counters replace the estimate
// by them (index_rows_read).
static void index_decide(sparq_attn_build & b, sparq_cost & c) {
    const int C = index_of(b.S)->n_list, d = (int) b.d;
    const int np = std::min(b.per_head ? b.g_size * b.P.index_probe : b.P.index_probe, C);
    c.rs = 2;                                      // the list ids
    c.rk = (int) (((int64_t) d * np + C / 2) / C); // the probed keys, K rows
    c.extra = 2.0 * C * d - 2.0 * d;
    sparq_decide(b.inp, b.il, -1, b.kk, b.per_head ? b.g_size * (b.kk - b.l) + b.l : b.kk, c);
}

// The rows the call's op reported reading (per KV head and stream of the call, the stream's last row,
// in the centroids' extra row), their mean; -1 where a row ran dense (it reports -1) or the tensors are
// gone. Called (S.stats.mtx held) when the next execution's counters are taken and by
// llama_sparq_get_stats; on another thread than the decoding one it may read the count of a step still
// running, which is a count of the same layer one step later.
static double index_rows_read(const llama_sparq_ctx & S, const sparq_call_estimate & p) {
    const sparq_index_state * X = index_of(S);
    const ggml_tensor * c = X && p.ikv >= 0 && p.ikv < (int32_t) X->cent.size() ? X->cent[p.ikv] : nullptr;
    if (!c) {
        return -1.0;
    }
    double sum = 0.0;
    int64_t n = 0;
    for (uint32_t st = p.s0; st < p.s0 + p.n_stream; ++st) {
        for (int64_t h = 0; h < c->ne[2]; ++h) {
            float v = -1.0f;
            sparq_tensor_get(c, &v, st * c->nb[3] + h * c->nb[2] + (size_t) X->n_list * c->nb[1], sizeof(v));
            if (v < 0.0f) {
                return -1.0;
            }
            sum += v;
            n++;
        }
    }
    return n > 0 ? sum / (double) n : -1.0;
}

// the index follows K: after a rebuild (cells moved or removed, keys re-roped, a state loaded, the
// cache cleared) the stream's index is trained again at its next step, its list ids reset
static void index_rebuild(llama_sparq_ctx & S, uint32_t strm, const std::vector<uint32_t> &) {
    sparq_index_state * X = index_of(S);
    if (!X) {
        return;
    }
    if (strm < X->trained.size()) {
        X->trained[strm] = 0;
    }
    for (ggml_tensor * t : X->list) {
        if (t) {
            std::vector<float> none((size_t) t->ne[0] * t->ne[1], -1.0f);
            sparq_tensor_set(t, none.data(), strm * t->nb[2], none.size() * sizeof(float));
        }
    }
}

// its tensors for the settings' list count; an index switched to is trained at the next step
static bool index_apply(llama_sparq_ctx & S, const llama_sparq_params & p, char * err, size_t err_size) {
    if (!sparq_cache_on_host(S, "index", err, err_size) || !index_alloc(S, p.index_lists, err, err_size)) {
        return false;
    }
    if (S.params.selector != LLAMA_SPARQ_SELECTOR_INDEX || !S.params.enabled) {
        std::vector<uint32_t> & trained = index_of(S)->trained;
        std::fill(trained.begin(), trained.end(), 0);
    }
    return true;
}

// a stream's index is trained at its first step with it, and again once the stream holds twice the
// cells it was trained on (its list ids are then reset: the op reassigns them); counted in n_trainings
static void index_before_step(llama_sparq_ctx & S, uint32_t strm, const std::vector<uint32_t> & skip, uint32_t n_used,
                              bool assign_all) {
    sparq_index_state * X = index_of(S);
    if (!X || !X->ctx || strm >= X->trained.size()) {
        return;
    }
    // (a timed step's sync, assign_all, leaves an empty stream alone)
    if ((n_used > 0 || !assign_all) && (X->trained[strm] == 0 || n_used >= 2 * (uint64_t) X->trained[strm])) {
        sparq_train_index(S, *X, strm, skip, n_used, assign_all);
        std::lock_guard<std::mutex> lock(S.stats.mtx);
        X->n_trainings++;
    }
}

static void index_log_stats(const llama_sparq_ctx & S) {
    const sparq_index_state * X = index_of(S);
    if (X && X->n_trainings) {
        LLAMA_LOG_INFO("llama_sparq: the vector index (selector index, %d lists) was trained %llu times; the keys its "
                       "calls read were counted for %llu calls (the others: estimated from even lists)\n", X->n_list,
                       (unsigned long long) X->n_trainings, (unsigned long long) S.stats.counters.n_reads_counted);
    }
}

extern const sparq_selector sparq_sel_index = {
    /* ranks_scores  */ false,
    /* per_head      */ true,
    /* window_choice */ false,
    /* every_step    */ false,
    /* check         */ nullptr,
    /* apply         */ index_apply,
    /* before_step   */ index_before_step,
    /* window        */ nullptr,
    /* rebuild       */ index_rebuild,
    /* appends       */ index_appends,
    /* prompt        */ nullptr,
    /* op_params     */ index_op_params,
    /* op_srcs       */ index_op_srcs,
    /* probe_srcs    */ index_probe_srcs,
    /* decide        */ index_decide,
    /* rows_read     */ index_rows_read,
    /* log_stats     */ index_log_stats,
};
