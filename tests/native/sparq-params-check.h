// llama-sparq: the op's typed parameters (ggml-sparq-params.h) checked through ggml: every setter's
// value comes back from the one decoder, the same bytes decode alike in another tensor (what an RPC
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

static struct ggml_tensor * params_attn(const params_node_set & s, int r, int k, int l) {
    return ggml_sparq_attn(s.ctx, s.q, s.K, s.KT, s.V, s.vs, s.vc, s.mask, r, k, l, 0.125f);
}

// a node that uses the one part `bit` (beside what that part needs), or NULL for none
static struct ggml_tensor * params_node_with(const params_node_set & s, uint32_t bit) {
    struct ggml_tensor * n = params_attn(s, 8, 16, 4);
    switch (bit) {
        case 0: return n;
        case GGML_SPARQ_FEAT_ORACLE:    ggml_sparq_attn_set_selector(n, GGML_SPARQ_SEL_ORACLE, 0); return n;
        case GGML_SPARQ_FEAT_STREAMING: ggml_sparq_attn_set_selector(n, GGML_SPARQ_SEL_STREAMING, 0); return n;
        case GGML_SPARQ_FEAT_H2O: {
            ggml_sparq_attn_set_selector(n, GGML_SPARQ_SEL_H2O, 0);
            ggml_sparq_attn_set_h2o(n, ggml_new_tensor_3d(s.ctx, GGML_TYPE_F32, s.n_kv, s.n_hkv, 1));
            return n;
        }
        case GGML_SPARQ_FEAT_INDEX:
        case GGML_SPARQ_FEAT_INDEX_READS: {
            ggml_sparq_attn_set_selector(n, GGML_SPARQ_SEL_INDEX, 0);
            struct ggml_tensor * cent = ggml_new_tensor_4d(s.ctx, GGML_TYPE_F32, s.d, 5, s.n_hkv, 1);
            struct ggml_tensor * cv = ggml_view_4d(s.ctx, cent, s.d, 4, s.n_hkv, 1, cent->nb[1], cent->nb[2], cent->nb[3], 0);
            ggml_sparq_attn_set_index(n, cv, ggml_new_tensor_3d(s.ctx, GGML_TYPE_F32, s.n_kv, s.n_hkv, 1), 3);
            if (bit == GGML_SPARQ_FEAT_INDEX_READS) {
                ggml_sparq_attn_set_index_reads(n);
            }
            return n;
        }
        case GGML_SPARQ_FEAT_PER_HEAD:  ggml_sparq_attn_set_selector(n, GGML_SPARQ_SEL_SPARQ, GGML_SPARQ_FLAG_PER_HEAD); return n;
        case GGML_SPARQ_FEAT_NO_MEAN_V: ggml_sparq_attn_set_selector(n, GGML_SPARQ_SEL_SPARQ, GGML_SPARQ_FLAG_NO_MEAN_V); return n;
        case GGML_SPARQ_FEAT_DENSE:     ggml_sparq_attn_set_selector(n, GGML_SPARQ_SEL_SPARQ, GGML_SPARQ_FLAG_DENSE); return n;
        case GGML_SPARQ_FEAT_WINDOW:
            ggml_sparq_attn_set_window(n, ggml_new_tensor_3d(s.ctx, GGML_TYPE_I32, 4, 1, 1));
            return n;
        case GGML_SPARQ_FEAT_BASIS:
            ggml_sparq_attn_set_basis(n, nullptr, ggml_new_tensor_3d(s.ctx, GGML_TYPE_F32, s.d, s.n_hkv, 1));
            return n;
        case GGML_SPARQ_FEAT_COVERAGE:         ggml_sparq_attn_set_coverage(n, 0.9f, 8, 0, true); return n;
        case GGML_SPARQ_FEAT_COVERAGE_CAP:
            ggml_sparq_attn_set_coverage(n, 0.9f, 8, 0, true);
            ggml_sparq_attn_set_coverage_cap(n, 0.25f);
            return n;
        case GGML_SPARQ_FEAT_COVERAGE_MEASURE: ggml_sparq_attn_set_coverage(n, 0.9f, 0, 64, false); return n;
        case GGML_SPARQ_FEAT_TOPK_BUCKETS: ggml_sparq_attn_set_topk_buckets(n, 64); return n;
        case GGML_SPARQ_FEAT_REPORT: {
            static float report[64];
            ggml_sparq_attn_set_report(n, report);
            return n;
        }
        default: return nullptr;
    }
}

// the parts a node built for `bit` uses besides it
static uint32_t params_needs(uint32_t bit) {
    switch (bit) {
        case GGML_SPARQ_FEAT_INDEX_READS:  return GGML_SPARQ_FEAT_INDEX;
        case GGML_SPARQ_FEAT_COVERAGE_CAP: return GGML_SPARQ_FEAT_COVERAGE;
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

    // 1. what the setters wrote comes back from the decoder, and from a byte copy of op_params
    struct ggml_tensor * n = params_attn(s, 7, 33, 5);
    ggml_sparq_attn_set_selector(n, GGML_SPARQ_SEL_ORACLE, GGML_SPARQ_FLAG_PER_HEAD);
    ggml_sparq_attn_set_coverage(n, 0.875f, 9, 0, true);
    ggml_sparq_attn_set_coverage_cap(n, 0.5f);
    float report[16];
    ggml_sparq_attn_set_report(n, report);
    unsigned int tickets[4];
    ggml_sparq_attn_set_tickets(n, tickets);
    ggml_sparq_params p = ggml_sparq_params_get(n);
    const ggml_sparq_attn_params & a = p.attn;
    if (p.mode != GGML_SPARQ_MODE_ATTN || a.r != 7 || a.k != 33 || a.l != 5 || a.scale != 0.125f ||
        a.selector != GGML_SPARQ_SEL_ORACLE || a.flags != GGML_SPARQ_FLAG_PER_HEAD || a.cov_p != 0.875f ||
        a.k_min != 9 || a.k_scan != 0 || !a.cov_apply || a.k_frac != 0.5f || a.report != report || a.tickets != tickets ||
        ggml_sparq_attn_get_report(n) != report) {
        return params_fail("the setters' values do not come back from the decoder");
    }
    // (the tickets are a resource, not a part of the computation: no feature bit)
    const uint32_t want = GGML_SPARQ_FEAT_ORACLE | GGML_SPARQ_FEAT_PER_HEAD | GGML_SPARQ_FEAT_COVERAGE |
                          GGML_SPARQ_FEAT_COVERAGE_CAP | GGML_SPARQ_FEAT_REPORT;
    if (p.features != want) {
        return params_fail("the features do not name the parts in use");
    }
    struct ggml_tensor * copy = params_attn(s, 1, 1, 0);
    memcpy(copy->op_params, n->op_params, sizeof(n->op_params));
    const ggml_sparq_params pc = ggml_sparq_params_get(copy);
    if (memcmp(&pc.attn, &p.attn, sizeof(p.attn)) != 0 || pc.features != p.features) {
        return params_fail("a byte copy of op_params (what an RPC server receives) decodes otherwise");
    }
    // the bucketed top-k's buckets and the index's n_probe share a slot, one selector each
    struct ggml_tensor * nb = params_attn(s, 7, 33, 5);
    ggml_sparq_attn_set_topk_buckets(nb, 1000);
    struct ggml_tensor * ni = params_node_with(s, GGML_SPARQ_FEAT_INDEX);
    const ggml_sparq_params pb = ggml_sparq_params_get(nb), pi = ggml_sparq_params_get(ni);
    if (pb.attn.topk_buckets != 1000 || pb.attn.n_probe != 0 || pb.features != GGML_SPARQ_FEAT_TOPK_BUCKETS ||
        pi.attn.n_probe != 3 || pi.attn.topk_buckets != 0 || (pi.features & GGML_SPARQ_FEAT_TOPK_BUCKETS)) {
        return params_fail("topk_buckets and n_probe do not come back as written");
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
        if (cuda != ((f & ~SPARQ_CUDA_HONOURS) == 0)) {
            return params_fail("the CUDA check does not follow its declared parts for", ggml_sparq_feature_name(bit));
        }
        parts++;
    }
    if (sparq_cuda_why_not(params_node_with(s, 0)) != nullptr) {
        return params_fail("the CUDA check refuses a plain node");
    }

    // 3. a part this build does not know (a field a newer constructor added) is refused by every backend
    for (uint32_t unknown : { 1u << 15, 1u << 20, GGML_SPARQ_FEAT_UNKNOWN }) {
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
    old->op_params[0] ^= 1 << 16;
    ggml_sparq_params po;
    if (ggml_sparq_params_decode(old, &po) || ggml_backend_dev_supports_op(cpu, old) || !sparq_cuda_why_not(old)) {
        return params_fail("a node of another layout version is not refused");
    }

    ggml_free(s.ctx);
    printf("params-check: OK: %d parts, each honoured by the CPU and as declared by CUDA (%d of them); "
           "unknown parts and another layout refused by both\n",
           parts, __builtin_popcount(SPARQ_CUDA_HONOURS));
    return 0;
}
