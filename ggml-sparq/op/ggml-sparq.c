// llama-sparq: the constructor of GGML_OP_SPARQ_ATTN (compiled into ggml-base).
// The op is declared in ggml.h by patch 0002; the CPU kernels are in sparq-cpu*.cpp.

#include "ggml.h"
#include "ggml-impl.h"

#include <math.h>
#include <string.h>

#include "ggml-sparq.h"

static bool sparq_cache_type_ok(enum ggml_type t) {
    return t == GGML_TYPE_F16 || t == GGML_TYPE_F32;
}

// K and V rows may also be q8_0 blocks (a quantized cache; the CPU kernels read them), whole blocks per head
static bool sparq_row_type_ok(const struct ggml_tensor * t) {
    return sparq_cache_type_ok(t->type) || (t->type == GGML_TYPE_Q8_0 && t->ne[0] % ggml_blck_size(t->type) == 0);
}

static struct ggml_sparq_params sparq_params_new(enum ggml_sparq_mode mode) {
    struct ggml_sparq_params p;
    memset(&p, 0, sizeof(p));
    p.mode = mode;
    return p;
}

// an attention node's parameters (the setters take nothing else)
static struct ggml_sparq_params sparq_attn_params(const struct ggml_tensor * attn) {
    GGML_ASSERT(attn->op == GGML_OP_SPARQ_ATTN);
    const struct ggml_sparq_params p = ggml_sparq_params_get(attn);
    GGML_ASSERT(p.mode == GGML_SPARQ_MODE_ATTN && "sparq_attn: the node is one of the op's write modes");
    return p;
}

// after a setter changed the node's sources: the features follow them
static void sparq_refresh_features(struct ggml_tensor * attn) {
    const struct ggml_sparq_params p = sparq_attn_params(attn);
    ggml_sparq_params_set(attn, &p);
}

struct ggml_tensor * ggml_sparq_attn(
        struct ggml_context * ctx,
        struct ggml_tensor  * q,
        struct ggml_tensor  * k,
        struct ggml_tensor  * kt,
        struct ggml_tensor  * v,
        struct ggml_tensor  * v_sum,
        struct ggml_tensor  * v_count,
        struct ggml_tensor  * mask,
        int                   r,
        int                   top_k,
        int                   local,
        float                 scale) {
    const int64_t d      = q->ne[0];
    const int64_t n_rows = q->ne[1];
    const int64_t n_head = q->ne[2];
    const int64_t n_strm = q->ne[3];
    const int64_t n_kv   = k->ne[1];
    const int64_t n_hkv  = k->ne[2];
    const int64_t dv     = v->ne[0];

    GGML_ASSERT(q->type == GGML_TYPE_F32 && "sparq_attn: q must be f32");
    // K^T is kept f16 or f32 (from the dequantized keys of a q8_0 cache), or e5m2 in i8 (ggml-sparq.h)
    GGML_ASSERT(sparq_row_type_ok(k)          && "sparq_attn: K must be f16, f32 or q8_0 (whole blocks per head)");
    GGML_ASSERT((sparq_cache_type_ok(kt->type) || kt->type == GGML_TYPE_I8) &&
                "sparq_attn: K^T must be f16, f32 or i8 (e5m2)");
    GGML_ASSERT(sparq_row_type_ok(v)          && "sparq_attn: V must be f16, f32 or q8_0 (whole blocks per head)");
    GGML_ASSERT(k->ne[0] == d && "sparq_attn: K head size differs from q");
    GGML_ASSERT(kt->ne[0] == n_kv && kt->ne[1] == d && kt->ne[2] == n_hkv && kt->ne[3] == k->ne[3] &&
                "sparq_attn: K^T must be [n_kv, d, n_head_kv, n_stream]");
    GGML_ASSERT(kt->nb[0] == ggml_type_size(kt->type) && "sparq_attn: K^T rows must be cell-contiguous");
    GGML_ASSERT(k->nb[0] == ggml_type_size(k->type) && v->nb[0] == ggml_type_size(v->type) &&
                "sparq_attn: K and V rows must be contiguous (flash-attention layout)");
    GGML_ASSERT(v->ne[1] == n_kv && v->ne[2] == n_hkv && v->ne[3] == k->ne[3] &&
                "sparq_attn: V must be [dv, n_kv, n_head_kv, n_stream]");
    GGML_ASSERT(k->ne[3] == n_strm && "sparq_attn: K and q must have the same number of streams");
    GGML_ASSERT(n_hkv > 0 && n_head % n_hkv == 0 && "sparq_attn: n_head must be a multiple of n_head_kv");
    GGML_ASSERT(v_sum && v_sum->type == GGML_TYPE_F32 && v_sum->ne[0] == dv && v_sum->ne[1] == n_hkv &&
                v_sum->ne[2] == n_strm && v_sum->nb[0] == sizeof(float) &&
                "sparq_attn: v_sum must be f32 [dv, n_head_kv, n_stream]");
    GGML_ASSERT(v_count && v_count->type == GGML_TYPE_F32 && ggml_nelements(v_count) == n_strm &&
                ggml_is_contiguous(v_count) && "sparq_attn: v_count must be f32 [n_stream]");
    if (mask) {
        GGML_ASSERT((mask->type == GGML_TYPE_F16 || mask->type == GGML_TYPE_F32) &&
                    "sparq_attn: mask must be f16 or f32");
        GGML_ASSERT(mask->ne[0] == n_kv && mask->ne[1] >= n_rows && mask->ne[2] == 1 &&
                    (mask->ne[3] == 1 || mask->ne[3] == n_strm) && mask->nb[0] == ggml_type_size(mask->type) &&
                    "sparq_attn: mask must be [n_kv, >= n_rows, 1, 1 or n_stream]");
    }
    GGML_ASSERT(r >= 1 && r <= d && "sparq_attn: r must be in [1, d]");
    GGML_ASSERT(top_k >= 1 && "sparq_attn: k must be >= 1");
    GGML_ASSERT(local >= 0 && local <= top_k && "sparq_attn: l must be in [0, k]");
    GGML_ASSERT(isfinite(scale) && scale > 0.0f && "sparq_attn: scale must be finite and > 0");

    const int64_t ne[4] = { dv, n_head, n_rows, n_strm };
    struct ggml_tensor * result = ggml_new_tensor(ctx, GGML_TYPE_F32, 4, ne);

    GGML_ASSERT(top_k <= GGML_SPARQ_K_MAX && "sparq_attn: k must be <= GGML_SPARQ_K_MAX");

    result->op     = GGML_OP_SPARQ_ATTN;
    result->src[0] = q;
    result->src[1] = k;
    result->src[2] = kt;
    result->src[3] = v;
    result->src[4] = v_sum;
    result->src[5] = v_count;
    result->src[6] = mask;

    struct ggml_sparq_params p = sparq_params_new(GGML_SPARQ_MODE_ATTN);
    p.attn.r = r;
    p.attn.k = top_k;
    p.attn.l = local;
    p.attn.scale = scale;
    p.attn.selector = GGML_SPARQ_SEL_SPARQ;
    ggml_sparq_params_set(result, &p);
    return result;
}

// a node of one of the op's write modes: a view of dst (its result orders later readers), its
// parameters, three sources
static struct ggml_tensor * sparq_mode_node(struct ggml_context * ctx, struct ggml_tensor * dst,
                                            const struct ggml_sparq_params * p, struct ggml_tensor * s1,
                                            struct ggml_tensor * s2) {
    struct ggml_tensor * result = ggml_view_tensor(ctx, dst);
    result->op     = GGML_OP_SPARQ_ATTN;
    result->src[0] = dst;
    result->src[1] = s1;
    result->src[2] = s2;
    ggml_sparq_params_set(result, p);
    return result;
}

struct ggml_tensor * ggml_sparq_kt_append(struct ggml_context * ctx, struct ggml_tensor * dst,
                                         struct ggml_tensor * src, struct ggml_tensor * idx) {
    GGML_ASSERT(dst->type == GGML_TYPE_I8 && dst->nb[0] == 1 && dst->ne[2] == 1 && dst->ne[3] == 1 &&
                "sparq_kt_append: dst must be i8 rows [ne0, n_rows] (e5m2)");
    GGML_ASSERT((src->type == GGML_TYPE_F32 || src->type == GGML_TYPE_F16) && ggml_is_contiguous(src) &&
                src->ne[0] == dst->ne[0] && src->ne[2] == 1 && src->ne[3] == 1 &&
                "sparq_kt_append: src must be contiguous f32 or f16 [ne0, n] with dst's row length");
    if (idx) {
        GGML_ASSERT(idx->type == GGML_TYPE_I64 && ggml_is_contiguous(idx) && ggml_nelements(idx) == src->ne[1] &&
                    "sparq_kt_append: idx must be contiguous i64 [n]");
    } else {
        GGML_ASSERT(src->ne[1] == dst->ne[1] && "sparq_kt_append: without idx, src and dst have the same rows");
    }
    const struct ggml_sparq_params p = sparq_params_new(GGML_SPARQ_MODE_KT_APPEND);
    return sparq_mode_node(ctx, dst, &p, src, idx);
}

struct ggml_tensor * ggml_sparq_cell_scatter(struct ggml_context * ctx, struct ggml_tensor * dst,
                                             struct ggml_tensor * src, struct ggml_tensor * idx) {
    GGML_ASSERT((dst->type == GGML_TYPE_F32 || dst->type == GGML_TYPE_F16 || dst->type == GGML_TYPE_I8) &&
                ggml_is_contiguous(dst) && "sparq_cell_scatter: dst must be contiguous f32, f16 or i8 (e5m2)");
    GGML_ASSERT((src->type == GGML_TYPE_F32 || src->type == GGML_TYPE_F16) && ggml_is_contiguous(src) &&
                src->ne[0] == dst->ne[1] * dst->ne[2] && src->ne[2] == 1 && src->ne[3] == 1 &&
                "sparq_cell_scatter: src must be contiguous f32 or f16 [E, n_tokens], E = dst->ne[1] * dst->ne[2]");
    GGML_ASSERT(idx && idx->type == GGML_TYPE_I64 && ggml_is_contiguous(idx) && ggml_nelements(idx) == src->ne[1] &&
                "sparq_cell_scatter: idx must be contiguous i64 [n_tokens]");
    const struct ggml_sparq_params p = sparq_params_new(GGML_SPARQ_MODE_CELL_SCATTER);
    return sparq_mode_node(ctx, dst, &p, src, idx);
}

void ggml_sparq_cell_scatter_set_window(struct ggml_tensor * node, struct ggml_tensor * win) {
    GGML_ASSERT(ggml_sparq_mode_of(node) == GGML_SPARQ_MODE_CELL_SCATTER);
    GGML_ASSERT(win->type == GGML_TYPE_I32 && ggml_is_contiguous(win) && win->ne[0] >= 1 &&
                win->ne[1] == node->src[0]->ne[3] && win->ne[2] == 1 && win->ne[3] == 1 &&
                "sparq_cell_scatter: the window must be contiguous i32 [w, n_stream] with dst's streams");
    node->src[3] = win;
}

struct ggml_tensor * ggml_sparq_sum_append(struct ggml_context * ctx, struct ggml_tensor * sum,
                                          struct ggml_tensor * comp, struct ggml_tensor * x_new,
                                          enum ggml_type type, bool squares) {
    GGML_ASSERT(sum->type == GGML_TYPE_F32 && sum->nb[0] == sizeof(float) && sum->ne[2] == 1 && sum->ne[3] == 1 &&
                "sparq_sum_append: sum must be f32 rows [n, n_stream]");
    if (comp) {
        GGML_ASSERT(comp->type == GGML_TYPE_F32 && comp->nb[0] == sizeof(float) && ggml_are_same_shape(sum, comp) &&
                    "sparq_sum_append: comp must be f32 rows of sum's shape");
    }
    GGML_ASSERT(x_new->type == GGML_TYPE_F32 && ggml_is_contiguous(x_new) && ggml_nelements(x_new) == ggml_nelements(sum) &&
                "sparq_sum_append: x_new must be contiguous f32 with sum's elements");
    GGML_ASSERT((type == GGML_TYPE_F16 || type == GGML_TYPE_F32) && "sparq_sum_append: the cache type must be f16 or f32");
    struct ggml_sparq_params p = sparq_params_new(GGML_SPARQ_MODE_SUM_APPEND);
    p.sum.type = (int32_t) type;
    p.sum.squares = squares;
    return sparq_mode_node(ctx, sum, &p, x_new, comp);
}

void ggml_sparq_sum_append_set_count(struct ggml_tensor * node, struct ggml_tensor * count) {
    GGML_ASSERT(ggml_sparq_mode_of(node) == GGML_SPARQ_MODE_SUM_APPEND);
    GGML_ASSERT(count->type == GGML_TYPE_F32 && ggml_is_contiguous(count) && ggml_nelements(count) == node->src[0]->ne[1] &&
                "sparq_sum_append: count must be contiguous f32 [n_stream]");
    node->src[3] = count;
}

void ggml_sparq_attn_set_selector(struct ggml_tensor * attn, int32_t selector, int32_t flags) {
    GGML_ASSERT(attn->op == GGML_OP_SPARQ_ATTN);
    GGML_ASSERT(selector >= 0 && selector < GGML_SPARQ_SEL_COUNT && "sparq_attn: unknown selector");
    GGML_ASSERT((flags & ~(GGML_SPARQ_FLAG_PER_HEAD | GGML_SPARQ_FLAG_NO_MEAN_V | GGML_SPARQ_FLAG_DENSE)) == 0 &&
                "sparq_attn: unknown flags");
    struct ggml_sparq_params p = sparq_attn_params(attn);
    p.attn.selector = selector;
    p.attn.flags = flags;
    ggml_sparq_params_set(attn, &p);
}

void ggml_sparq_attn_set_basis(struct ggml_tensor * attn, struct ggml_tensor * q_sel, struct ggml_tensor * comp_w) {
    const int32_t sel = sparq_attn_params(attn).attn.selector;
    GGML_ASSERT((sel == GGML_SPARQ_SEL_SPARQ || sel == GGML_SPARQ_SEL_ORACLE) &&
                "sparq_attn: a basis applies to the sparq and oracle selectors only");
    const struct ggml_tensor * q = attn->src[0];
    const struct ggml_tensor * k = attn->src[1];
    if (q_sel) {
        GGML_ASSERT(q_sel->type == GGML_TYPE_F32 && ggml_are_same_shape(q_sel, q) && q_sel->nb[0] == sizeof(float) &&
                    "sparq_attn: q_sel must be f32 with q's shape");
    }
    if (comp_w) {
        GGML_ASSERT(comp_w->type == GGML_TYPE_F32 && comp_w->ne[0] == q->ne[0] && comp_w->ne[1] == k->ne[2] &&
                    (comp_w->ne[2] == 1 || comp_w->ne[2] == q->ne[3]) && comp_w->ne[3] == 1 &&
                    comp_w->nb[0] == sizeof(float) && "sparq_attn: comp_w must be f32 [d, n_head_kv, 1 or n_stream]");
    }
    attn->src[8] = q_sel;
    attn->src[9] = comp_w;
    sparq_refresh_features(attn);
}

void ggml_sparq_attn_set_h2o(struct ggml_tensor * attn, struct ggml_tensor * scores) {
    GGML_ASSERT(sparq_attn_params(attn).attn.selector == GGML_SPARQ_SEL_H2O && "sparq_attn: set the h2o selector first");
    const struct ggml_tensor * k = attn->src[1];
    GGML_ASSERT(scores->type == GGML_TYPE_F32 && scores->ne[0] == k->ne[1] && scores->ne[1] == k->ne[2] &&
                scores->ne[2] == k->ne[3] && scores->ne[3] == 1 && scores->nb[0] == sizeof(float) &&
                "sparq_attn: the H2O scores must be f32 [n_kv, n_head_kv, n_stream]");
    attn->src[8] = scores;
    sparq_refresh_features(attn);
}

void ggml_sparq_attn_set_index(struct ggml_tensor * attn, struct ggml_tensor * centroids,
                               struct ggml_tensor * lists, int32_t n_probe) {
    struct ggml_sparq_params p = sparq_attn_params(attn);
    GGML_ASSERT(p.attn.selector == GGML_SPARQ_SEL_INDEX && "sparq_attn: set the index selector first");
    const struct ggml_tensor * q = attn->src[0];
    const struct ggml_tensor * k = attn->src[1];
    GGML_ASSERT(centroids->type == GGML_TYPE_F32 && centroids->ne[0] == q->ne[0] && centroids->ne[1] >= 1 &&
                centroids->ne[2] == k->ne[2] && centroids->ne[3] == k->ne[3] && centroids->nb[0] == sizeof(float) &&
                "sparq_attn: the index centroids must be f32 [d, n_list, n_head_kv, n_stream]");
    GGML_ASSERT(lists->type == GGML_TYPE_F32 && lists->ne[0] == k->ne[1] && lists->ne[1] == k->ne[2] &&
                lists->ne[2] == k->ne[3] && lists->ne[3] == 1 && lists->nb[0] == sizeof(float) &&
                "sparq_attn: the index lists must be f32 [n_kv, n_head_kv, n_stream]");
    GGML_ASSERT(n_probe >= 1 && n_probe <= centroids->ne[1] && "sparq_attn: n_probe must be in [1, n_list]");
    attn->src[8] = centroids;
    attn->src[9] = lists;
    p.attn.n_probe = n_probe;
    ggml_sparq_params_set(attn, &p);
}

void ggml_sparq_attn_set_index_reads(struct ggml_tensor * attn) {
    struct ggml_sparq_params p = sparq_attn_params(attn);
    const struct ggml_tensor * c = attn->src[8];
    GGML_ASSERT(p.attn.selector == GGML_SPARQ_SEL_INDEX && c &&
                "sparq_attn: set the index first (ggml_sparq_attn_set_index)");
    GGML_ASSERT(c->nb[2] >= (size_t) (c->ne[1] + 1) * c->nb[1] &&
                "sparq_attn: the index reads need a row after the last centroid (centroids->nb[2] >= (n_list + 1) * nb[1])");
    p.attn.index_reads = true;
    ggml_sparq_params_set(attn, &p);
}

void ggml_sparq_attn_set_window(struct ggml_tensor * attn, struct ggml_tensor * win) {
    sparq_attn_params(attn);
    const struct ggml_tensor * q = attn->src[0];
    GGML_ASSERT(win->type == GGML_TYPE_I32 && win->ne[0] >= 1 && win->ne[1] >= q->ne[1] && win->ne[2] == q->ne[3] &&
                win->nb[0] == sizeof(int32_t) && "sparq_attn: the window must be i32 [w, n_rows, n_stream]");
    attn->src[7] = win;
    sparq_refresh_features(attn);
}

void ggml_sparq_attn_set_coverage(struct ggml_tensor * attn, float cov_p, int32_t k_min, int32_t k_scan, bool apply) {
    struct ggml_sparq_params p = sparq_attn_params(attn);
    const int32_t sel = p.attn.selector;
    GGML_ASSERT((sel == GGML_SPARQ_SEL_SPARQ || sel == GGML_SPARQ_SEL_ORACLE) &&
                "sparq_attn: a coverage target applies to the sparq and oracle selectors only");
    const int32_t k = p.attn.k;
    GGML_ASSERT(isfinite(cov_p) && cov_p > 0.0f && cov_p <= 1.0f && "sparq_attn: the coverage target must be in (0, 1]");
    GGML_ASSERT(!(apply && p.attn.topk_buckets > 0) && "sparq_attn: the bucketed top-k needs a fixed k (no coverage cut)");
    GGML_ASSERT(k_min >= 0 && k_min <= k && "sparq_attn: k_min must be in [0, k]");
    GGML_ASSERT(k_scan >= 0 && k_scan <= GGML_SPARQ_K_MAX && "sparq_attn: k_scan must be in [0, GGML_SPARQ_K_MAX]");
    p.attn.cov_p = cov_p;
    p.attn.k_min = k_min;
    p.attn.k_scan = k_scan;
    p.attn.cov_apply = apply;
    ggml_sparq_params_set(attn, &p);
}

void ggml_sparq_attn_set_topk_buckets(struct ggml_tensor * attn, int32_t buckets) {
    struct ggml_sparq_params p = sparq_attn_params(attn);
    const int32_t sel = p.attn.selector;
    GGML_ASSERT((sel == GGML_SPARQ_SEL_SPARQ || sel == GGML_SPARQ_SEL_ORACLE) &&
                "sparq_attn: the bucketed top-k applies to the sparq and oracle selectors only");
    GGML_ASSERT((buckets == 0 || (buckets >= p.attn.k && buckets <= GGML_SPARQ_K_MAX)) &&
                "sparq_attn: topk_buckets must be 0 or in [k, GGML_SPARQ_K_MAX]");
    GGML_ASSERT(!(buckets > 0 && p.attn.cov_apply) && "sparq_attn: the bucketed top-k needs a fixed k (no coverage cut)");
    p.attn.topk_buckets = buckets;
    ggml_sparq_params_set(attn, &p);
}

void ggml_sparq_attn_set_coverage_cap(struct ggml_tensor * attn, float k_frac) {
    struct ggml_sparq_params p = sparq_attn_params(attn);
    GGML_ASSERT(p.attn.cov_apply && "sparq_attn: the per-row cap needs the coverage target applied");
    GGML_ASSERT(isfinite(k_frac) && k_frac > 0.0f && k_frac <= 1.0f && "sparq_attn: k_frac must be in (0, 1]");
    p.attn.k_frac = k_frac;
    ggml_sparq_params_set(attn, &p);
}

void ggml_sparq_attn_set_report(struct ggml_tensor * attn, float * report) {
    struct ggml_sparq_params p = sparq_attn_params(attn);
    p.attn.report = report;
    ggml_sparq_params_set(attn, &p);
}

float * ggml_sparq_attn_get_report(const struct ggml_tensor * attn) {
    return sparq_attn_params(attn).attn.report;
}

void ggml_sparq_attn_set_tickets(struct ggml_tensor * attn, void * tickets) {
    struct ggml_sparq_params p = sparq_attn_params(attn);
    p.attn.tickets = tickets;
    ggml_sparq_params_set(attn, &p);
}
