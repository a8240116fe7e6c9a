// llama-sparq: the settings resolved into the op's parameters, and the probe node the settings' check
// puts to the devices (llama-sparq-op.h).
#include "llama-sparq-op.h"

#include "llama-sparq-selector.h"
#include "llama-sparq-state.h"

#include "ggml-backend.h"

#include <algorithm>
#include <cmath>

// r's default for head size d: d / 4 with a 16-bit K^T; 5 d / 16 (rounded) with an 8-bit one, whose
// step 1 then kept the approximate top-k's recall of f16 at d / 4 on SmolLM2 (the rounding to e5m2
// costs what the extra components give back) for 5/8 of its bytes (bench/coverage.py --kt-formats);
// 3 d / 8 (rounded) with a 4-bit one, which kept e5m2's at 5 d / 16 on both real models for 3/4 of
// its bytes (bench/results/coverage_kt4_*.md)
static int32_t sparq_default_r(int64_t d, int32_t kt_bits) {
    return (int32_t) std::max<int64_t>(1, kt_bits == 8 ? (5 * d + 8) / 16 : kt_bits == 4 ? (3 * d + 4) / 8 : d / 4);
}

sparq_op_budget sparq_op_budget_of(const llama_sparq_params & p, int64_t d, int64_t n_kv, int g) {
    const sparq_selector & sel = sparq_selector_of(p.selector);
    sparq_op_budget b;
    b.r = p.r > 0 ? std::min<int>(p.r, (int) d) : sparq_default_r(d, p.kt_bits);
    // k = 0 with a selector that ranks by scores: the op cuts its choice at the coverage target
    b.calibrated = p.k == 0 && sel.ranks_scores;
    b.kk = p.k;
    if (b.calibrated) {
        // at least k_min cells, at most k_frac of the graph's KV cells (the cap sizes the op's scratch)
        const double cap = std::ceil((double) p.k_frac * (double) n_kv);
        b.kk = (int) std::min<double>(GGML_SPARQ_K_MAX, std::max<double>(p.k_min, cap));
    }
    b.l = sel.window ? sel.window(b.kk) : p.l >= 0 ? p.l : (b.calibrated ? p.k_min : b.kk) / 4;
    b.l = std::min(b.l, b.kk);
    b.per_head = p.gqa == LLAMA_SPARQ_GQA_PER_HEAD && g > 1 && sel.per_head;
    return b;
}

ggml_sparq_attn_params sparq_op_params(const llama_sparq_ctx & S, const sparq_layer & L, const llama_sparq_params & p,
                                       const sparq_op_budget & b, const sparq_op_step & st, float scale) {
    // (the selector's value is the op's: sparq_selector_of asserts the numbering)
    const sparq_selector & sel = sparq_selector_of(p.selector);
    ggml_sparq_attn_params o = ggml_sparq_attn_params_default(b.r, b.kk, b.l, scale * L.logit_mul);
    o.selector = p.selector;
    o.flags = (b.per_head ? GGML_SPARQ_FLAG_PER_HEAD : 0) | (p.mean_v && sel.ranks_scores ? 0 : GGML_SPARQ_FLAG_NO_MEAN_V);
    o.softcap = L.softcap;
    o.max_bias = L.max_bias;
    if (sel.op_params) {
        sel.op_params(S, p, o);
    }
    if (sel.ranks_scores) {
        if (b.calibrated) {
            // the calibrated k's cut, with each row's cap from its own stream's cells (kk, from the graph's
            // KV view, follows the longest stream of the ubatch: a request's choice must not depend on who
            // else is decoding)
            o.cov_p = p.coverage;
            o.k_min = std::min(p.k_min, b.kk);
            o.cov_apply = true;
            o.k_frac = p.k_frac;
        } else {
            o.topk_buckets = p.topk_buckets; // (a fixed k: kk is p.k)
            if (st.measure) {
                // the guard's measure of a fixed k at the first SparQ step (reported, not applied)
                o.cov_p = p.coverage;
                o.k_scan = (int) std::max<int64_t>(b.kk, st.n_kv / 4);
            }
        }
    }
    return o;
}

bool sparq_op_reports(const sparq_layer & L, bool calibrated) {
    return L.report.entries.size() > 0 && (!L.report.entries.device() || calibrated);
}

bool sparq_op_kept_window(const sparq_layer & L, const llama_sparq_params & p, int l, bool win_device) {
    const sparq_selector & sel = sparq_selector_of(p.selector);
    return l > 0 && win_device && L.data.win && !sel.window_choice && !sel.window && l <= L.data.win->ne[0];
}

bool sparq_op_appends(const llama_sparq_ctx & S, const sparq_layer & L, const llama_sparq_params & p, int l,
                      bool kept_window) {
    const bool rotated = (p.basis == LLAMA_SPARQ_BASIS_PCA && L.basis.rot) || sparq_unrotates(S, L);
    const bool host_window = !kept_window && (l > 0 || sparq_selector_of(p.selector).window_choice);
    return !rotated && !host_window && L.data.kt && ggml_backend_buffer_is_host(L.data.kt->buffer);
}

ggml_tensor * sparq_op_probe(ggml_context * c, const llama_sparq_ctx & S, const sparq_layer & L,
                             const llama_sparq_params & p, int64_t n_kv, bool measure, const char ** why) {
    const int64_t d = L.data.kt->ne[1], hkv = L.data.kt->ne[2], dv = L.data.vsum->ne[0], n = n_kv;
    const int g = (int) std::max<int64_t>(1, L.n_head / std::max<int64_t>(1, hkv));
    const sparq_op_budget b = sparq_op_budget_of(p, d, n, g);
    sparq_op_step st;
    st.n_kv = n;
    st.measure = measure;
    // (soft-capping runs with the calls' logit scale 1: sparq_attn_variant; Grok's out_scale is the layer's logit_mul)
    const ggml_sparq_attn_params o = sparq_op_params(S, L, p, b, st, L.softcap > 0.0f ? 1.0f : 1.0f / std::sqrt((float) d));
    const sparq_selector & sel = sparq_selector_of(p.selector);

    ggml_sparq_attn_srcs src = {};
    src.q  = ggml_new_tensor_4d(c, GGML_TYPE_F32, d, 1, (int64_t) g * hkv, 1);
    src.k  = ggml_new_tensor_4d(c, L.type_k, d, n, hkv, 1);
    src.kt = ggml_new_tensor_4d(c, L.data.kt->type, n, d, hkv, 1);
    src.v  = ggml_new_tensor_4d(c, L.type_v, dv, n, hkv, 1);
    src.v_sum = ggml_new_tensor_3d(c, GGML_TYPE_F32, dv, hkv, 1);
    src.v_count = ggml_new_tensor_1d(c, GGML_TYPE_F32, 1);
    src.mask = ggml_new_tensor_4d(c, GGML_TYPE_F16, n, 1, 1, 1);
    const bool kept = sparq_op_kept_window(L, p, o.l, true);
    if (sparq_op_appends(S, L, p, o.l, kept)) {
        // a steady decode step: the op appends its cell, into the kept window where it reads one
        src.cells = ggml_new_tensor_1d(c, GGML_TYPE_I64, 1);
        src.v_comp = ggml_new_tensor_3d(c, GGML_TYPE_F32, dv, hkv, 1);
        src.k_sq = ggml_new_tensor_3d(c, GGML_TYPE_F32, d, hkv, 1);
        if (kept) {
            src.win = ggml_new_tensor_3d(c, GGML_TYPE_I32, L.data.win->ne[0], 1, 1);
        }
    } else if (o.l > 0 || sel.window_choice) {
        src.win = ggml_new_tensor_3d(c, GGML_TYPE_I32, sel.window_choice ? o.k : o.l, 1, 1);
    }
    if (sel.probe_srcs) {
        sel.probe_srcs(c, S, L, p, src);
    }
    if (sel.ranks_scores && sparq_op_reports(L, b.calibrated)) {
        src.report = ggml_new_tensor_3d(c, GGML_TYPE_F32, 4, hkv, 1);
    }
    if (L.sinks) {
        src.sinks = ggml_new_tensor_1d(c, GGML_TYPE_F32, (int64_t) g * hkv);
    }
    if (L.kq_b) {
        src.kq_b = ggml_new_tensor_4d(c, GGML_TYPE_F32, n, 1, (int64_t) g * hkv, 1);
    }
    if ((*why = ggml_sparq_attn_check(&src, &o)) != nullptr) {
        return nullptr;
    }
    return ggml_sparq_attn_ext(c, &src, &o);
}
