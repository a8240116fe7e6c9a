// llama-sparq: the op's selectors, one row each (ggml-sparq.h's struct ggml_sparq_selector_info):
// the only code of the op and its backends' glue that names a selector. The constructor's checks,
// the feature bits and the backends' support checks ask a row what its selector takes and sets.

#include "ggml-sparq.h"

#include <assert.h>
#include <stddef.h>

#define SPARQ_NEED(cond, what) do { if (!(cond)) { return "sparq_attn: " what; } } while (0)

// sparq, oracle: a basis, both parts optional (sel[0] = q_sel, sel[1] = comp_w)
static const char * check_basis(const struct ggml_sparq_attn_srcs * s, const struct ggml_sparq_attn_params * p) {
    (void) p;
    const struct ggml_tensor * q = s->q, * k = s->k, * s0 = s->sel[0], * s1 = s->sel[1];
    SPARQ_NEED(!s0 || (s0->type == GGML_TYPE_F32 && ggml_are_same_shape(s0, q) && s0->nb[0] == sizeof(float)),
               "q_sel must be f32 with q's shape");
    SPARQ_NEED(!s1 || (s1->type == GGML_TYPE_F32 && s1->ne[0] == q->ne[0] && s1->ne[1] == k->ne[2] &&
                       (s1->ne[2] == 1 || s1->ne[2] == q->ne[3]) && s1->ne[3] == 1 && s1->nb[0] == sizeof(float)),
               "comp_w must be f32 [d, n_head_kv, 1 or n_stream]");
    return NULL;
}

static const char * check_streaming(const struct ggml_sparq_attn_srcs * s, const struct ggml_sparq_attn_params * p) {
    (void) p;
    SPARQ_NEED(!s->sel[0] && !s->sel[1], "the streaming selector takes no inputs");
    return NULL;
}

// a per-cell f32 input [n_kv, n_head_kv, n_stream]
static bool per_cell(const struct ggml_tensor * t, const struct ggml_tensor * k) {
    return t->type == GGML_TYPE_F32 && t->ne[0] == k->ne[1] && t->ne[1] == k->ne[2] && t->ne[2] == k->ne[3] &&
           t->ne[3] == 1 && t->nb[0] == sizeof(float);
}

static const char * check_h2o(const struct ggml_sparq_attn_srcs * s, const struct ggml_sparq_attn_params * p) {
    (void) p;
    SPARQ_NEED(s->sel[0] && !s->sel[1], "the h2o selector takes its scores (sel[0]) alone");
    SPARQ_NEED(per_cell(s->sel[0], s->k), "the H2O scores must be f32 [n_kv, n_head_kv, n_stream]");
    return NULL;
}

static const char * check_index(const struct ggml_sparq_attn_srcs * s, const struct ggml_sparq_attn_params * p) {
    const struct ggml_tensor * q = s->q, * k = s->k, * s0 = s->sel[0], * s1 = s->sel[1];
    SPARQ_NEED(s0 && s1, "the index selector takes its centroids (sel[0]) and lists (sel[1])");
    SPARQ_NEED(s0->type == GGML_TYPE_F32 && s0->ne[0] == q->ne[0] && s0->ne[1] >= 1 && s0->ne[2] == k->ne[2] &&
               s0->ne[3] == k->ne[3] && s0->nb[0] == sizeof(float),
               "the index centroids must be f32 [d, n_list, n_head_kv, n_stream]");
    SPARQ_NEED(per_cell(s1, k), "the index lists must be f32 [n_kv, n_head_kv, n_stream]");
    SPARQ_NEED(p->n_probe <= s0->ne[1], "n_probe must be in [1, n_list]");
    SPARQ_NEED(!p->index_reads || s0->nb[2] >= (size_t) (s0->ne[1] + 1) * s0->nb[1],
               "the index reads need a row after the last centroid (centroids->nb[2] >= (n_list + 1) * nb[1])");
    return NULL;
}

#undef SPARQ_NEED

// the numbering: a row per value of enum ggml_sparq_selector, in its place
static_assert(GGML_SPARQ_SEL_COUNT == 5, "a new selector: give it its row here (and its feature bit)");

static const struct ggml_sparq_selector_info sparq_selectors[GGML_SPARQ_SEL_COUNT] = {
    [GGML_SPARQ_SEL_SPARQ] = {
        .name = "sparq", .feature = 0, .feature_name = NULL,
        .ranks = true, .check = check_basis,
    },
    [GGML_SPARQ_SEL_ORACLE] = {
        .name = "oracle", .feature = GGML_SPARQ_FEAT_ORACLE, .feature_name = "the oracle selector",
        .ranks = true, .every_component = true, .check = check_basis,
    },
    [GGML_SPARQ_SEL_STREAMING] = {
        .name = "streaming", .feature = GGML_SPARQ_FEAT_STREAMING, .feature_name = "the streaming selector",
        .check = check_streaming,
    },
    [GGML_SPARQ_SEL_H2O] = {
        .name = "h2o", .feature = GGML_SPARQ_FEAT_H2O, .feature_name = "the h2o selector",
        .check = check_h2o,
    },
    [GGML_SPARQ_SEL_INDEX] = {
        .name = "index", .feature = GGML_SPARQ_FEAT_INDEX, .feature_name = "the index selector",
        .probes = true, .reads_feature = GGML_SPARQ_FEAT_INDEX_READS, .reads_feature_name = "the index's read report",
        .check = check_index,
    },
};

const struct ggml_sparq_selector_info * ggml_sparq_selector_row(int32_t selector) {
    return selector >= 0 && selector < GGML_SPARQ_SEL_COUNT ? &sparq_selectors[selector] : NULL;
}
