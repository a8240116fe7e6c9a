// llama-sparq: the graph's appends (llama-sparq-graph-appends.h): the nodes that keep a layer's K^T, V
// sums, sums of k^2, valid-cell counts and device window current with the ubatch's keys and values,
// written at upstream's own K row index, so that a step uploads nothing of its own.
#include "llama-sparq-graph-appends.h"

#include "llama-sparq-graph-build.h"
#include "llama-sparq-op.h"
#include "llama-sparq-state.h"
#include "llama-sparq-upstream.h"

#include "ggml-sparq.h"
#include "llama-graph.h"
#include "llama-impl.h"

// upstream's own index of the ubatch's K rows (stream * kv_size + cell, i64 [n_tokens]): the index
// of the set_rows that stored this layer's keys into its K cache just before the hook. The appends
// derive every per-cell write from it, so SparQ uploads no index of its own per step
ggml_tensor * sparq_k_idxs(sparq_attn_build & b) {
    if (!b.k_idxs) {
        const ggml_tensor * kc = upstream::layer_k(b.S.kv, (size_t) b.ikv);
        ggml_cgraph * gf = b.g.gf;
        for (int i = ggml_graph_n_nodes(gf) - 1; i >= 0 && !b.k_idxs; --i) {
            ggml_tensor * n = ggml_graph_node(gf, i);
            if (n->op == GGML_OP_SET_ROWS && n->view_src == kc) { // a view of the cache: src[0] rows, src[1] index
                b.k_idxs = n->src[1];
            }
        }
        GGML_ASSERT(b.k_idxs && b.k_idxs->type == GGML_TYPE_I64 && b.k_idxs->ne[0] == b.n_tokens &&
                    "llama_sparq: the layer's K store (set_rows) not found before the attention");
    }
    return b.k_idxs;
}

// x (f32) as the cache of type `type` holds it: rounded to that type and back (f32: as it is; a quantized
// type: by the CPU's quantizer, the one the cache's set_rows uses, and dequantized)
static ggml_tensor * sparq_as_cached(ggml_context * ctx0, ggml_tensor * x, ggml_type type) {
    if (type != GGML_TYPE_F32) {
        x = ggml_cast(ctx0, ggml_cast(ctx0, x, type), GGML_TYPE_F32);
    }
    return x;
}


// the ubatch's new rows x_cur (keys or values, E elements per token) as the cache of type `type`
// holds them (rounded to it), or with squares their squares, summed over the tokens of each
// stream: [E, n_stream] f32
static ggml_tensor * sparq_ubatch_sums(sparq_attn_build & b, ggml_tensor * x_cur, ggml_type type, bool squares) {
    ggml_context * ctx0 = b.ctx0;
    const int64_t E = x_cur->ne[0] * x_cur->ne[1];
    ggml_tensor * x = ggml_reshape_3d(ctx0, ggml_is_contiguous(x_cur) ? x_cur : ggml_cont(ctx0, x_cur), E, b.n_tps, b.n_stream);
    x = sparq_as_cached(ctx0, x, type);
    if (squares) {
        x = ggml_sqr(ctx0, x);
    }
    if (b.n_tps == 1) {
        return ggml_reshape_2d(ctx0, x, E, b.n_stream);
    }
    ggml_tensor * sum = ggml_sum_rows(ctx0, ggml_cont(ctx0, ggml_permute(ctx0, x, 1, 0, 2, 3))); // [1, E, ns]
    return ggml_reshape_2d(ctx0, sum, E, b.n_stream);
}

// the ubatch's keys into K^T (set_rows; an 8-bit K^T through the op's append mode, which rounds them to
// f16 and then to e5m2), in the PCA basis when K^T is kept in it
// kc: the ubatch's keys as the cache holds them ([d, hkv, n_tokens] f32): a quantized cache's keys
// quantized and back, once for K^T and the sums of k^2; NULL for an f16 or f32 cache (K^T has its
// type: set_rows rounds as the cache does)
static ggml_tensor * sparq_append_keys(sparq_attn_build & b, ggml_tensor * k_cur, ggml_tensor * kc, const ggml_tensor * k) {
    ggml_context * ctx0 = b.ctx0;
    const int64_t E = k_cur->ne[0] * k_cur->ne[1];
    GGML_ASSERT(E == b.d * b.hkv);
    ggml_tensor * kin = kc ? kc : ggml_is_contiguous(k_cur) ? k_cur : ggml_cont(ctx0, k_cur);
    if (b.P.basis == LLAMA_SPARQ_BASIS_PCA && b.L.basis.rot) {
        // K^T in the PCA basis: rotate the keys as the cache holds them (rounded to its type)
        ggml_tensor * kr = kc ? kc : sparq_as_cached(ctx0, ggml_reshape_3d(ctx0, kin, b.d, b.hkv, b.n_tokens), k->type);
        kr = ggml_cont(ctx0, ggml_permute(ctx0, kr, 0, 2, 1, 3));             // [d, n_tokens, hkv]
        kr = ggml_mul_mat(ctx0, b.L.basis.rot, kr);                                   // [d, n_tokens, hkv]
        kin = ggml_cont(ctx0, ggml_permute(ctx0, kr, 0, 2, 1, 3));            // [d, hkv, n_tokens]
    }
    ggml_tensor * src = ggml_reshape_2d(ctx0, kin, E, b.n_tokens);
    ggml_tensor * kt = ggml_sparq_cell_scatter(ctx0, b.L.data.kt, src, sparq_k_idxs(b));
    ggml_build_forward_expand(b.g.gf, kt);
    return kt;
}

// whether a decode step's sums take one op each (ggml_sparq_sum_append) instead of the small
// nodes below: one new token per stream, an f16 or f32 cache (a quantized one rounds through its quantizer)
static bool sparq_sum_fused(const sparq_attn_build & b, ggml_type type) {
    return b.n_tps == 1 && (type == GGML_TYPE_F16 || type == GGML_TYPE_F32);
}

// the step's new rows x_cur (one token per stream) as the sum-append mode takes them: [E, n_stream] f32,
// not yet rounded to the cache's type (the mode rounds)
static ggml_tensor * sparq_step_rows(sparq_attn_build & b, ggml_tensor * x_cur) {
    ggml_tensor * x = sparq_ubatch_sums(b, x_cur, GGML_TYPE_F32, false);
    return x->type == GGML_TYPE_F32 ? x : ggml_cast(b.ctx0, x, GGML_TYPE_F32);
}

// the counts of the ubatch's streams (si.s0 ..): a view of the layer's [n_stream] counts
static ggml_tensor * sparq_count_view(sparq_attn_build & b, ggml_tensor * vcount) {
    return ggml_view_1d(b.ctx0, vcount, b.n_stream, b.si.s0 * vcount->nb[0]);
}

// V sums of the ubatch's streams: += the new values, compensated
static ggml_tensor * sparq_append_values(sparq_attn_build & b, ggml_tensor * v_cur, const ggml_tensor * v) {
    ggml_context * ctx0 = b.ctx0;
    const int64_t Ev = v_cur->ne[0] * v_cur->ne[1];
    if (sparq_sum_fused(b, v->type)) {
        const sparq_layer & L = b.L;
        ggml_tensor * s0 = ggml_view_2d(ctx0, L.data.vsum, Ev, b.n_stream, L.data.vsum->nb[2], b.si.s0 * L.data.vsum->nb[2]);
        ggml_tensor * c0 = ggml_view_2d(ctx0, L.data.vcomp, Ev, b.n_stream, L.data.vcomp->nb[2], b.si.s0 * L.data.vcomp->nb[2]);
        ggml_tensor * vs = ggml_sparq_sum_append(ctx0, s0, c0, sparq_step_rows(b, v_cur), v->type, false);
        // the streams' valid-cell counts + 1 in the same node (the op reads them after it: it reads vs)
        b.vc_src = sparq_count_view(b, L.data.vcount);
        ggml_sparq_sum_append_set_count(vs, b.vc_src);
        ggml_build_forward_expand(b.g.gf, vs);
        return vs;
    }
    // sum what the cache holds (the values rounded to its type), so the sums equal a recomputation
    ggml_tensor * add = sparq_ubatch_sums(b, v_cur, v->type, false);
    // Kahan summation: y = x - c, t = s + y, c = (t - s) - y, s = t. A plain f32 += loses up to
    // half an ulp of the sum per append: at 1M cells of unit-scale V (|sum| ~ 1e3 for zero-mean
    // values, up to ~1e6 otherwise) 1000 decode steps drift by ~3e-3 from a recomputation (more
    // than llama_sparq_debug_check's 1e-3 in the tests); compensated, the sum stays within about
    // one rounding of the exact one however many appends follow a rebuild
    const sparq_layer & L = b.L;
    ggml_tensor * s0 = ggml_view_2d(ctx0, L.data.vsum, Ev, b.n_stream, L.data.vsum->nb[2], b.si.s0 * L.data.vsum->nb[2]);
    ggml_tensor * c0 = ggml_view_2d(ctx0, L.data.vcomp, Ev, b.n_stream, L.data.vcomp->nb[2], b.si.s0 * L.data.vcomp->nb[2]);
    ggml_tensor * y = ggml_sub(ctx0, ggml_cast(ctx0, add, GGML_TYPE_F32), c0);
    ggml_tensor * t = ggml_add(ctx0, s0, y);
    // the new compensation is computed from s0 before s0 is overwritten (graph order)
    ggml_build_forward_expand(b.g.gf, ggml_cpy(ctx0, ggml_sub(ctx0, ggml_sub(ctx0, t, s0), y), c0));
    ggml_tensor * vs = ggml_cpy(ctx0, t, s0);
    ggml_build_forward_expand(b.g.gf, vs);
    // the streams' valid-cell counts + the ubatch's tokens of each (exact: counts stay below 2^24)
    ggml_tensor * vc = sparq_count_view(b, L.data.vcount);
    b.vc_src = ggml_cpy(ctx0, ggml_scale_bias(ctx0, vc, 1.0f, (float) b.n_tps), vc);
    ggml_build_forward_expand(b.g.gf, b.vc_src);
    return vs;
}

// sums of k^2 per component (the scaled basis's weights), of the keys as the cache holds them (kc, when
// a quantized cache's are made already: see sparq_append_keys)
static ggml_tensor * sparq_append_ksq(sparq_attn_build & b, ggml_tensor * k_cur, ggml_tensor * kc, const ggml_tensor * k) {
    ggml_context * ctx0 = b.ctx0;
    const int64_t E = k_cur->ne[0] * k_cur->ne[1];
    ggml_tensor * kdst = ggml_view_2d(ctx0, b.L.data.ksq, E, b.n_stream, b.L.data.ksq->nb[2], b.si.s0 * b.L.data.ksq->nb[2]);
    if (!kc && sparq_sum_fused(b, k->type)) {
        ggml_tensor * ksq = ggml_sparq_sum_append(ctx0, kdst, nullptr, sparq_step_rows(b, k_cur), k->type, true);
        ggml_build_forward_expand(b.g.gf, ksq);
        return ksq;
    }
    ggml_tensor * kadd = kc ? sparq_ubatch_sums(b, kc, GGML_TYPE_F32, true) : sparq_ubatch_sums(b, k_cur, k->type, true);
    ggml_tensor * ksq = ggml_add_inplace(ctx0, kdst, kadd);
    ggml_build_forward_expand(b.g.gf, ksq);
    return ksq;
}

// a per-cell tensor [kv_size, hkv, n_stream] with the ubatch's cells set to value
ggml_tensor * sparq_set_new_cells(sparq_attn_build & b, ggml_tensor * t, float value, const char * name) {
    ggml_context * ctx0 = b.ctx0;
    ggml_tensor * fill = ggml_fill(ctx0, ggml_new_tensor_2d(ctx0, GGML_TYPE_F32, b.hkv, b.n_tokens), value);
    ggml_tensor * t4 = ggml_reshape_4d(ctx0, t, t->ne[0], t->ne[1], 1, t->ne[2]);
    ggml_tensor * out = ggml_sparq_cell_scatter(ctx0, t4, fill, sparq_k_idxs(b));
    ggml_format_name(out, "%s-%d", name, b.il); // sparq_lab.capture reads the tensor here, before the op
    ggml_build_forward_expand(b.g.gf, out);
    return out;
}

bool sparq_reads_kept_window(const sparq_attn_build & b) {
    return b.n_tps == 1 && b.inp && sparq_op_kept_window(b.L, b.P, b.l, b.inp->win_device);
}

bool sparq_appends_in_op(const sparq_attn_build & b) {
    return b.n_tps == 1 && b.inp && sparq_op_appends(b.S, b.L, b.P, b.l, sparq_reads_kept_window(b));
}

void sparq_appends_into_op(sparq_attn_build & b) {
    b.inp->appends = true;
    b.appends_in_op = true;
    b.vc_src = sparq_count_view(b, b.L.data.vcount);
    if (sparq_reads_kept_window(b)) {
        b.inp->win_layers.push_back(b.ikv);
        b.win_pushed = true;
    }
    if (b.sel->appends) {
        b.sel->appends(b);
    }
}

// appends keep K^T and the V sums current on every ubatch that writes this layer's cache
// (prompt ubatches too: cheaper than rebuilding the data at the next decode step)
void sparq_build_appends(sparq_attn_build & b, ggml_tensor * k_cur, ggml_tensor * v_cur, const ggml_tensor * k,
                         const ggml_tensor * v) {
    b.inp->appends = true;
    ggml_tensor * kc = nullptr;
    if (ggml_is_quantized(k->type)) {
        // a quantized cache's keys as it holds them, quantized and back, for K^T (f16) and the sums of k^2
        kc = ggml_reshape_3d(b.ctx0, ggml_is_contiguous(k_cur) ? k_cur : ggml_cont(b.ctx0, k_cur), b.d, b.hkv, b.n_tokens);
        kc = sparq_as_cached(b.ctx0, kc, k->type);
    }
    if (sparq_unrotates(b.S, b.L)) {
        // upstream rotated them (a quantized K cache): rotated back, as the host rebuild does (the same
        // fast Walsh-Hadamard transform on the CPU: the same bits)
        GGML_ASSERT(kc && "llama_sparq: upstream's Hadamard rotation without a quantized K cache");
        kc = llama_mul_mat_hadamard(b.ctx0, kc, b.L.data.hrot);
    }
    b.kt_src = sparq_append_keys(b, k_cur, kc, k);
    if (b.n_tps == 1 && b.L.data.win) {
        // a decode step: the same node pushes each stream's new cell into the layer's device window
        // (in every graph of a step, whether or not an op reads it, so that all layers stay alike)
        ggml_sparq_cell_scatter_set_window(b.kt_src, b.L.data.win);
        b.inp->win_layers.push_back(b.ikv);
        b.win_pushed = true;
    }
    b.vs_src = sparq_append_values(b, v_cur, v);
    b.ksq_src = sparq_append_ksq(b, k_cur, kc, k);
    if (b.sel->appends) {
        b.sel->appends(b);
    }
}
