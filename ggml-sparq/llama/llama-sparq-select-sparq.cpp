// llama-sparq: selectors sparq (the paper's: approximate scores from the r largest query
// components of K^T) and oracle (every component: the exact top-k) on the llama side: the basis
// the op's steps 1-2 use, and their cost.

#include "llama-sparq-cost.h"
#include "llama-sparq-graph-build.h"
#include "llama-sparq-selector.h"
#include "llama-sparq-state.h"

#include "ggml-sparq.h"
#include "llama-impl.h"

// the basis of steps 1-2: the PCA rotation of the query and its spread, or the scaled basis's
// weights, and the query rotated back where K^T keeps the keys rotated back from upstream's Hadamard
static void sparq_basis_srcs(sparq_attn_build & b, ggml_tensor * q4, ggml_sparq_attn_srcs & src) {
    ggml_context * ctx0 = b.ctx0;
    const sparq_layer & L = b.L;
    if (b.P.basis == LLAMA_SPARQ_BASIS_PCA && L.basis.rot) {
        // the query in the PCA basis of its KV head (query head h uses rot[h / g], as GQA maps heads)
        src.sel[0] = ggml_mul_mat(ctx0, L.basis.rot, ggml_cont(ctx0, q4)); // [d, n_tps, n_head, ns]
        src.sel[1] = L.basis.spread;
        return;
    }
    src.sel[0] = sparq_unrotates(b.S, L) ? llama_mul_mat_hadamard(ctx0, q4, L.data.hrot) : nullptr;
    if (b.P.basis == LLAMA_SPARQ_BASIS_SCALED && src.k_sq) {
        // the op appends to the sums of squares and takes their roots itself (ggml_sparq_attn_srcs::k_sq)
        src.sel[1] = src.k_sq;
    } else if (b.P.basis == LLAMA_SPARQ_BASIS_SCALED) {
        // weights: the keys' RMS per component over the stream's cells; sqrt of the sums of squares
        // (the count is common to all components and cancels in step 1's ranking and in tau)
        ggml_tensor * ks3 = ggml_view_3d(ctx0, b.ksq_src, b.d, b.hkv, b.n_stream, L.data.ksq->nb[1], L.data.ksq->nb[2], 0);
        src.sel[1] = ggml_sqrt(ctx0, ks3);
    }
}

// the same inputs as placeholders: the basis of settings p where the layer has it
static void sparq_basis_probe(ggml_context * ctx, const llama_sparq_ctx & S, const sparq_layer & L, const llama_sparq_params & p,
                              ggml_sparq_attn_srcs & src) {
    const int64_t d = src.q->ne[0], hkv = src.k->ne[2];
    const bool pca = p.basis == LLAMA_SPARQ_BASIS_PCA && L.basis.rot;
    if (pca || sparq_unrotates(S, L)) {
        src.sel[0] = ggml_new_tensor(ctx, GGML_TYPE_F32, 4, src.q->ne);
    }
    if (pca || p.basis == LLAMA_SPARQ_BASIS_SCALED) {
        src.sel[1] = !pca && src.k_sq ? src.k_sq : ggml_new_tensor_3d(ctx, GGML_TYPE_F32, d, hkv, 1);
    }
}

// r components of K^T per cell (the oracle: all d); per-head choice reads up to g (k - l) + l rows;
// the PCA rotation (f32 d x d per KV head) is read every step (the scaled basis's d weights are left
// out: like vbar's, a 1/S share of the step)
static void sparq_decide_rows(sparq_attn_build & b, sparq_cost & c, int r) {
    c.r = r;
    c.extra = b.P.basis == LLAMA_SPARQ_BASIS_PCA && b.L.basis.rot ? 2.0 * b.d * b.d : 0.0;
    sparq_decide(b.inp, b.il, -1, b.kk, b.per_head ? b.g_size * (b.kk - b.l) + b.l : b.kk, c);
}

static void sparq_decide_sel(sparq_attn_build & b, sparq_cost & c) { sparq_decide_rows(b, c, b.r); }
static void oracle_decide(sparq_attn_build & b, sparq_cost & c) { sparq_decide_rows(b, c, (int) b.d); }

extern const sparq_selector sparq_sel_sparq = {
    /* ranks_scores  */ true,
    /* per_head      */ true,
    /* window_choice */ false,
    /* every_step    */ false,
    /* check         */ nullptr,
    /* apply         */ nullptr,
    /* before_step   */ nullptr,
    /* window        */ nullptr,
    /* rebuild       */ nullptr,
    /* appends       */ nullptr,
    /* prompt        */ nullptr,
    /* op_params     */ nullptr,
    /* op_srcs       */ sparq_basis_srcs,
    /* probe_srcs    */ sparq_basis_probe,
    /* decide        */ sparq_decide_sel,
    /* rows_read     */ nullptr,
    /* log_stats     */ nullptr,
};

extern const sparq_selector sparq_sel_oracle = {
    /* ranks_scores  */ true,
    /* per_head      */ true,
    /* window_choice */ false,
    /* every_step    */ false,
    /* check         */ nullptr,
    /* apply         */ nullptr,
    /* before_step   */ nullptr,
    /* window        */ nullptr,
    /* rebuild       */ nullptr,
    /* appends       */ nullptr,
    /* prompt        */ nullptr,
    /* op_params     */ nullptr,
    /* op_srcs       */ sparq_basis_srcs,
    /* probe_srcs    */ sparq_basis_probe,
    /* decide        */ oracle_decide,
    /* rows_read     */ nullptr,
    /* log_stats     */ nullptr,
};
