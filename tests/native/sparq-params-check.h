// llama-sparq: the op's typed parameters (ggml-sparq-params.h) checked through ggml: every field the
// constructor wrote comes back from the one decoder, the layout keeps its free slots, bad nodes are
// refused with their reason, the same bytes decode alike in another tensor (what an RPC
// server receives), every optional part maps to its feature bit, the CPU backend (through ggml's
// supports_op) and the CUDA support check (host code, no GPU needed) honour or refuse each part as
// they declare, and a part or a selector this build does not know, or another layout version, is
// refused by both.
// Included by sparq-op-test.cpp (ggml builds only): `sparq-op-test params-check`.
#pragma once

#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-sparq.h"
#include "sparq-cuda-support.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>

static int params_fail(const char * what, const char * detail = "") {
    fprintf(stderr, "params-check: %s %s\n", what, detail);
    return 1;
}

struct params_node_set {
    struct ggml_context * ctx;
    struct ggml_tensor * q, * K, * KT, * V, * vs, * vc, * mask;
    int64_t d, n_kv, n_head, n_hkv;
};

static ggml_sparq_attn_srcs params_srcs(const params_node_set & s) {
    ggml_sparq_attn_srcs src = {};
    src.q = s.q; src.k = s.K; src.kt = s.KT; src.v = s.V; src.v_sum = s.vs; src.v_count = s.vc; src.mask = s.mask;
    return src;
}

static struct ggml_tensor * params_attn(const params_node_set & s, int r, int k, int l) {
    return ggml_sparq_attn(s.ctx, s.q, s.K, s.KT, s.V, s.vs, s.vc, s.mask, r, k, l, 0.125f);
}

// the sources and parameters of a node that uses the one part `bit` (beside what that part needs);
// false for no such part
static bool params_parts_with(const params_node_set & s, uint32_t bit, ggml_sparq_attn_srcs & src, ggml_sparq_attn_params & p) {
    src = params_srcs(s);
    p = ggml_sparq_attn_params_default(8, 16, 4, 0.125f);
    switch (bit) {
        case 0: return true;
        case GGML_SPARQ_FEAT_ORACLE:    p.selector = GGML_SPARQ_SEL_ORACLE; return true;
        case GGML_SPARQ_FEAT_STREAMING: p.selector = GGML_SPARQ_SEL_STREAMING; return true;
        case GGML_SPARQ_FEAT_H2O:
            p.selector = GGML_SPARQ_SEL_H2O;
            src.sel[0] = ggml_new_tensor_3d(s.ctx, GGML_TYPE_F32, s.n_kv, s.n_hkv, 1);
            return true;
        case GGML_SPARQ_FEAT_INDEX:
        case GGML_SPARQ_FEAT_INDEX_READS: {
            p.selector = GGML_SPARQ_SEL_INDEX;
            struct ggml_tensor * cent = ggml_new_tensor_4d(s.ctx, GGML_TYPE_F32, s.d, 5, s.n_hkv, 1);
            src.sel[0] = ggml_view_4d(s.ctx, cent, s.d, 4, s.n_hkv, 1, cent->nb[1], cent->nb[2], cent->nb[3], 0);
            src.sel[1] = ggml_new_tensor_3d(s.ctx, GGML_TYPE_F32, s.n_kv, s.n_hkv, 1);
            p.n_probe = 3;
            p.index_reads = bit == GGML_SPARQ_FEAT_INDEX_READS;
            return true;
        }
        case GGML_SPARQ_FEAT_PER_HEAD:  p.flags = GGML_SPARQ_FLAG_PER_HEAD; return true;
        case GGML_SPARQ_FEAT_NO_MEAN_V: p.flags = GGML_SPARQ_FLAG_NO_MEAN_V; return true;
        case GGML_SPARQ_FEAT_DENSE:     p.flags = GGML_SPARQ_FLAG_DENSE; return true;
        case GGML_SPARQ_FEAT_WINDOW:    src.win = ggml_new_tensor_3d(s.ctx, GGML_TYPE_I32, 4, 1, 1); return true;
        case GGML_SPARQ_FEAT_BASIS:     src.sel[1] = ggml_new_tensor_3d(s.ctx, GGML_TYPE_F32, s.d, s.n_hkv, 1); return true;
        case GGML_SPARQ_FEAT_COVERAGE_CAP:
            p.k_frac = 0.25f;
            [[fallthrough]];
        case GGML_SPARQ_FEAT_COVERAGE:
            p.cov_p = 0.9f;
            p.k_min = 8;
            p.cov_apply = true;
            return true;
        case GGML_SPARQ_FEAT_COVERAGE_MEASURE:
            p.cov_p = 0.9f;
            p.k_scan = 64;
            return true;
        case GGML_SPARQ_FEAT_TOPK_BUCKETS: p.topk_buckets = 64; return true;
        case GGML_SPARQ_FEAT_SOFTCAP:   p.softcap = 30.0f; return true;
        case GGML_SPARQ_FEAT_ALIBI:     p.max_bias = 8.0f; return true;
        case GGML_SPARQ_FEAT_SINKS:     src.sinks = ggml_new_tensor_1d(s.ctx, GGML_TYPE_F32, s.n_head); return true;
        case GGML_SPARQ_FEAT_KQ_BIAS:
            src.kq_b = ggml_new_tensor_4d(s.ctx, GGML_TYPE_F32, s.n_kv, 1, s.n_head, 1);
            return true;
        case GGML_SPARQ_FEAT_REPORT:
            src.report = ggml_new_tensor_3d(s.ctx, GGML_TYPE_F32, 4, s.n_hkv, 1);
            return true;
        case GGML_SPARQ_FEAT_APPEND:
        case GGML_SPARQ_FEAT_COMP_SQ:
            src.cells = ggml_new_tensor_1d(s.ctx, GGML_TYPE_I64, 1);
            src.v_comp = ggml_new_tensor_3d(s.ctx, GGML_TYPE_F32, s.d, s.n_hkv, 1);
            src.k_sq = ggml_new_tensor_3d(s.ctx, GGML_TYPE_F32, s.d, s.n_hkv, 1);
            src.sel[1] = bit == GGML_SPARQ_FEAT_COMP_SQ ? src.k_sq : nullptr;
            return true;
        default: return false;
    }
}

// a node that uses the one part `bit`, or NULL for none
static struct ggml_tensor * params_node_with(const params_node_set & s, uint32_t bit) {
    ggml_sparq_attn_srcs src;
    ggml_sparq_attn_params p;
    if (!params_parts_with(s, bit, src, p)) {
        return nullptr;
    }
    return ggml_sparq_attn_ext(s.ctx, &src, &p);
}

// the parts a node built for `bit` uses besides it
static uint32_t params_needs(uint32_t bit) {
    switch (bit) {
        case GGML_SPARQ_FEAT_INDEX_READS:  return GGML_SPARQ_FEAT_INDEX;
        case GGML_SPARQ_FEAT_COVERAGE_CAP: return GGML_SPARQ_FEAT_COVERAGE;
        case GGML_SPARQ_FEAT_COMP_SQ:      return GGML_SPARQ_FEAT_APPEND | GGML_SPARQ_FEAT_BASIS;
        default: return 0;
    }
}

static int run_params_check() {
    struct ggml_init_params ip = { 8 * 1024 * 1024, nullptr, true }; // no data: parameters and shapes only
    params_node_set s = {};
    s.ctx = ggml_init(ip);
    s.d = 64; s.n_kv = 256; s.n_head = 4; s.n_hkv = 2;
    s.q = ggml_new_tensor_4d(s.ctx, GGML_TYPE_F32, s.d, 1, s.n_head, 1);
    s.K = ggml_new_tensor_4d(s.ctx, GGML_TYPE_F16, s.d, s.n_kv, s.n_hkv, 1);
    s.KT = ggml_new_tensor_4d(s.ctx, GGML_TYPE_F16, s.n_kv, s.d, s.n_hkv, 1);
    s.V = ggml_new_tensor_4d(s.ctx, GGML_TYPE_F16, s.d, s.n_kv, s.n_hkv, 1);
    s.vs = ggml_new_tensor_3d(s.ctx, GGML_TYPE_F32, s.d, s.n_hkv, 1);
    s.vc = ggml_new_tensor_1d(s.ctx, GGML_TYPE_F32, 1);
    s.mask = ggml_new_tensor_4d(s.ctx, GGML_TYPE_F16, s.n_kv, 1, 1, 1);

    ggml_backend_load_all();
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!cpu) {
        return params_fail("no CPU backend device");
    }

    // 0. the layout leaves room for the parts to come
    if (ggml_sparq_params_free_slots() < GGML_SPARQ_PARAMS_MIN_FREE) {
        return params_fail("the parameter layout leaves fewer free op_params slots than GGML_SPARQ_PARAMS_MIN_FREE");
    }

    // 1. what the constructor wrote comes back from the decoder, and from a byte copy of op_params
    ggml_sparq_attn_srcs src = params_srcs(s);
    src.report = ggml_new_tensor_3d(s.ctx, GGML_TYPE_F32, 4, s.n_hkv, 1);
    ggml_sparq_attn_params in = ggml_sparq_attn_params_default(7, 33, 5, 0.125f);
    in.selector = GGML_SPARQ_SEL_ORACLE;
    in.flags = GGML_SPARQ_FLAG_PER_HEAD;
    in.cov_p = 0.875f;
    in.k_min = 9;
    in.cov_apply = true;
    in.k_frac = 0.5f;
    in.softcap = 50.0f;
    in.max_bias = 8.0f;
    src.sinks = ggml_new_tensor_1d(s.ctx, GGML_TYPE_F32, s.n_head);
    struct ggml_tensor * n = ggml_sparq_attn_ext(s.ctx, &src, &in);
    ggml_sparq_params p = ggml_sparq_params_get(n);
    const ggml_sparq_attn_params & a = p.attn;
    if (p.mode != GGML_SPARQ_MODE_ATTN || memcmp(&a, &in, sizeof(in)) != 0 || n->src[10] != src.report ||
        n->src[11] != src.sinks) {
        return params_fail("the constructor's values do not come back from the decoder");
    }
    const uint32_t want = GGML_SPARQ_FEAT_ORACLE | GGML_SPARQ_FEAT_PER_HEAD | GGML_SPARQ_FEAT_COVERAGE |
                          GGML_SPARQ_FEAT_COVERAGE_CAP | GGML_SPARQ_FEAT_REPORT | GGML_SPARQ_FEAT_SOFTCAP |
                          GGML_SPARQ_FEAT_ALIBI | GGML_SPARQ_FEAT_SINKS;
    if (p.features != want) {
        return params_fail("the features do not name the parts in use");
    }
    struct ggml_tensor * copy = params_attn(s, 1, 1, 0);
    memcpy(copy->op_params, n->op_params, sizeof(n->op_params));
    const ggml_sparq_params pc = ggml_sparq_params_get(copy);
    if (memcmp(&pc.attn, &p.attn, sizeof(p.attn)) != 0 || pc.features != p.features) {
        return params_fail("a byte copy of op_params (what an RPC server receives) decodes otherwise");
    }
    // every field has a slot (k_min and k_scan, never set together, share one): the largest values of
    // each come back beside each other, and the index's n_probe beside the applied coverage's k_min
    {
        ggml_sparq_attn_srcs si;
        ggml_sparq_attn_params pi;
        params_parts_with(s, GGML_SPARQ_FEAT_INDEX, si, pi);
        pi.n_probe = 4;
        pi.softcap = 1e-3f;
        const ggml_sparq_params back = ggml_sparq_params_get(ggml_sparq_attn_ext(s.ctx, &si, &pi));
        if (memcmp(&back.attn, &pi, sizeof(pi)) != 0) {
            return params_fail("the index's n_probe does not come back as written");
        }
    }
    {
        ggml_sparq_attn_srcs sb = params_srcs(s);
        ggml_sparq_attn_params pb = ggml_sparq_attn_params_default((int) s.d, GGML_SPARQ_K_MAX, GGML_SPARQ_K_MAX, 3.5f);
        pb.topk_buckets = GGML_SPARQ_K_MAX;
        pb.cov_p = 1.0f;
        pb.k_scan = GGML_SPARQ_K_MAX;
        pb.flags = GGML_SPARQ_FLAG_PER_HEAD | GGML_SPARQ_FLAG_NO_MEAN_V | GGML_SPARQ_FLAG_DENSE;
        pb.softcap = 3.0e38f;
        pb.max_bias = 3.0e38f;
        const ggml_sparq_params back = ggml_sparq_params_get(ggml_sparq_attn_ext(s.ctx, &sb, &pb));
        if (memcmp(&back.attn, &pb, sizeof(pb)) != 0) {
            return params_fail("the largest values of the fields do not come back as written");
        }
    }
    // what no node may hold is refused with a reason that names it, before any node is made
    {
        struct bad { const char * needle; void (*spoil)(ggml_sparq_attn_srcs &, ggml_sparq_attn_params &); };
        const bad bads[] = {
            { "r must be",      [](ggml_sparq_attn_srcs &, ggml_sparq_attn_params & q) { q.r = 0; } },
            { "l must be",      [](ggml_sparq_attn_srcs &, ggml_sparq_attn_params & q) { q.l = q.k + 1; } },
            { "n_probe",        [](ggml_sparq_attn_srcs &, ggml_sparq_attn_params & q) { q.n_probe = 3; } },
            { "topk_buckets",   [](ggml_sparq_attn_srcs &, ggml_sparq_attn_params & q) { q.topk_buckets = q.k - 1; } },
            { "softcap",        [](ggml_sparq_attn_srcs &, ggml_sparq_attn_params & q) { q.softcap = -1.0f; } },
            { "max_bias",       [](ggml_sparq_attn_srcs &, ggml_sparq_attn_params & q) { q.max_bias = INFINITY; } },
            { "sinks",          [](ggml_sparq_attn_srcs & t, ggml_sparq_attn_params &) { t.sinks = t.v_count; } },
            { "KQ bias",        [](ggml_sparq_attn_srcs & t, ggml_sparq_attn_params &) { t.kq_b = t.v_count; } },
            { "KQ bias",        [](ggml_sparq_attn_srcs & t, ggml_sparq_attn_params &) { t.kq_b = t.k; } },
            { "k_scan",         [](ggml_sparq_attn_srcs &, ggml_sparq_attn_params & q) {
                                    q.cov_p = 0.5f; q.k_scan = 8; q.cov_apply = true; } },
            { "fixed k",        [](ggml_sparq_attn_srcs &, ggml_sparq_attn_params & q) {
                                    q.topk_buckets = q.k; q.cov_p = 0.5f; q.cov_apply = true; } },
            { "k_frac",         [](ggml_sparq_attn_srcs &, ggml_sparq_attn_params & q) { q.cov_p = 0.5f; q.k_frac = 0.5f; } },
            { "h2o",            [](ggml_sparq_attn_srcs &, ggml_sparq_attn_params & q) { q.selector = GGML_SPARQ_SEL_H2O; } },
            { "the report",     [](ggml_sparq_attn_srcs & t, ggml_sparq_attn_params &) { t.report = t.v_count; } },
            { "q, K, K^T",      [](ggml_sparq_attn_srcs & t, ggml_sparq_attn_params &) { t.kt = nullptr; } },
        };
        for (const bad & b : bads) {
            ggml_sparq_attn_srcs sb = params_srcs(s);
            ggml_sparq_attn_params pb = ggml_sparq_attn_params_default(8, 16, 4, 0.125f);
            b.spoil(sb, pb);
            const char * why = ggml_sparq_attn_check(&sb, &pb);
            if (!why || !strstr(why, b.needle)) {
                return params_fail("a bad node is not refused with its reason:", why ? why : b.needle);
            }
        }
    }
    struct ggml_tensor * sum = ggml_sparq_sum_append(s.ctx, s.vs, nullptr, ggml_new_tensor_2d(s.ctx, GGML_TYPE_F32, s.d * s.n_hkv, 1),
                                                     GGML_TYPE_F16, true);
    const ggml_sparq_params ps = ggml_sparq_params_get(sum);
    if (ps.mode != GGML_SPARQ_MODE_SUM_APPEND || ps.sum.type != GGML_TYPE_F16 || !ps.sum.squares || ps.features != 0 ||
        !ggml_sparq_is_sum_append(sum) || ggml_sparq_is_kt_append(sum)) {
        return params_fail("a sum's append does not decode as written");
    }
    // a cell scatter that also pushes into the local windows: a write mode (no attention part), which
    // the CPU backend and the CUDA check take
    struct ggml_tensor * scat = ggml_sparq_cell_scatter(s.ctx, ggml_new_tensor_4d(s.ctx, GGML_TYPE_F16, s.n_kv, s.d, s.n_hkv, 2),
                                                        ggml_new_tensor_2d(s.ctx, GGML_TYPE_F32, s.d * s.n_hkv, 2),
                                                        ggml_new_tensor_1d(s.ctx, GGML_TYPE_I64, 2));
    ggml_sparq_cell_scatter_set_window(scat, ggml_new_tensor_2d(s.ctx, GGML_TYPE_I32, 5, 2));
    if (!ggml_sparq_is_cell_scatter(scat) || ggml_sparq_params_get(scat).features != 0 || !scat->src[3] ||
        !ggml_backend_dev_supports_op(cpu, scat) || sparq_cuda_why_not(scat) != nullptr) {
        return params_fail("a cell scatter with the windows' pushes is not taken as written");
    }

    // 2. each part: its bit, the CPU honours it, CUDA honours exactly what it declares
    int parts = 0;
    for (uint32_t bit = 1; bit & GGML_SPARQ_FEAT_ALL; bit <<= 1) {
        struct ggml_tensor * t = params_node_with(s, bit);
        if (!t) {
            return params_fail("no node for the part", ggml_sparq_feature_name(bit));
        }
        const uint32_t f = ggml_sparq_params_get(t).features;
        if (f != (bit | params_needs(bit))) {
            return params_fail("a node's features are not the parts it uses:", ggml_sparq_feature_name(bit));
        }
        if (!ggml_backend_dev_supports_op(cpu, t)) {
            return params_fail("the CPU backend refuses", ggml_sparq_feature_name(bit));
        }
        const bool cuda = sparq_cuda_why_not(t) == nullptr;
        if (cuda != ((f & ~sparq_cuda_honours()) == 0)) {
            return params_fail("the CUDA check does not follow its declared parts for", ggml_sparq_feature_name(bit));
        }
        parts++;
    }
    // every bit a selector's row names is in the selectors' set, and each of that set is some row's
    {
        uint32_t named = 0;
        for (int32_t id = 0; id < GGML_SPARQ_SEL_COUNT; ++id) {
            named |= ggml_sparq_selector_row(id)->feature | ggml_sparq_selector_row(id)->reads_feature;
        }
        if (named != GGML_SPARQ_FEAT_SELECTORS || ggml_sparq_selector_row(GGML_SPARQ_SEL_COUNT) != nullptr) {
            return params_fail("the selectors' rows do not name exactly GGML_SPARQ_FEAT_SELECTORS");
        }
    }
    // the kernels run the selectors that rank scores (their rows say so: the default and the exact
    // scores' bit), no other selector's bit, and beside them the parts they list
    if ((sparq_cuda_honours() & GGML_SPARQ_FEAT_SELECTORS) != GGML_SPARQ_FEAT_ORACLE ||
        (sparq_cuda_honours() & ~GGML_SPARQ_FEAT_SELECTORS) != SPARQ_CUDA_HONOURS_PARTS) {
        return params_fail("the CUDA check honours other parts than the ranking selectors' and its own");
    }
    if (sparq_cuda_why_not(params_node_with(s, 0)) != nullptr) {
        return params_fail("the CUDA check refuses a plain node");
    }

    // 3. a part this build does not know (a field a newer constructor added) is refused by every backend
    for (uint32_t unknown : { 1u << 21, 1u << 22, GGML_SPARQ_FEAT_UNKNOWN }) {
        struct ggml_tensor * t = params_node_with(s, 0);
        ggml_sparq_params pu = ggml_sparq_params_get(t);
        pu.features |= unknown;
        ggml_sparq_params_set(t, &pu);
        if ((ggml_sparq_params_get(t).features & unknown) == 0) {
            return params_fail("the encoder dropped an unknown part");
        }
        if (ggml_backend_dev_supports_op(cpu, t)) {
            return params_fail("the CPU backend accepts a part it does not know");
        }
        const char * why = sparq_cuda_why_not(t);
        if (!why || !strstr(why, "unknown")) {
            return params_fail("the CUDA check accepts a part it does not know:", why ? why : "(accepted)");
        }
    }

    // a selector value this build does not know (a newer constructor's selector) likewise
    {
        struct ggml_tensor * t = params_node_with(s, 0);
        ggml_sparq_params pu = ggml_sparq_params_get(t);
        pu.attn.selector = GGML_SPARQ_SEL_COUNT + 2;
        ggml_sparq_params_set(t, &pu);
        if (ggml_backend_dev_supports_op(cpu, t) || !sparq_cuda_why_not(t)) {
            return params_fail("a selector this build does not know is not refused");
        }
    }

    // 4. another layout version (a node from another build) is refused, not misread
    struct ggml_tensor * old = params_node_with(s, 0);
    old->op_params[0] ^= 1 << 24; // the version's lowest bit
    ggml_sparq_params po;
    if (ggml_sparq_params_decode(old, &po) || ggml_backend_dev_supports_op(cpu, old) || !sparq_cuda_why_not(old)) {
        return params_fail("a node of another layout version is not refused");
    }

    ggml_free(s.ctx);
    printf("params-check: OK: %d parts, each honoured by the CPU and as declared by CUDA (%d of them); "
           "unknown parts and another layout refused by both; %d of %d op_params slots free\n",
           parts, __builtin_popcount(sparq_cuda_honours()), ggml_sparq_params_free_slots(), GGML_SPARQ_PARAMS_SLOTS);
    return 0;
}
