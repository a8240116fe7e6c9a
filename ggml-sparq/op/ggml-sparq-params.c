// llama-sparq: the one encoding of GGML_OP_SPARQ_ATTN's parameters (ggml-sparq-params.h).

#include "ggml-sparq-params.h"
#include "ggml-sparq.h"

#include "ggml-impl.h"

#include <string.h>

// The op_params slots (int32 each). Only this file knows them.
enum sparq_slot {
    SLOT_HEAD         = 0, // the layout version (bits 24-31), the mode (21-23), the selector (17-20; SEL_NONE:
                           // none of this build's), the flags (12-16: enum ggml_sparq_flag, then BIT_*), r (0-11)
    SLOT_FEATURES     = 1,
    // attention: a slot per field, but for k_min (a coverage applied) and k_scan (one only measured),
    // which no node sets together (cov_apply says which the slot holds)
    SLOT_K            = 2,
    SLOT_L            = 3,
    SLOT_SCALE        = 4,
    SLOT_N_PROBE      = 5,
    SLOT_TOPK_BUCKETS = 6,
    SLOT_COV_P        = 7,
    SLOT_COV_N        = 8,
    SLOT_K_FRAC       = 9,
    SLOT_SOFTCAP      = 10,
    SLOT_MAX_BIAS     = 11,
    // a sum's append
    SLOT_SUM_TYPE     = 2,
    SLOT_SUM_SQUARES  = 3,
    SLOT_COUNT        = 12,
};

static_assert(GGML_SPARQ_PARAMS_SLOTS * sizeof(int32_t) == GGML_MAX_OP_PARAMS, "the slots are op_params");
static_assert(SLOT_COUNT + GGML_SPARQ_PARAMS_MIN_FREE <= GGML_SPARQ_PARAMS_SLOTS,
              "the layout must leave room for the parts to come");

// the head slot's fields
#define HEAD_VERSION_SHIFT 24
#define HEAD_MODE_SHIFT    21
#define HEAD_MODE_MASK     0x7u
#define HEAD_SEL_SHIFT     17
#define HEAD_SEL_MASK      0xfu
#define SEL_NONE           0xfu  // a selector value outside 0..14, decoded as -1
#define HEAD_FLAGS_SHIFT   12
#define FLAGS_MASK         0x1fu // the flags of enum ggml_sparq_flag and the two booleans below
#define BIT_INDEX_READS    0x08u
#define BIT_COV_APPLY      0x10u
#define GGML_FLAGS_MASK    0x07u
#define HEAD_R_MASK        0xfffu
static_assert(GGML_SPARQ_R_MAX == HEAD_R_MASK, "r fills the head slot's low bits");
static_assert(GGML_SPARQ_MODE_COUNT <= HEAD_MODE_MASK + 1 && GGML_SPARQ_SEL_COUNT < SEL_NONE, "the head's fields");

int ggml_sparq_params_free_slots(void) {
    return GGML_SPARQ_PARAMS_SLOTS - SLOT_COUNT;
}

static int32_t slot_i32(const int32_t * s, int i) { return s[i]; }
static float slot_f32(const int32_t * s, int i) { float f; memcpy(&f, &s[i], sizeof(f)); return f; }
static void put_f32(int32_t * s, int i, float f) { memcpy(&s[i], &f, sizeof(f)); }

bool ggml_sparq_params_decode(const struct ggml_tensor * node, struct ggml_sparq_params * p) {
    if (!node || node->op != GGML_OP_SPARQ_ATTN) {
        return false;
    }
    const int32_t * s = (const int32_t *) node->op_params;
    const uint32_t head = (uint32_t) slot_i32(s, SLOT_HEAD);
    const uint32_t mode = (head >> HEAD_MODE_SHIFT) & HEAD_MODE_MASK;
    if ((head >> HEAD_VERSION_SHIFT) != GGML_SPARQ_PARAMS_VERSION || mode >= GGML_SPARQ_MODE_COUNT) {
        return false;
    }
    struct ggml_sparq_params o;
    memset(&o, 0, sizeof(o));
    o.mode = (enum ggml_sparq_mode) mode;
    o.features = (uint32_t) slot_i32(s, SLOT_FEATURES);
    if (o.mode == GGML_SPARQ_MODE_ATTN) {
        struct ggml_sparq_attn_params * a = &o.attn;
        const uint32_t sel = (head >> HEAD_SEL_SHIFT) & HEAD_SEL_MASK;
        const uint32_t fl = (head >> HEAD_FLAGS_SHIFT) & FLAGS_MASK;
        a->selector = sel == SEL_NONE ? -1 : (int32_t) sel;
        a->flags = (int32_t) (fl & GGML_FLAGS_MASK);
        a->index_reads = (fl & BIT_INDEX_READS) != 0;
        a->cov_apply = (fl & BIT_COV_APPLY) != 0;
        a->r = (int32_t) (head & HEAD_R_MASK);
        a->k = slot_i32(s, SLOT_K);
        a->l = slot_i32(s, SLOT_L);
        a->scale = slot_f32(s, SLOT_SCALE);
        a->n_probe = slot_i32(s, SLOT_N_PROBE);
        a->topk_buckets = slot_i32(s, SLOT_TOPK_BUCKETS);
        a->cov_p = slot_f32(s, SLOT_COV_P);
        a->k_min = a->cov_apply ? slot_i32(s, SLOT_COV_N) : 0;
        a->k_scan = a->cov_apply ? 0 : slot_i32(s, SLOT_COV_N);
        a->k_frac = slot_f32(s, SLOT_K_FRAC);
        a->softcap = slot_f32(s, SLOT_SOFTCAP);
        a->max_bias = slot_f32(s, SLOT_MAX_BIAS);
    } else if (o.mode == GGML_SPARQ_MODE_SUM_APPEND) {
        o.sum.type = slot_i32(s, SLOT_SUM_TYPE);
        o.sum.squares = slot_i32(s, SLOT_SUM_SQUARES) != 0;
    }
    *p = o;
    return true;
}

struct ggml_sparq_params ggml_sparq_params_get(const struct ggml_tensor * node) {
    struct ggml_sparq_params p;
    if (!ggml_sparq_params_decode(node, &p)) {
        GGML_ABORT("sparq_attn: %s holds no parameters of layout version %d (a node from another build?)",
                   node ? node->name : "(null)", GGML_SPARQ_PARAMS_VERSION);
    }
    return p;
}

uint32_t ggml_sparq_params_features(const struct ggml_tensor * node, const struct ggml_sparq_params * p) {
    if (p->mode != GGML_SPARQ_MODE_ATTN) {
        return 0;
    }
    const struct ggml_sparq_attn_params * a = &p->attn;
    uint32_t f = 0;
    // the selector's own bits, as its row declares them (an unknown selector: a bit every backend refuses)
    const struct ggml_sparq_selector_info * sel = ggml_sparq_selector_row(a->selector);
    f |= sel ? sel->feature : GGML_SPARQ_FEAT_UNKNOWN;
    f |= sel && a->index_reads ? sel->reads_feature : 0;
    f |= (a->flags & GGML_SPARQ_FLAG_PER_HEAD) ? GGML_SPARQ_FEAT_PER_HEAD : 0;
    f |= (a->flags & GGML_SPARQ_FLAG_NO_MEAN_V) ? GGML_SPARQ_FEAT_NO_MEAN_V : 0;
    f |= (a->flags & GGML_SPARQ_FLAG_DENSE) ? GGML_SPARQ_FEAT_DENSE : 0;
    f |= node->src[7] ? GGML_SPARQ_FEAT_WINDOW : 0;
    f |= sel && sel->ranks && (node->src[8] || node->src[9]) ? GGML_SPARQ_FEAT_BASIS : 0;
    if (a->cov_p > 0.0f) {
        f |= a->cov_apply ? GGML_SPARQ_FEAT_COVERAGE : GGML_SPARQ_FEAT_COVERAGE_MEASURE;
    }
    f |= a->k_frac > 0.0f ? GGML_SPARQ_FEAT_COVERAGE_CAP : 0;
    f |= node->src[10] ? GGML_SPARQ_FEAT_REPORT : 0;
    f |= a->topk_buckets > 0 ? GGML_SPARQ_FEAT_TOPK_BUCKETS : 0;
    f |= a->softcap != 0.0f ? GGML_SPARQ_FEAT_SOFTCAP : 0;
    f |= a->max_bias != 0.0f ? GGML_SPARQ_FEAT_ALIBI : 0;
    f |= node->src[11] ? GGML_SPARQ_FEAT_SINKS : 0;
    f |= node->src[12] ? GGML_SPARQ_FEAT_APPEND : 0;
    f |= node->src[15] ? GGML_SPARQ_FEAT_KQ_BIAS : 0;
    f |= sel && sel->ranks && node->src[9] && node->src[9] == node->src[14] ? GGML_SPARQ_FEAT_COMP_SQ : 0;
    return f;
}

void ggml_sparq_params_set(struct ggml_tensor * node, const struct ggml_sparq_params * p) {
    GGML_ASSERT(node->op == GGML_OP_SPARQ_ATTN && (unsigned) p->mode < GGML_SPARQ_MODE_COUNT);
    int32_t s[GGML_SPARQ_PARAMS_SLOTS];
    memset(s, 0, sizeof(s));
    uint32_t head = ((uint32_t) GGML_SPARQ_PARAMS_VERSION << HEAD_VERSION_SHIFT) | ((uint32_t) p->mode << HEAD_MODE_SHIFT);
    if (p->mode == GGML_SPARQ_MODE_ATTN) {
        const struct ggml_sparq_attn_params * a = &p->attn;
        s[SLOT_FEATURES] = (int32_t) (ggml_sparq_params_features(node, p) | (p->features & ~GGML_SPARQ_FEAT_ALL));
        // (flags beyond the layout's are no flag of this build's; a selector out of range stays unknown)
        GGML_ASSERT((a->flags & ~(int32_t) GGML_FLAGS_MASK) == 0 && "sparq_attn: flags beyond the layout's");
        const uint32_t sel = a->selector < 0 || a->selector >= (int32_t) SEL_NONE ? SEL_NONE : (uint32_t) a->selector;
        // (ggml_sparq_attn_check keeps r in [1, GGML_SPARQ_R_MAX] and k_min, k_scan to their mode)
        GGML_ASSERT(a->r >= 0 && a->r <= GGML_SPARQ_R_MAX && "sparq_attn: r beyond GGML_SPARQ_R_MAX");
        const uint32_t fl = (uint32_t) a->flags | (a->index_reads ? BIT_INDEX_READS : 0u) | (a->cov_apply ? BIT_COV_APPLY : 0u);
        head |= (sel << HEAD_SEL_SHIFT) | (fl << HEAD_FLAGS_SHIFT) | (uint32_t) a->r;
        s[SLOT_K] = a->k;
        s[SLOT_L] = a->l;
        put_f32(s, SLOT_SCALE, a->scale);
        GGML_ASSERT((a->cov_apply ? a->k_scan : a->k_min) == 0 && "sparq_attn: k_min without cov_apply, or k_scan with it");
        s[SLOT_N_PROBE] = a->n_probe;
        s[SLOT_TOPK_BUCKETS] = a->topk_buckets;
        put_f32(s, SLOT_COV_P, a->cov_p);
        s[SLOT_COV_N] = a->cov_apply ? a->k_min : a->k_scan;
        put_f32(s, SLOT_K_FRAC, a->k_frac);
        put_f32(s, SLOT_SOFTCAP, a->softcap);
        put_f32(s, SLOT_MAX_BIAS, a->max_bias);
    } else if (p->mode == GGML_SPARQ_MODE_SUM_APPEND) {
        s[SLOT_SUM_TYPE] = p->sum.type;
        s[SLOT_SUM_SQUARES] = p->sum.squares ? 1 : 0;
    }
    s[SLOT_HEAD] = (int32_t) head;
    memcpy(node->op_params, s, sizeof(s));
}

const char * ggml_sparq_feature_name(uint32_t bit) {
    for (int32_t id = 0; id < GGML_SPARQ_SEL_COUNT; ++id) {
        const struct ggml_sparq_selector_info * sel = ggml_sparq_selector_row(id);
        if (bit != 0 && bit == sel->feature) {
            return sel->feature_name;
        }
        if (bit != 0 && bit == sel->reads_feature) {
            return sel->reads_feature_name;
        }
    }
    switch (bit) {
        case GGML_SPARQ_FEAT_PER_HEAD:         return "the per-head flag";
        case GGML_SPARQ_FEAT_NO_MEAN_V:        return "the no-mean-V flag";
        case GGML_SPARQ_FEAT_DENSE:            return "the dense flag";
        case GGML_SPARQ_FEAT_WINDOW:           return "a window list";
        case GGML_SPARQ_FEAT_BASIS:            return "a basis (q_sel, comp_w)";
        case GGML_SPARQ_FEAT_COVERAGE:         return "a coverage target";
        case GGML_SPARQ_FEAT_COVERAGE_CAP:     return "a per-row cap (k_frac)";
        case GGML_SPARQ_FEAT_COVERAGE_MEASURE: return "a measured coverage (k_scan)";
        case GGML_SPARQ_FEAT_REPORT:           return "a report";
        case GGML_SPARQ_FEAT_TOPK_BUCKETS:     return "the approximate bucketed top-k (topk_buckets)";
        case GGML_SPARQ_FEAT_SOFTCAP:          return "logit soft-capping (softcap)";
        case GGML_SPARQ_FEAT_ALIBI:            return "ALiBi (max_bias)";
        case GGML_SPARQ_FEAT_SINKS:            return "attention sinks";
        case GGML_SPARQ_FEAT_APPEND:           return "the step's append (cells, v_comp, k_sq)";
        case GGML_SPARQ_FEAT_COMP_SQ:          return "weights as sums of squares (comp_w is k_sq)";
        case GGML_SPARQ_FEAT_KQ_BIAS:          return "a KQ bias (kq_b)";
        default:                               return "a part unknown to this build";
    }
}

const char * ggml_sparq_params_unsupported(const struct ggml_tensor * node, uint32_t honours) {
    struct ggml_sparq_params p;
    if (!ggml_sparq_params_decode(node, &p)) {
        return "op parameters of another layout version (a node from another build)";
    }
    const uint32_t extra = p.features & ~honours;
    if (extra == 0) {
        return NULL;
    }
    return ggml_sparq_feature_name(extra & (~extra + 1u)); // the lowest such bit
}
