// llama-sparq: the hook in build_attn (llama-sparq-graph.h): per attention call, SparQ or dense
// and why, the appends that keep K^T and the sums current (llama-sparq-graph-appends.cpp), and the
// SPARQ_ATTN node with its inputs.
#include "llama-sparq-graph.h"

#include "llama-sparq-buffers.h"
#include "llama-sparq-cost.h"
#include "llama-sparq-graph-appends.h"
#include "llama-sparq-graph-build.h"
#include "llama-sparq-graph-input.h"
#include "llama-sparq-op.h"
#include "llama-sparq-rows.h"
#include "llama-sparq-selector.h"
#include "llama-sparq-state.h"
#include "llama-sparq-upstream.h"

#include "ggml-backend.h"
#include "ggml-sparq.h"
#include "llama-graph.h"

#include <cstdint>
#include <memory>
#include <vector>

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
    c.dv = (double) v->ne[0];
    c.bk = sparq_elem_bytes(k->type);
    c.bv = sparq_elem_bytes(v->type);
    c.bt = sparq_elem_bytes(b.L.data.kt->type);
    b.sel->decide(b, c);
    if (b.inp && !b.inp->decisions.empty()) {
        b.inp->decisions.back().ikv = b.ikv;
    }
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
    src.v_count = v_count;
    src.mask = kq_mask;
    if (b.appends_in_op) {
        // the op appends the step's cell itself (it writes K^T, the sums and the count in place)
        auto streams = [&](ggml_tensor * t, int64_t n) {
            return ggml_view_3d(ctx0, t, n, hkv, n_stream, t->nb[1], t->nb[2], b.si.s0 * t->nb[2]);
        };
        src.v_sum = streams(L.data.vsum, v->ne[0]);
        src.v_comp = streams(L.data.vcomp, v->ne[0]);
        src.k_sq = streams(L.data.ksq, d);
        src.cells = sparq_k_idxs(b);
        return src;
    }
    src.v_sum = ggml_view_3d(ctx0, b.vs_src, v->ne[0], hkv, n_stream, L.data.vsum->nb[1], L.data.vsum->nb[2], 0);
    return src;
}

// the SPARQ_ATTN node on the layout of build_attn_mha, with its selector's inputs, window and report
static ggml_tensor * sparq_build_op(sparq_attn_build & b, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                                    ggml_tensor * kq_mask, ggml_tensor * sinks, ggml_tensor * kq_b, float kq_scale) {
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
            }
        }
    }
    const ggml_tensor * dwin = b.L.data.win;
    if (b.appends_in_op && b.win_pushed) {
        // the kept window, every entry (the op pushes the step's cell into it, then reads the first l)
        src.win = ggml_view_3d(ctx0, b.L.data.win, dwin->ne[0], 1, n_stream, dwin->nb[1], dwin->nb[1], b.si.s0 * dwin->nb[1]);
        inp->win_read = true;
    } else if (l > 0 && b.win_pushed && inp->win_device && !b.sel->window_choice && !b.sel->window && l <= dwin->ne[0]) {
        // a decode step whose every new cell is its sequence's latest: the device window after the K^T
        // append's push (the op reads it after that node: it reads K^T from it), its first l entries
        src.win = ggml_view_3d(ctx0, b.L.data.win, l, 1, n_stream, dwin->nb[1], dwin->nb[1], b.si.s0 * dwin->nb[1]);
        inp->win_read = true;
    } else if (l > 0 || b.sel->window_choice) {
        // a whole choice (window_choice): the window's l cells, then the k - l cells of the earliest positions
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
    src.sinks = sinks;
    if (kq_b) {
        // build_attn_mha's bias [n_kv, n_tokens, n_head, 1], its rows split into the streams as q's
        src.kq_b = ggml_view_4d(ctx0, kq_b, kq_b->ne[0], n_tps, kq_b->ne[2], n_stream, kq_b->nb[1], kq_b->nb[2],
                                kq_b->nb[1] * n_tps, 0);
    }
    const ggml_sparq_attn_params o = sparq_op_params(b.S, b.L, b.P, b.budget, st, kq_scale);
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
    // or its context runs dense at every step (sparq_dense_always). On a decode step that runs the op
    // the op appends itself (sparq_appends_in_op); otherwise they are nodes of their own, built below
    const bool appends = k_cur && v_cur && !(inp && inp->skip);

    sparq_attn_call call;
    call.kq_b = kq_b;
    call.sinks = sinks;
    call.v_mla = v_mla;
    call.dk = b.d;
    call.dv = v->ne[0];
    call.n_head = q->ne[1];
    call.kq_scale = kq_scale;
    call.n_kv = b.n_kv;
    call.n_tokens = b.n_tokens;
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
    if (appends && reason < 0 && sparq_appends_in_op(b)) {
        sparq_appends_into_op(b);
    } else if (appends) {
        sparq_build_appends(b, k_cur, v_cur, k, v);
    }
    if (appends && reason == LLAMA_SPARQ_DENSE_PREFILL && b.sel->prompt) {
        b.sel->prompt(b, q, k, kq_mask, kq_scale * b.L.logit_mul);
    }
    if (reason >= 0 || !appends) {
        // SparQ needs this ubatch's keys in K^T: without appends (k_cur == nullptr) stay dense
        sparq_decide(inp, il, reason >= 0 ? reason : LLAMA_SPARQ_DENSE_NO_CACHE);
        return nullptr;
    }
    sparq_decide_sparq(b, k, v);
    ggml_tensor * cur = sparq_build_op(b, q, k, v, kq_mask, sinks, kq_b, kq_scale);
    sparq_place_op(b, cur);
    if (v_mla) {
        // MLA: the latent output [dv, n_head, n_tps, ns] through each head's v_mla, as build_attn_mha's
        // flash-attention path does (one product with the tokens in dimension 1)
        cur = ggml_permute(ctx0, cur, 0, 2, 1, 3);
        cur = ggml_mul_mat(ctx0, v_mla, cur);
        cur = ggml_cont(ctx0, ggml_permute(ctx0, cur, 0, 2, 1, 3));
    }
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
