// llama-sparq: selector index (top-k over an inverted-file index of the keys) on the llama side:
// each cell's list id (sparq_layer_selectors::ivf_list), -1 for new cells (the op files them), the
// centroids and lists given to the op, its cost, and the lists reset on a rebuild. The k-means
// training is llama-sparq-index.cpp's.

#include "llama-sparq-graph-build.h"

// new cells are in no list yet: the op assigns them
static void index_appends(sparq_attn_build & b) {
    b.cells_src = sparq_set_new_cells(b, b.L.sel.ivf_list, -1.0f, "sparq_ivf");
}

// the lists probed per query (at most the lists there are), and the rows it read reported into row
// index.n_list of the centroids (the counters read it)
static void index_op_params(const llama_sparq_ctx & S, const llama_sparq_params & p, ggml_sparq_attn_params & op) {
    op.n_probe = std::max(1, std::min(p.index_probe, S.index.n_list > 0 ? S.index.n_list : p.index_lists));
    op.index_reads = true;
}

static void index_op_srcs(sparq_attn_build & b, ggml_tensor *, ggml_sparq_attn_srcs & src) {
    const sparq_layer & L = b.L;
    GGML_ASSERT(L.sel.ivf_list && "llama_sparq: the index selector without its tensors (llama_sparq_set_params allocates them)");
    ggml_context * ctx0 = b.ctx0;
    const int64_t d = b.d, hkv = b.hkv, n_stream = b.n_stream;
    const ggml_tensor * c = L.sel.ivf_cent, * li = L.sel.ivf_list;
    src.sel[0] = ggml_view_4d(ctx0, L.sel.ivf_cent, d, b.S.index.n_list, hkv, n_stream, c->nb[1], c->nb[2], c->nb[3],
                              b.si.s0 * c->nb[3]);
    src.sel[1] = ggml_view_3d(ctx0, b.cells_src, b.n_kv, hkv, n_stream, li->nb[1], li->nb[2], b.si.s0 * li->nb[2]);
}

static void index_probe_srcs(ggml_context * ctx, const llama_sparq_ctx & S, const sparq_layer &, const llama_sparq_params & p,
                             ggml_sparq_attn_srcs & src) {
    const int64_t d = src.q->ne[0], hkv = src.k->ne[2];
    const int64_t n_list = S.index.n_list > 0 ? S.index.n_list : p.index_lists;
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
// by them (sparq_count_index_reads), from the layer named in the decision.
static void index_decide(sparq_attn_build & b, sparq_cost & c) {
    const int C = b.S.index.n_list, d = (int) b.d;
    const int np = std::min(b.per_head ? b.g_size * b.P.index_probe : b.P.index_probe, C);
    c.rs = 2;                                      // the list ids
    c.rk = (int) (((int64_t) d * np + C / 2) / C); // the probed keys, K rows
    c.extra = 2.0 * C * d - 2.0 * d;
    sparq_decide(b.inp, b.il, -1, b.kk, b.per_head ? b.g_size * (b.kk - b.l) + b.l : b.kk, c);
    if (b.inp && !b.inp->decisions.empty()) {
        b.inp->decisions.back().ikv = b.ikv;
    }
}

// the index follows K: after a rebuild (cells moved or removed, keys re-roped, a state loaded, the
// cache cleared) the stream's index is trained again at its next step, its list ids reset
static void index_rebuild(llama_sparq_ctx & S, uint32_t strm, const std::vector<uint32_t> &) {
    if (strm < S.index.trained.size()) {
        S.index.trained[strm] = 0;
    }
    for (sparq_layer & L : S.layers) {
        if (L.sel.ivf_list) {
            std::vector<float> none((size_t) L.sel.ivf_list->ne[0] * L.sel.ivf_list->ne[1], -1.0f);
            sparq_tensor_set(L.sel.ivf_list, none.data(), strm * L.sel.ivf_list->nb[2], none.size() * sizeof(float));
        }
    }
}

// its tensors for the settings' list count; an index switched to is trained at the next step
static bool index_apply(llama_sparq_ctx & S, const llama_sparq_params & p, char * err, size_t err_size) {
    if (!sparq_cache_on_host(S, "index", err, err_size) || !sparq_alloc_index(S, p.index_lists, err, err_size)) {
        return false;
    }
    if (S.params.selector != LLAMA_SPARQ_SELECTOR_INDEX || !S.params.enabled) {
        std::fill(S.index.trained.begin(), S.index.trained.end(), 0);
    }
    return true;
}

// a stream's index is trained at its first step with it, and again once the stream holds twice the
// cells it was trained on (its list ids are then reset: the op reassigns them)
static void index_before_step(llama_sparq_ctx & S, uint32_t strm, const std::vector<uint32_t> & skip, uint32_t n_used,
                              bool assign_all) {
    if (!S.index.ctx || strm >= S.index.trained.size()) {
        return;
    }
    // (a timed step's sync, assign_all, leaves an empty stream alone)
    if ((n_used > 0 || !assign_all) && (S.index.trained[strm] == 0 || n_used >= 2 * (uint64_t) S.index.trained[strm])) {
        sparq_retrain_index(S, strm, skip, n_used, assign_all);
    }
}

const sparq_selector sparq_sel_index = {
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
};
