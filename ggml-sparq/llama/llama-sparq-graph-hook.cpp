// llama-sparq: the hook in build_attn (llama-sparq-graph.h): per attention call, SparQ or dense
// and why, the appends that keep K^T and the sums current, and the SPARQ_ATTN node with its inputs.
#include "llama-sparq-graph.h"
#include "llama-sparq-graph-build.h"

#include "llama-kv-cache-iswa.h"
#include "llama-memory-hybrid.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

uint32_t sparq_used_max(const llama_kv_cache_context * m) {
    const auto & si = upstream::sinfo(m);
    uint32_t n = 0;
    for (uint32_t s = 0; s < si.n_stream(); ++s) {
        n = std::max(n, upstream::cells(upstream::cache(m), si.strm[s]).get_used());
    }
    return n;
}

// Under the dense threshold a graph needs SparQ's data only to keep it current for later, which costs
// its appends at every ubatch (on a GPU a few small launches per layer, 5-10 % of a dense decode step).
// Well under it a graph builds none of SparQ's nodes: its streams are then marked stale (the graph input
// has no appends: keep_streams_current) and rebuilt once, from K, V and the cells, by the first graph
// that appends again. The floor is one ubatch below min_kv: a stream gains at most n_ubatch cells per
// ubatch, so the first graph at or over the floor still holds fewer than min_kv cells and runs dense
// (short, or a prompt): the rebuild comes before the first SparQ step, never at it, and the appends
// run for at most one ubatch's worth of cells (min_kv <= n_ubatch: always). Selectors whose state
// follows every step (every_step: h2o's scores, a prompt's attention included) are never skipped; they
// run SparQ under the threshold too.
uint32_t sparq_append_floor(const llama_sparq_ctx & S, uint32_t n_ubatch) {
    const llama_sparq_params & P = S.params;
    if (sparq_selector_of(P.selector).every_step || P.min_kv <= 0 || (uint32_t) P.min_kv <= n_ubatch) {
        return 0;
    }
    return (uint32_t) P.min_kv - n_ubatch;
}

bool sparq_shared_stream(const llama_cparams & cp) {
    return cp.kv_unified && cp.n_seq_max > 1;
}

// A context whose every step runs dense whatever its length: several sequences in one unified stream
// (its kv_unified and n_seq_max are fixed for the context's life), or a dense threshold over the cells
// a stream holds (until the settings change: a new graph then appends again and rebuilds first, as
// over the floor). Its graphs build none of SparQ's nodes, as under the floor; selectors that follow
// every step run SparQ under the threshold and keep their appends.
int sparq_dense_always(const llama_sparq_ctx & S, const llama_cparams & cp) {
    if (sparq_shared_stream(cp)) {
        return LLAMA_SPARQ_DENSE_SHARED_STREAM;
    }
    const llama_sparq_params & P = S.params;
    if (!sparq_selector_of(P.selector).every_step && P.min_kv > 0 && (uint32_t) P.min_kv > upstream::kv_size(S.kv)) {
        return LLAMA_SPARQ_DENSE_SHORT;
    }
    return -1;
}

bool sparq_appends_skipped(const llama_sparq_ctx & S, const llama_kv_cache_context * m, const llama_cparams & cp) {
    if (sparq_dense_always(S, cp) >= 0) {
        return true;
    }
    const uint32_t floor = sparq_append_floor(S, cp.n_ubatch);
    return floor > 0 && sparq_used_max(m) < floor;
}

int sparq_rows_mode(const llama_sparq_ctx & S, const llama_ubatch & ub, uint32_t n_stream,
                    std::vector<uint8_t> * prompt) {
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

int sparq_stretch_rows(const llama_sparq_ctx & S, const llama_kv_cache::slot_info & si, const std::vector<uint8_t> & prompt,
                       std::vector<uint8_t> & rows) {
    const llama_sparq_params & P = S.params;
    rows.assign(si.n_stream(), SPARQ_ROW_SPARQ);
    uint32_t n_dec = 0, n_in = 0;
    for (uint32_t s = 0; s < si.n_stream(); ++s) {
        if (s < prompt.size() && prompt[s]) {
            continue; // a prompt row: dense anyway
        }
        const uint32_t strm = si.strm[s];
        if (upstream::cells(S.kv, strm).get_used() < (uint32_t) P.min_kv) {
            rows[s] = SPARQ_ROW_SHORT; // under the dense threshold, as alone
        }
        n_dec++;
        n_in += rows[s] != SPARQ_ROW_SPARQ;
    }
    return n_in == 0 ? SPARQ_STRETCH_NONE : n_in == n_dec ? SPARQ_STRETCH_ALL : SPARQ_STRETCH_SOME;
}

const llama_kv_cache_context * sparq_base_mctx(const llama_memory_context_i * m) {
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

// ---------------------------------------------------------------------------
// the graph hook
// ---------------------------------------------------------------------------

// the graph's SparQ input (one per graph, shared by its layers): the one the graph has, else added
// here when the graph's memory context (plain, iswa or hybrid) gives the full-attention cache's; or NULL
static llm_graph_input_sparq * sparq_graph_input(const llm_graph_context & g, const llama_kv_cache_context * mctx,
                                                 bool same_cache) {
    const auto & cp = g.cparams;
    llama_sparq_ctx & S = *cp.sparq;
    llm_graph_input_sparq * inp = nullptr;
    for (auto & in : g.res->inputs) {
        if ((inp = dynamic_cast<llm_graph_input_sparq *>(in.get())) != nullptr) {
            break;
        }
    }
    if (!inp) {
        // the graph's memory context (plain, iswa or hybrid) gives the full-attention cache's
        const llama_kv_cache_context * base = same_cache ? mctx : sparq_base_mctx(g.mctx);
        if (base && upstream::cache(base) == S.kv) {
            inp = (llm_graph_input_sparq *) g.res->add_input(std::make_unique<llm_graph_input_sparq>(cp.sparq, base));
            inp->rows_mode = sparq_rows_mode(S, g.ubatch, upstream::sinfo(base).n_stream());
            inp->win_device = sparq_rows_latest(S, g.ubatch, upstream::sinfo(base));
            inp->skip = sparq_appends_skipped(S, base, cp);
        }
    }
    return inp;
}

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

// x (f32) as the cache of type `type` holds it: rounded to that type and back (f32: as it is; q8_0:
// quantized by the CPU's quantizer, the one the cache's set_rows uses, and dequantized)
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
// nodes below: one new token per stream, an f16 or f32 cache (a q8_0 one rounds through its quantizer)
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

// appends keep K^T and the V sums current on every ubatch that writes this layer's cache
// (prompt ubatches too: cheaper than rebuilding the data at the next decode step)
static void sparq_build_appends(sparq_attn_build & b, ggml_tensor * k_cur, ggml_tensor * v_cur, const ggml_tensor * k,
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

// why this call runs dense, as far as the call itself, the settings and the cache's longest
// sequence decide: reason, an LLAMA_SPARQ_DENSE_* reason or -1; short_checked: the dense threshold
// was looked at, is_short its side (graph reuse compares it)
struct sparq_dense_check {
    int reason = -1;
    bool short_checked = false;
    bool is_short = false;
};

static sparq_dense_check sparq_dense_reason(const sparq_attn_build & b, const llama_kv_cache_context * mctx,
                                            const sparq_attn_call & call) {
    const llm_graph_context & g = b.g;
    const auto & cp = g.cparams;
    sparq_dense_check c;
    if (sparq_attn_variant(g.arch, g.hparams, &call)) {
        c.reason = LLAMA_SPARQ_DENSE_ATTN_VARIANT;
    } else if (sparq_shared_stream(cp)) {
        c.reason = LLAMA_SPARQ_DENSE_SHARED_STREAM;
    } else if ((b.n_tps > 1 && !b.P.all_rows) || (b.inp && b.inp->rows_mode == SPARQ_ROWS_DENSE)) {
        c.reason = LLAMA_SPARQ_DENSE_PREFILL; // prompt rows only
    } else if (!b.sel->every_step) {
        c.short_checked = true;
        c.is_short = sparq_used_max(mctx) < (uint32_t) b.P.min_kv;
        if (c.is_short) {
            c.reason = LLAMA_SPARQ_DENSE_SHORT;
        }
    }
    return c;
}

// per stream, as alone: a stream under the dense threshold (the longest decides the threshold in
// sparq_dense_reason) runs dense. Records each stream's rows in the graph's input (graph reuse
// compares them) and sets b.stretch when some decode rows, not all, run dense (upstream's attention,
// picked); returns the reason when every decode row does, else -1
static int sparq_record_stretches(sparq_attn_build & b) {
    std::vector<uint8_t> prompt;
    sparq_rows_mode(b.S, b.g.ubatch, (uint32_t) b.n_stream, &prompt);
    sparq_stretch & st = b.inp->stretch[b.ikv];
    st.mode = sparq_stretch_rows(b.S, b.si, prompt, st.rows);
    b.stretch = st.mode == SPARQ_STRETCH_SOME;
    return st.mode == SPARQ_STRETCH_ALL ? LLAMA_SPARQ_DENSE_SHORT : -1;
}

// the SparQ decision with the cost model's terms: the bytes of the cache's elements (K and V rows of
// its types, K^T's), the selector's own terms (its decide hook records the decision)
static void sparq_decide_sparq(sparq_attn_build & b, const ggml_tensor * k, const ggml_tensor * v) {
    sparq_cost c;
    c.d = (double) b.d;
    c.bk = sparq_elem_bytes(k->type);
    c.bv = sparq_elem_bytes(v->type);
    c.bt = sparq_elem_bytes(b.L.data.kt->type);
    b.sel->decide(b, c);
}

// the op's required sources on the layout of build_attn_mha (src.q: the query's view)
static ggml_sparq_attn_srcs sparq_op_srcs(sparq_attn_build & b, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                                          ggml_tensor * kq_mask) {
    ggml_context * ctx0 = b.ctx0;
    const sparq_layer & L = b.L;
    const int64_t n_stream = b.n_stream, n_tps = b.n_tps, n_kv = b.n_kv, d = b.d, hkv = b.hkv;
    // the valid-cell counts: the layer's kept ones (appended above, on the device)
    ggml_tensor * v_count = b.vc_src;
    GGML_ASSERT(v_count && "llama_sparq: the op without the appends");

    // the layout of build_attn_mha: q [d, n_tps, n_head, ns], k/v [d, n_kv, n_head_kv, ns]
    ggml_sparq_attn_srcs src = {};
    ggml_tensor * q4 = ggml_view_4d(ctx0, q, q->ne[0], q->ne[1], n_tps, n_stream, q->nb[1], q->nb[2], q->nb[2] * n_tps, 0);
    q4 = ggml_permute(ctx0, q4, 0, 2, 1, 3);
    src.q = q4->type == GGML_TYPE_F32 ? q4 : ggml_cast(ctx0, q4, GGML_TYPE_F32);
    src.k = ggml_permute(ctx0, k, 0, 2, 1, 3);
    src.kt = ggml_view_4d(ctx0, b.kt_src, n_kv, d, hkv, n_stream, L.data.kt->nb[1], L.data.kt->nb[2], L.data.kt->nb[3],
                          b.si.s0 * L.data.kt->nb[3]);
    src.v = ggml_permute(ctx0, v, 0, 2, 1, 3);
    src.v_sum = ggml_view_3d(ctx0, b.vs_src, v->ne[0], hkv, n_stream, L.data.vsum->nb[1], L.data.vsum->nb[2], 0);
    src.v_count = v_count;
    src.mask = kq_mask;
    return src;
}

// the SPARQ_ATTN node on the layout of build_attn_mha, with its selector's inputs, window and report
static ggml_tensor * sparq_build_op(sparq_attn_build & b, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                                    ggml_tensor * kq_mask, float kq_scale) {
    ggml_context * ctx0 = b.ctx0;
    llm_graph_input_sparq * inp = b.inp;
    const int64_t n_stream = b.n_stream, n_tps = b.n_tps, hkv = b.hkv;
    const int l = b.l, kk = b.kk;
    ggml_sparq_attn_srcs src = sparq_op_srcs(b, q, k, v, kq_mask);
    if (b.sel->op_srcs) {
        b.sel->op_srcs(b, src.q, src);
    }
    sparq_op_step st;
    st.n_kv = b.n_kv;
    if (b.sel->ranks_scores) {
        // the op reports its choice into the layer's report (the counters read it after the step): the
        // calibrated k's cut, or the guard's measure of a fixed k at the first SparQ step. A CPU op writes
        // host memory; a device's report is copied to the host after the step (with the calibrated k,
        // whose cells the counters count); an RPC host's is not read
        const bool reports = sparq_op_reports(b.L, b.calibrated);
        if (reports) {
            ggml_tensor * rep = b.L.data.report;
            src.report = ggml_view_3d(ctx0, rep, 4, hkv, n_stream, rep->nb[1], rep->nb[2], b.si.s0 * rep->nb[2]);
            if (!b.calibrated) {
                st.measure = b.S.stats.measure_due;
                inp->measure = st.measure ? 1 : 0; // (graph reuse compares it: only where it is measured)
            }
            inp->reports.push_back({ b.ikv, b.si.s0, n_stream });
            if (!inp->decisions.empty()) {
                inp->decisions.back().report = true;
                inp->decisions.back().ikv_rep = b.ikv;
            }
        }
    }
    const ggml_tensor * dwin = b.L.data.win;
    if (l > 0 && b.win_pushed && inp->win_device && !b.sel->window_choice && !b.sel->window && l <= dwin->ne[0]) {
        // a decode step whose every new cell is its sequence's latest: the device window after the K^T
        // append's push (the op reads it after that node: it reads K^T from it), its first l entries
        src.win = ggml_view_3d(ctx0, b.L.data.win, l, 1, n_stream, dwin->nb[1], dwin->nb[1], b.si.s0 * dwin->nb[1]);
        inp->win_read = true;
    } else if (l > 0 || b.sel->window_choice) {
        // a whole choice (streaming): the window's l cells, then the k - l cells of the earliest positions
        const int w = b.sel->window_choice ? kk : l;
        if (!inp->win) {
            inp->win = ggml_new_tensor_3d(ctx0, GGML_TYPE_I32, w, n_tps, n_stream);
            ggml_set_input(inp->win);
            ggml_set_name(inp->win, "sparq_win");
            inp->win_recent = l;
        }
        GGML_ASSERT(inp->win->ne[0] == w && inp->win_recent == l);
        src.win = inp->win;
    }
    const ggml_sparq_attn_params o = sparq_op_params(b.S, b.P, b.budget, st, kq_scale);
    ggml_tensor * cur = ggml_sparq_attn_ext(ctx0, &src, &o);
    ggml_format_name(cur, "sparq_attn-%d", b.il);
    return cur;
}

// where the op runs: where the layer's K^T is, pinned there. Left to itself ggml's scheduler
// places the op by its neighbours (it does not see the K^T view's buffer before allocation): with
// --no-kv-offload beside a GPU or an RPC host it ran the op there and copied the layer's K, K^T
// and V over at every step, and an RPC host crashed writing the op's report (an address of this
// process). K^T in host memory: this process's CPU backend. On a device that runs the node (a
// GPU, an RPC host): that device's backend, counted in n_sparq_device; on one that does not: the
// CPU, copying the layer's cache (logged once).
static void sparq_place_op(sparq_attn_build & b, ggml_tensor * cur) {
    ggml_backend_sched_t sched = b.g.sched;
    ggml_backend_t where = b.g.backend_cpu;
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(ggml_backend_buffer_get_type(b.L.data.kt->buffer));
    if (dev && ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU && !ggml_backend_buffer_is_host(b.L.data.kt->buffer)) {
        sparq_decision & dc = b.inp->decisions.back();
        dc.device = ggml_backend_dev_supports_op(dev, cur) ? 1 : 2;
        dc.device_name = ggml_backend_dev_name(dev);
        if (dc.device == 1) {
            where = nullptr; // the device's backend in this scheduler (none found: left to the scheduler)
            for (int i = 0; sched && i < ggml_backend_sched_get_n_backends(sched); ++i) {
                ggml_backend_t be = ggml_backend_sched_get_backend(sched, i);
                if (ggml_backend_get_device(be) == dev) {
                    where = be;
                    break;
                }
            }
        }
    }
    if (sched && where) {
        ggml_backend_sched_set_tensor_backend(sched, cur, where);
    }
}

// the most nodes (tensors) the hook adds per layer with SparQ data: the appends to K^T, the V sums and
// the sums of k^2 (with a quantized cache's rounding), the op with its views and selector inputs, and a
// ubatch's dense attention beside it (prompt rows or short rows, picked per row); about 85 counted
constexpr uint32_t SPARQ_GRAPH_NODES_PER_LAYER = 128;

uint32_t llama_sparq_graph_nodes(const llama_cparams & cparams) {
    const llama_sparq_ctx * S = cparams.sparq.get();
    return S && S->params.enabled ? SPARQ_GRAPH_NODES_PER_LAYER * (uint32_t) S->n_layers : 0;
}

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
    ggml_context * ctx0 = g.ctx0;

    const bool same_cache = mctx && upstream::cache(mctx) == S.kv;
    llm_graph_input_sparq * inp = sparq_graph_input(g, mctx, same_cache);

    if (is_swa || (mctx && !same_cache)) {
        sparq_decide(inp, il, LLAMA_SPARQ_DENSE_SWA);
        return nullptr;
    }
    if (!mctx || cp.training) {
        return nullptr; // not a cache-backed layer: nothing to count against
    }
    const int32_t ikv = upstream::ikv_of(S.kv, il);
    if (ikv < 0 || !S.layers[ikv].data.kt) {
        sparq_decide(inp, il, ikv < 0 ? LLAMA_SPARQ_DENSE_NO_CACHE : S.layers[ikv].reason);
        return nullptr;
    }
    sparq_attn_build b(g, mctx, S, inp, il, ikv, q, k);

    // appends keep K^T and the V sums current on every ubatch that writes this layer's cache
    // (prompt ubatches too: cheaper than rebuilding the data at the next decode step), unless the
    // graph is well under the dense threshold (sparq_append_floor: then it runs dense, short or a prompt)
    // or its context runs dense at every step (sparq_dense_always)
    const bool appends = k_cur && v_cur && !(inp && inp->skip);
    if (appends) {
        sparq_build_appends(b, k_cur, v_cur, k, v);
    }

    sparq_attn_call call;
    call.kq_b = kq_b;
    call.sinks = sinks;
    call.v_mla = v_mla;
    call.dk = b.d;
    call.dv = v->ne[0];
    const sparq_dense_check dense = sparq_dense_reason(b, mctx, call);
    if (dense.short_checked && inp) {
        inp->short_ctx = dense.is_short;
    }
    int reason = dense.reason;
    // a graph without appends under the floor is dense by the threshold, or already by an earlier reason
    GGML_ASSERT((reason >= 0 || !inp || !inp->skip) && "llama_sparq: appends skipped in a graph that runs SparQ");
    if (reason < 0 && inp && b.n_tps == 1 && !b.sel->every_step) {
        reason = sparq_record_stretches(b);
    }
    if (appends && reason == LLAMA_SPARQ_DENSE_PREFILL && b.sel->prompt) {
        b.sel->prompt(b, q, k, kq_mask, kq_scale);
    }
    if (reason >= 0 || !appends) {
        // SparQ needs this ubatch's keys in K^T: without appends (k_cur == nullptr) stay dense
        sparq_decide(inp, il, reason >= 0 ? reason : LLAMA_SPARQ_DENSE_NO_CACHE);
        return nullptr;
    }
    sparq_decide_sparq(b, k, v);
    ggml_tensor * cur = sparq_build_op(b, q, k, v, kq_mask, kq_scale);
    sparq_place_op(b, cur);
    ggml_tensor * out = ggml_reshape_2d(ctx0, cur, cur->ne[0] * cur->ne[1], cur->ne[2] * cur->ne[3]);
    if (inp->rows_mode == SPARQ_ROWS_MIXED || b.stretch) {
        // prompt rows beside decode rows, or streams under the dense threshold beside streams the op
        // runs: those rows get upstream's dense attention, as alone; the pick copies rows, so each is
        // bit-identical to the one it comes from (a layer with such rows has its own pick).
        ggml_tensor * dense = g.build_attn_mha(q, k, v, kq_b, kq_mask, sinks, v_mla, 0, kq_scale, il);
        GGML_ASSERT(dense->type == GGML_TYPE_F32 && ggml_are_same_shape(dense, out));
        ggml_tensor *& pick = b.stretch ? inp->layer_pick[b.ikv] : inp->pick;
        if (!pick) {
            pick = ggml_new_tensor_1d(ctx0, GGML_TYPE_I32, b.n_tokens);
            ggml_set_input(pick);
            ggml_format_name(pick, b.stretch ? "sparq_pick-%d" : "sparq_pick", il);
        }
        out = ggml_get_rows(ctx0, ggml_concat(ctx0, out, dense, 1), pick);
    }
    return out;
}
