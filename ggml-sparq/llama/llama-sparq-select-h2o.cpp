// llama-sparq: selector h2o (heavy hitters) on the llama side: its accumulated attention per cell,
// allocated when it is first selected, zeroed for new cells, filled from a prompt's dense attention,
// given to the op (which adds each step's weights), and kept across rebuilds.

#include "llama-sparq-buffers.h"
#include "llama-sparq-cost.h"
#include "llama-sparq-graph-appends.h"
#include "llama-sparq-graph-build.h"
#include "llama-sparq-messages.h"
#include "llama-sparq-selector.h"
#include "llama-sparq-state.h"
#include "llama-sparq-transfers.h"
#include "llama-sparq-upstream.h"

#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml-sparq.h"

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

// its state: the accumulated attention per cell of each KV-cache layer, [kv_size, n_head_kv, n_stream] f32
// (NULL where the layer has no SparQ data), in buffers of its own
struct sparq_h2o_state : sparq_selector_state {
    std::vector<ggml_backend_buffer_ptr> bufs;
    ggml_context_ptr ctx;
    std::vector<ggml_tensor *> scores; // by KV-cache layer
};

static sparq_h2o_state * h2o_of(const llama_sparq_ctx & S) {
    return static_cast<sparq_h2o_state *>(S.selectors[LLAMA_SPARQ_SELECTOR_H2O].get());
}

// its scores (once; zero: no attention received yet)
static bool h2o_alloc(llama_sparq_ctx & S, char * err, size_t err_size) {
    if (S.selectors[LLAMA_SPARQ_SELECTOR_H2O]) {
        return true;
    }
    auto X = std::make_unique<sparq_h2o_state>();
    ggml_init_params ip = { (S.layers.size() + 1) * ggml_tensor_overhead(), nullptr, true };
    X->ctx.reset(ggml_init(ip));
    X->scores.assign(S.layers.size(), nullptr);
    std::map<ggml_backend_buffer_type_t, std::vector<ggml_tensor *>> by_buft;
    for (size_t ikv = 0; ikv < S.layers.size(); ++ikv) {
        const sparq_layer & L = S.layers[ikv];
        if (!L.data.kt) {
            continue;
        }
        const int64_t kv_size = L.data.kt->ne[0], hkv = L.data.kt->ne[2], ns = L.data.kt->ne[3];
        X->scores[ikv] = ggml_new_tensor_3d(X->ctx.get(), GGML_TYPE_F32, kv_size, hkv, ns);
        ggml_format_name(X->scores[ikv], "sparq_h2o_l%d", L.il);
        by_buft[ggml_backend_buffer_get_type(L.data.kt->buffer)].push_back(X->scores[ikv]);
    }
    if (!sparq_alloc_buffers(S, by_buft, X->bufs, "the h2o scores", err, err_size)) {
        for (auto & b : X->bufs) {
            S.mem.extra_bytes -= ggml_backend_buffer_get_size(b.get());
        }
        return false;
    }
    S.selectors[LLAMA_SPARQ_SELECTOR_H2O] = std::move(X);
    return true;
}

// the scores of the ubatch's streams (views of the layer's tensor, after the new cells' zeroing)
static ggml_tensor * h2o_scores(sparq_attn_build & b) {
    const ggml_tensor * t = h2o_of(b.S)->scores[b.ikv];
    return ggml_view_3d(b.ctx0, b.cells_src, b.n_kv, b.hkv, b.n_stream, t->nb[1], t->nb[2], b.si.s0 * t->nb[2]);
}

// new cells have received no attention yet
static void h2o_appends(sparq_attn_build & b) {
    b.cells_src = sparq_set_new_cells(b, h2o_of(b.S)->scores[b.ikv], 0.0f, "sparq_h2o");
}

// a prompt: the dense attention's weights summed over the prompt rows (column sums of the causal
// attention matrix) and over the query heads of each group, added to the scores; the attention
// itself stays upstream's. [n_kv, n_tps, n_head, ns] weights, f32: prompt ubatches only
static void h2o_prompt(sparq_attn_build & b, ggml_tensor * q, ggml_tensor * k, ggml_tensor * kq_mask, float kq_scale) {
    ggml_context * ctx0 = b.ctx0;
    const int64_t n_tps = b.n_tps, n_stream = b.n_stream, n_kv = b.n_kv, hkv = b.hkv;
    ggml_tensor * q4 = ggml_permute(ctx0, ggml_view_4d(ctx0, q, q->ne[0], q->ne[1], n_tps, n_stream, q->nb[1], q->nb[2],
                                                     q->nb[2] * n_tps, 0), 0, 2, 1, 3);
    ggml_tensor * kq = ggml_mul_mat(ctx0, ggml_permute(ctx0, k, 0, 2, 1, 3), q4);
    ggml_mul_mat_set_prec(kq, GGML_PREC_F32);
    kq = ggml_soft_max_ext(ctx0, kq, kq_mask, kq_scale, 0.0f);
    ggml_tensor * cs = ggml_sum_rows(ctx0, ggml_cont(ctx0, ggml_permute(ctx0, kq, 1, 0, 2, 3))); // [1, n_kv, n_head, ns]
    cs = ggml_reshape_4d(ctx0, cs, n_kv, b.g_size, hkv, n_stream);
    cs = ggml_sum_rows(ctx0, ggml_cont(ctx0, ggml_permute(ctx0, cs, 1, 0, 2, 3)));              // [1, n_kv, hkv, ns]
    ggml_build_forward_expand(b.g.gf, ggml_add_inplace(ctx0, h2o_scores(b), ggml_reshape_3d(ctx0, cs, n_kv, hkv, n_stream)));
}

static void h2o_op_srcs(sparq_attn_build & b, ggml_tensor *, ggml_sparq_attn_srcs & src) {
    src.sel[0] = h2o_scores(b);
}

static void h2o_probe_srcs(ggml_context * ctx, const llama_sparq_ctx &, const sparq_layer &, const llama_sparq_params &,
                           ggml_sparq_attn_srcs & src) {
    src.sel[0] = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, src.k->ne[1], src.k->ne[2], 1);
}

// the paper's Appendix G: 2 k d + 2 d + 2 n_cells (its scores read and written), no mean of V
static void h2o_decide(sparq_attn_build & b, sparq_cost & c) {
    c.rs = 2;
    c.extra = -2.0 * b.d;
    sparq_decide(b.inp, b.il, -1, b.kk, b.kk, c);
}

// The scores are the attention the cells received, which K and V cannot tell: a rebuild keeps the
// scores of the cells still in use (a removal or a position shift leaves each cell's history) and
// zeroes the empty cells and those the next ubatch writes. A state load or a copy from another
// stream brings no scores: those cells keep what this context had there (0 in a fresh context).
static void h2o_rebuild(llama_sparq_ctx & S, uint32_t strm, const std::vector<uint32_t> & skip) {
    const sparq_h2o_state * X = h2o_of(S);
    if (!X) {
        return;
    }
    const llama_kv_cells & cells = upstream::cells(S.kv, strm);
    const uint32_t kv_size = upstream::kv_size(S.kv);
    for (ggml_tensor * t : X->scores) {
        if (!t) {
            continue;
        }
        if (!ggml_backend_buffer_is_host(t->buffer)) {
            sparq_tensor_memset(t, 0, strm * t->nb[2], t->nb[2]); // h2o never runs there
            continue;
        }
        for (int64_t h = 0; h < t->ne[1]; ++h) {
            float * row = (float *) ((char *) t->data + strm * t->nb[2] + h * t->nb[1]);
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

// its scores follow one prompt and its decode steps: its prompt rows are dense and scored, and one
// sequence only
static bool h2o_check(const llama_sparq_params & p, const llama_cparams * cp, char * err, size_t err_size) {
    if (p.all_rows) {
        sparq_err(err, err_size, "SparQ: all_rows = 1 does not apply to selector h2o: its prompt rows are dense and "
                  "scored, its decode rows choose on the scores");
        return false;
    }
    if (cp && cp->n_seq_max > 1) {
        sparq_err(err, err_size, "SparQ: selector h2o needs a context for one sequence (n_seq_max = 1, here %u): its "
                  "scores follow one prompt and its decode steps", cp->n_seq_max);
        return false;
    }
    return true;
}

// its scores beside the cache, in host memory (it runs on the CPU), allocated when first selected
static bool h2o_apply(llama_sparq_ctx & S, const llama_sparq_params &, char * err, size_t err_size) {
    return sparq_cache_on_host(S, "h2o", err, err_size) && h2o_alloc(S, err, err_size);
}

// every decode step runs the op (its scores follow every step), short contexts included
extern const sparq_selector sparq_sel_h2o = {
    /* ranks_scores  */ false,
    /* per_head      */ false,
    /* window_choice */ false,
    /* every_step    */ true,
    /* check         */ h2o_check,
    /* apply         */ h2o_apply,
    /* before_step   */ nullptr,
    /* window        */ nullptr,
    /* rebuild       */ h2o_rebuild,
    /* appends       */ h2o_appends,
    /* prompt        */ h2o_prompt,
    /* op_params     */ nullptr,
    /* op_srcs       */ h2o_op_srcs,
    /* probe_srcs    */ h2o_probe_srcs,
    /* decide        */ h2o_decide,
    /* rows_read     */ nullptr,
    /* log_stats     */ nullptr,
};
