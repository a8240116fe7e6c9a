// llama-sparq: the constructor of GGML_OP_SPARQ_ATTN (compiled into ggml-base).
// The op is declared in ggml.h by patch 0002; the CPU kernels are in sparq-cpu*.cpp.

#include "ggml.h"
#include "ggml-impl.h"

#include <math.h>
#include <string.h>

#include "ggml-sparq.h"

static bool sparq_float_type_ok(enum ggml_type t) {
    return t == GGML_TYPE_F16 || t == GGML_TYPE_F32;
}

bool ggml_sparq_cache_type_ok(enum ggml_type t) {
    switch (t) {
        case GGML_TYPE_Q8_0: case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1:
        case GGML_TYPE_IQ4_NL:
            return true;
        default:
            return sparq_float_type_ok(t);
    }
}

// K and V rows: a cache type, whole blocks per head
static bool sparq_row_type_ok(const struct ggml_tensor * t) {
    return ggml_sparq_cache_type_ok(t->type) && t->ne[0] % ggml_blck_size(t->type) == 0;
}

static struct ggml_sparq_params sparq_params_new(enum ggml_sparq_mode mode) {
    struct ggml_sparq_params p;
    memset(&p, 0, sizeof(p));
    p.mode = mode;
    return p;
}

struct ggml_sparq_attn_params ggml_sparq_attn_params_default(int32_t r, int32_t k, int32_t l, float scale) {
    struct ggml_sparq_attn_params a;
    memset(&a, 0, sizeof(a));
    a.r = r;
    a.k = k;
    a.l = l;
    a.scale = scale;
    a.selector = GGML_SPARQ_SEL_SPARQ;
    return a;
}

// each check below returns its message where its condition fails
#define SPARQ_NEED(cond, what) do { if (!(cond)) { return "sparq_attn: " what; } } while (0)

// the step's append (cells, v_comp, k_sq): all three or none, on one query row per stream
static const char * sparq_check_append(const struct ggml_sparq_attn_srcs * s) {
    SPARQ_NEED((s->cells != NULL) == (s->v_comp != NULL) && (s->cells != NULL) == (s->k_sq != NULL),
               "the step's append takes cells, v_comp and k_sq together");
    if (!s->cells) {
        return NULL;
    }
    const int64_t d = s->q->ne[0], dv = s->v->ne[0], n_hkv = s->k->ne[2], n_strm = s->q->ne[3];
    SPARQ_NEED(s->q->ne[1] == 1, "the step's append needs one query row per stream (a decode step)");
    SPARQ_NEED(s->cells->type == GGML_TYPE_I64 && ggml_nelements(s->cells) == n_strm && ggml_is_contiguous(s->cells),
               "cells must be contiguous i64 [n_stream]");
    SPARQ_NEED(s->v_comp->type == GGML_TYPE_F32 && ggml_are_same_shape(s->v_comp, s->v_sum) &&
               s->v_comp->nb[0] == sizeof(float), "v_comp must be f32 of v_sum's shape");
    SPARQ_NEED(s->k_sq->type == GGML_TYPE_F32 && s->k_sq->ne[0] == d && s->k_sq->ne[1] == n_hkv &&
               s->k_sq->ne[2] == n_strm && s->k_sq->ne[3] == 1 && s->k_sq->nb[0] == sizeof(float),
               "k_sq must be f32 [d, n_head_kv, n_stream]");
    SPARQ_NEED(dv == s->v_sum->ne[0], "v_sum's rows must have V's head size");
    SPARQ_NEED(!s->win || s->win->ne[1] == 1, "the kept window must be i32 [w, 1, n_stream]");
    return NULL;
}

static const char * sparq_check_inputs(const struct ggml_sparq_attn_srcs * s) {
    SPARQ_NEED(s->q && s->k && s->kt && s->v && s->v_sum && s->v_count, "q, K, K^T, V, v_sum and v_count are required");
    const struct ggml_tensor * q = s->q, * k = s->k, * kt = s->kt, * v = s->v;
    const int64_t d = q->ne[0], n_rows = q->ne[1], n_head = q->ne[2], n_strm = q->ne[3];
    const int64_t n_kv = k->ne[1], n_hkv = k->ne[2], dv = v->ne[0];
    SPARQ_NEED(q->type == GGML_TYPE_F32 && q->nb[0] == sizeof(float), "q must be f32 with contiguous rows");
    // K^T is kept f16 or f32 (from the dequantized keys of a quantized cache), e5m2 in i8 or 4-bit in
    // q4_1 blocks along its rows (ggml-sparq.h)
    SPARQ_NEED(sparq_row_type_ok(k), "K must be f16, f32, q8_0, q4_0, q4_1, q5_0, q5_1 or iq4_nl (whole blocks per head)");
    SPARQ_NEED(sparq_float_type_ok(kt->type) || kt->type == GGML_TYPE_I8 || kt->type == GGML_TYPE_Q4_1,
               "K^T must be f16, f32, i8 (e5m2) or q4_1 (4-bit)");
    SPARQ_NEED(sparq_row_type_ok(v), "V must be f16, f32, q8_0, q4_0, q4_1, q5_0, q5_1 or iq4_nl (whole blocks per head)");
    SPARQ_NEED(k->ne[0] == d, "K head size differs from q");
    SPARQ_NEED(kt->ne[0] == n_kv && kt->ne[1] == d && kt->ne[2] == n_hkv && kt->ne[3] == k->ne[3],
               "K^T must be [n_kv, d, n_head_kv, n_stream]");
    SPARQ_NEED(kt->nb[0] == ggml_type_size(kt->type), "K^T rows must be cell-contiguous");
    SPARQ_NEED(kt->type != GGML_TYPE_Q4_1 || n_kv % GGML_SPARQ_KT4_CELLS == 0,
               "a 4-bit K^T (q4_1) needs n_kv a multiple of 32 (its blocks of cells)");
    SPARQ_NEED(k->nb[0] == ggml_type_size(k->type) && v->nb[0] == ggml_type_size(v->type),
               "K and V rows must be contiguous (flash-attention layout)");
    SPARQ_NEED(v->ne[1] == n_kv && v->ne[2] == n_hkv && v->ne[3] == k->ne[3], "V must be [dv, n_kv, n_head_kv, n_stream]");
    SPARQ_NEED(k->ne[3] == n_strm, "K and q must have the same number of streams");
    SPARQ_NEED(n_hkv > 0 && n_head % n_hkv == 0, "n_head must be a multiple of n_head_kv");
    const struct ggml_tensor * vs = s->v_sum, * vc = s->v_count;
    SPARQ_NEED(vs->type == GGML_TYPE_F32 && vs->ne[0] == dv && vs->ne[1] == n_hkv && vs->ne[2] == n_strm &&
               vs->nb[0] == sizeof(float), "v_sum must be f32 [dv, n_head_kv, n_stream]");
    SPARQ_NEED(vc->type == GGML_TYPE_F32 && ggml_nelements(vc) == n_strm && ggml_is_contiguous(vc),
               "v_count must be f32 [n_stream]");
    if (s->mask) {
        const struct ggml_tensor * m = s->mask;
        SPARQ_NEED(m->type == GGML_TYPE_F16 || m->type == GGML_TYPE_F32, "mask must be f16 or f32");
        SPARQ_NEED(m->ne[0] == n_kv && m->ne[1] >= n_rows && m->ne[2] == 1 && (m->ne[3] == 1 || m->ne[3] == n_strm) &&
                   m->nb[0] == ggml_type_size(m->type), "mask must be [n_kv, >= n_rows, 1, 1 or n_stream]");
    }
    if (s->win) {
        const struct ggml_tensor * w = s->win;
        SPARQ_NEED(w->type == GGML_TYPE_I32 && w->ne[0] >= 1 && w->ne[1] >= n_rows && w->ne[2] == n_strm &&
                   w->nb[0] == sizeof(int32_t), "the window must be i32 [w, n_rows, n_stream]");
    }
    if (s->report) {
        const struct ggml_tensor * r = s->report;
        SPARQ_NEED(r->type == GGML_TYPE_F32 && r->ne[0] == 4 && r->ne[1] == n_hkv && r->ne[2] == n_strm &&
                   r->ne[3] == 1 && ggml_is_contiguous(r), "the report must be contiguous f32 [4, n_head_kv, n_stream]");
    }
    if (s->sinks) {
        SPARQ_NEED(s->sinks->type == GGML_TYPE_F32 && ggml_nelements(s->sinks) == n_head && s->sinks->ne[0] == n_head &&
                   ggml_is_contiguous(s->sinks), "the sinks must be contiguous f32 [n_head]");
    }
    if (s->kq_b) {
        const struct ggml_tensor * b = s->kq_b;
        SPARQ_NEED(b->type == GGML_TYPE_F32 && b->ne[0] == n_kv && b->ne[1] == n_rows && b->ne[2] == n_head &&
                   (b->ne[3] == 1 || b->ne[3] == n_strm) && b->nb[0] == sizeof(float),
                   "the KQ bias must be f32 [n_kv, n_rows, n_head, 1 or n_stream] with contiguous rows");
    }
    return sparq_check_append(s);
}

// the selector's inputs and the parameters only some selectors take (its row says which)
static const char * sparq_check_selector(const struct ggml_sparq_attn_srcs * s, const struct ggml_sparq_attn_params * p) {
    const struct ggml_sparq_selector_info * sel = ggml_sparq_selector_row(p->selector);
    SPARQ_NEED(sel, "unknown selector");
    SPARQ_NEED((p->flags & ~(GGML_SPARQ_FLAG_PER_HEAD | GGML_SPARQ_FLAG_NO_MEAN_V | GGML_SPARQ_FLAG_DENSE)) == 0,
               "unknown flags");
    SPARQ_NEED(sel->probes ? p->n_probe >= 1 : p->n_probe == 0,
               "n_probe is a list-probing selector's (>= 1), 0 for the others");
    SPARQ_NEED(!p->index_reads || sel->reads_feature, "index_reads is for a selector with a read report");
    SPARQ_NEED(sel->ranks || (p->topk_buckets == 0 && p->cov_p == 0.0f && p->k_frac == 0.0f),
               "the bucketed top-k and a coverage target apply to the selectors that rank scores only");
    return sel->check ? sel->check(s, p) : NULL;
}

const char * ggml_sparq_attn_check(const struct ggml_sparq_attn_srcs * s, const struct ggml_sparq_attn_params * p) {
    const char * why = sparq_check_inputs(s);
    if (why) {
        return why;
    }
    SPARQ_NEED(p->r >= 1 && p->r <= s->q->ne[0] && p->r <= GGML_SPARQ_R_MAX, "r must be in [1, d] and at most GGML_SPARQ_R_MAX");
    SPARQ_NEED(p->k >= 1 && p->k <= GGML_SPARQ_K_MAX, "k must be in [1, GGML_SPARQ_K_MAX]");
    SPARQ_NEED(p->l >= 0 && p->l <= p->k, "l must be in [0, k]");
    SPARQ_NEED(isfinite(p->scale) && p->scale > 0.0f, "scale must be finite and > 0");
    if ((why = sparq_check_selector(s, p)) != NULL) {
        return why;
    }
    SPARQ_NEED(p->topk_buckets == 0 || (p->topk_buckets >= p->k && p->topk_buckets <= GGML_SPARQ_K_MAX),
               "topk_buckets must be 0 or in [k, GGML_SPARQ_K_MAX]");
    SPARQ_NEED(p->cov_p == 0.0f || (isfinite(p->cov_p) && p->cov_p > 0.0f && p->cov_p <= 1.0f),
               "the coverage target must be 0 or in (0, 1]");
    SPARQ_NEED(p->cov_p > 0.0f || (!p->cov_apply && p->k_min == 0 && p->k_scan == 0),
               "k_min, k_scan and cov_apply need a coverage target");
    SPARQ_NEED(!(p->cov_apply && p->topk_buckets > 0), "the bucketed top-k needs a fixed k (no coverage cut)");
    SPARQ_NEED(p->k_min >= 0 && p->k_min <= p->k, "k_min must be in [0, k]");
    SPARQ_NEED(p->k_scan >= 0 && p->k_scan <= GGML_SPARQ_K_MAX, "k_scan must be in [0, GGML_SPARQ_K_MAX]");
    SPARQ_NEED(p->k_frac == 0.0f || (p->cov_apply && isfinite(p->k_frac) && p->k_frac > 0.0f && p->k_frac <= 1.0f),
               "k_frac must be 0, or in (0, 1] with the coverage target applied");
    SPARQ_NEED(p->cov_apply ? p->k_scan == 0 : p->k_min == 0, "k_min is the applied coverage's, k_scan the measured one's");
    SPARQ_NEED(p->softcap == 0.0f || (isfinite(p->softcap) && p->softcap > 0.0f), "softcap must be 0 or finite and > 0");
    SPARQ_NEED(p->max_bias == 0.0f || (isfinite(p->max_bias) && p->max_bias > 0.0f), "max_bias must be 0 or finite and > 0");
    return NULL;
}

#undef SPARQ_NEED

struct ggml_tensor * ggml_sparq_attn_ext(struct ggml_context * ctx, const struct ggml_sparq_attn_srcs * s,
                                         const struct ggml_sparq_attn_params * p) {
    const char * why = ggml_sparq_attn_check(s, p);
    if (why) {
        GGML_ABORT("%s", why);
    }
    const int64_t ne[4] = { s->v->ne[0], s->q->ne[2], s->q->ne[1], s->q->ne[3] };
    struct ggml_tensor * result = ggml_new_tensor(ctx, GGML_TYPE_F32, 4, ne);
    result->op = GGML_OP_SPARQ_ATTN;
    struct ggml_tensor * const src[] = { s->q, s->k, s->kt, s->v, s->v_sum, s->v_count, s->mask, s->win,
                                         s->sel[0], s->sel[1], s->report, s->sinks, s->cells, s->v_comp, s->k_sq,
                                         s->kq_b };
    static_assert(sizeof(src) / sizeof(src[0]) <= GGML_MAX_SRC, "the op's sources must fit ggml's");
    for (size_t i = 0; i < sizeof(src) / sizeof(src[0]); ++i) {
        result->src[i] = src[i];
    }
    struct ggml_sparq_params prm;
    memset(&prm, 0, sizeof(prm));
    prm.mode = GGML_SPARQ_MODE_ATTN;
    prm.attn = *p;
    ggml_sparq_params_set(result, &prm);
    return result;
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
    struct ggml_sparq_attn_srcs s;
    memset(&s, 0, sizeof(s));
    s.q = q; s.k = k; s.kt = kt; s.v = v; s.v_sum = v_sum; s.v_count = v_count; s.mask = mask;
    const struct ggml_sparq_attn_params p = ggml_sparq_attn_params_default(r, top_k, local, scale);
    return ggml_sparq_attn_ext(ctx, &s, &p);
}

bool ggml_sparq_attn_view_of(struct ggml_tensor * dst, struct ggml_sparq_attn_view * v) {
    struct ggml_sparq_params prm;
    if (!ggml_sparq_params_decode(dst, &prm) || prm.mode != GGML_SPARQ_MODE_ATTN) {
        return false;
    }
    struct ggml_sparq_attn_view o;
    memset(&o, 0, sizeof(o));
    o.p = prm.attn;
    o.q = dst->src[0]; o.k = dst->src[1]; o.kt = dst->src[2]; o.v = dst->src[3];
    o.v_sum = dst->src[4]; o.v_count = dst->src[5]; o.mask = dst->src[6]; o.win = dst->src[7];
    o.report = dst->src[10];
    o.sinks = dst->src[11];
    o.cells = dst->src[12]; o.v_comp = dst->src[13]; o.k_sq = dst->src[14];
    o.kq_b = dst->src[15];
    o.out = dst;
    o.d = (int) o.q->ne[0];
    o.dv = (int) o.v->ne[0];
    o.n_kv = (int) o.k->ne[1];
    o.n_rows = (int) o.q->ne[1];
    o.n_head = (int) o.q->ne[2];
    o.n_head_kv = (int) o.k->ne[2];
    o.n_stream = (int) o.q->ne[3];
    // the selector's inputs (ggml_sparq_attn_srcs::sel) by role: a ranking selector's basis, or its own
    o.selector = ggml_sparq_selector_row(o.p.selector);
    if (!o.selector) {
        return false;
    }
    if (o.selector->ranks) {
        o.q_sel = dst->src[8]; o.comp_w = dst->src[9];
        o.comp_sq = o.comp_w && o.comp_w == o.k_sq;
    } else {
        o.sel[0] = dst->src[8]; o.sel[1] = dst->src[9];
    }
    *v = o;
    return true;
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
    GGML_ASSERT((dst->type == GGML_TYPE_F32 || dst->type == GGML_TYPE_F16 || dst->type == GGML_TYPE_I8 ||
                 dst->type == GGML_TYPE_Q4_1) && ggml_is_contiguous(dst) &&
                "sparq_cell_scatter: dst must be contiguous f32, f16, i8 (e5m2) or q4_1 (4-bit K^T)");
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
