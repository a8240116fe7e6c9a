// llama-sparq: the parameters of a GGML_OP_SPARQ_ATTN node, as one typed struct.
//
// A node's op_params hold this struct in one layout, written and read only by
// ggml_sparq_params_set / ggml_sparq_params_get (op/ggml-sparq-params.c): the constructor and its
// setters, the CPU and CUDA backends and the captures all go through them, and an RPC server
// decodes the bytes its client sent with the same functions. The layout carries a version, so a
// node from a build with another layout is refused rather than misread.
//
// Every optional part of an attention node (a selector other than sparq, a flag, a window, a
// basis, a coverage target, a report) sets a bit in `features`. A backend names the bits it
// honours and refuses a node with any other bit set: a part added later is refused by every
// backend that has not been taught it, never silently ignored.
#pragma once

#include "ggml.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GGML_SPARQ_PARAMS_VERSION 6

// The int32 slots of op_params the layout may use (GGML_MAX_OP_PARAMS / 4), and how many of them it
// must leave free for the parts to come (a test checks ggml_sparq_params_free_slots against it).
#define GGML_SPARQ_PARAMS_SLOTS     16
#define GGML_SPARQ_PARAMS_MIN_FREE  4

// What a node of the op computes: attention, or one of the writes that keep its cache data
// (ggml_sparq_kt_append, ggml_sparq_sum_append, ggml_sparq_cell_scatter in ggml-sparq.h).
enum ggml_sparq_mode {
    GGML_SPARQ_MODE_ATTN       = 0,
    GGML_SPARQ_MODE_KT_APPEND  = 1,
    GGML_SPARQ_MODE_SUM_APPEND = 2,
    GGML_SPARQ_MODE_CELL_SCATTER = 3,
    GGML_SPARQ_MODE_COUNT,
};

// The optional parts of an attention node. A backend's support check refuses a node with a bit
// outside the set it honours. Buffers the op reads or writes besides its inputs (a report, a
// selector's state) are sources of the node, never addresses in its parameters.
enum ggml_sparq_feature {
    // the selectors' own bits (a selector other than the default, its read report; in
    // GGML_SPARQ_FEAT_SELECTORS): each selector's row (op/ggml-sparq-selectors.c) names its bits,
    // and code elsewhere asks the row
    GGML_SPARQ_FEAT_ORACLE           = 1u << 0,
    GGML_SPARQ_FEAT_STREAMING        = 1u << 1,
    GGML_SPARQ_FEAT_H2O              = 1u << 2,
    GGML_SPARQ_FEAT_INDEX            = 1u << 3,
    GGML_SPARQ_FEAT_INDEX_READS      = 1u << 4,
    GGML_SPARQ_FEAT_PER_HEAD         = 1u << 5,  // GGML_SPARQ_FLAG_PER_HEAD
    GGML_SPARQ_FEAT_NO_MEAN_V        = 1u << 6,  // GGML_SPARQ_FLAG_NO_MEAN_V
    GGML_SPARQ_FEAT_DENSE            = 1u << 7,  // GGML_SPARQ_FLAG_DENSE
    GGML_SPARQ_FEAT_WINDOW           = 1u << 8,  // src[7]: the window list
    GGML_SPARQ_FEAT_BASIS            = 1u << 9,  // src[8], src[9]: q_sel, comp_w (a selector that ranks scores)
    GGML_SPARQ_FEAT_COVERAGE         = 1u << 10, // a coverage target that cuts the selection
    GGML_SPARQ_FEAT_COVERAGE_CAP     = 1u << 11, // each row's cap from k_frac of its cells
    GGML_SPARQ_FEAT_COVERAGE_MEASURE = 1u << 12, // a coverage target only measured (k_scan)
    GGML_SPARQ_FEAT_REPORT           = 1u << 13, // src[10]: the report the op writes
    GGML_SPARQ_FEAT_TOPK_BUCKETS     = 1u << 14, // the approximate bucketed top-k (topk_buckets)
    GGML_SPARQ_FEAT_SOFTCAP          = 1u << 15, // logit soft-capping (softcap)
    GGML_SPARQ_FEAT_ALIBI            = 1u << 16, // ALiBi: the mask times a slope per head (max_bias)
    GGML_SPARQ_FEAT_SINKS            = 1u << 17, // src[11]: a sink logit per query head
    GGML_SPARQ_FEAT_APPEND           = 1u << 18, // src[12..14]: the step's append (cells, v_comp, k_sq)
    GGML_SPARQ_FEAT_COMP_SQ          = 1u << 19, // comp_w (src[9]) is k_sq (src[14]): weights are its roots
    GGML_SPARQ_FEAT_KQ_BIAS          = 1u << 20, // src[15]: a bias added to every score (T5's position bias)
};
#define GGML_SPARQ_FEAT_ALL ((1u << 21) - 1u)
// the bits the selectors' rows name (feature, reads_feature): a backend honours them by asking the rows
#define GGML_SPARQ_FEAT_SELECTORS (GGML_SPARQ_FEAT_ORACLE | GGML_SPARQ_FEAT_STREAMING | GGML_SPARQ_FEAT_H2O | \
                                   GGML_SPARQ_FEAT_INDEX | GGML_SPARQ_FEAT_INDEX_READS)
// a selector value this build does not know: outside every backend's set
#define GGML_SPARQ_FEAT_UNKNOWN (1u << 31)

// Flags of the selection and the output (ggml_sparq_attn_params::flags).
enum ggml_sparq_flag {
    GGML_SPARQ_FLAG_PER_HEAD  = 1, // each query head chooses its own k - l cells; the group attends over the union
    GGML_SPARQ_FLAG_NO_MEAN_V = 2, // no mean-value reallocation (out = attention over the chosen cells)
    GGML_SPARQ_FLAG_DENSE     = 4, // no selection: every row attends over every valid cell (K^T not read; the CPU op)
};

// An attention node's parameters (the setters of ggml-sparq.h say what each means).
struct ggml_sparq_attn_params {
    int32_t r;           // components of step 1, 1..min(d, GGML_SPARQ_R_MAX)
    int32_t k;           // cells attended (the scratch's size with a coverage target), 1..GGML_SPARQ_K_MAX
    int32_t l;           // the local window's cells, 0..k
    float   scale;       // the logits' scale, finite and > 0
    int32_t selector;    // enum ggml_sparq_selector
    int32_t flags;       // enum ggml_sparq_flag
    int32_t n_probe;     // index: lists probed, 1..n_list
    int32_t topk_buckets; // ranking selectors: the approximate bucketed top-k's buckets (a cell's is its
                          // index mod topk_buckets; each bucket's best, then the k - l best of
                          // those), k..GGML_SPARQ_K_MAX; 0: the exact top-k
    bool    index_reads; // index: report the rows read
    float   cov_p;       // coverage target in (0, 1], 0 for none
    int32_t k_min;       // coverage applied: the fewest cells, 0..k
    int32_t k_scan;      // coverage measured only: cells ranked, 0..GGML_SPARQ_K_MAX (shares k_min's slot)
    bool    cov_apply;   // coverage: cut the selection (else only measure)
    float   k_frac;      // coverage cap: share of a row's cells, (0, 1], 0 for none
    // the attention variants (docs/algorithm.md): every logit, approximate and exact, is
    // softcap * tanh(logit / softcap) before the mask is added, and the mask is added times head h's
    // ALiBi slope (ggml's soft_max_ext: from max_bias and n_head)
    float   softcap;     // > 0 and finite, 0 for none
    float   max_bias;    // > 0 and finite, 0 for none (slope 1)
};

// A sum's append (ggml_sparq_sum_append).
struct ggml_sparq_sum_params {
    int32_t type;        // enum ggml_type of the cache: f16 or f32
    bool    squares;     // append the squares
};

struct ggml_sparq_params {
    enum ggml_sparq_mode mode;
    uint32_t features;   // attention: the optional parts in use (enum ggml_sparq_feature)
    struct ggml_sparq_attn_params attn; // mode ATTN
    struct ggml_sparq_sum_params  sum;  // mode SUM_APPEND
};

// The parameters of a node of the op; false (and *p untouched) when its op_params hold another
// layout version, or the node is not GGML_OP_SPARQ_ATTN.
GGML_API bool ggml_sparq_params_decode(const struct ggml_tensor * node, struct ggml_sparq_params * p);
// The same, aborting with the node's name on a foreign layout.
GGML_API struct ggml_sparq_params ggml_sparq_params_get(const struct ggml_tensor * node);
// Writes p into the node's op_params. For an attention node `features` becomes the parts p and the
// node's sources use, plus any bit of p->features outside GGML_SPARQ_FEAT_ALL (a part this build
// does not know, which every backend then refuses).
GGML_API void ggml_sparq_params_set(struct ggml_tensor * node, const struct ggml_sparq_params * p);
// The optional parts an attention node with parameters p and its sources uses.
GGML_API uint32_t ggml_sparq_params_features(const struct ggml_tensor * node, const struct ggml_sparq_params * p);
// Why a backend that honours the parts `honours` cannot run the node's parameters (a foreign
// layout, or a part outside `honours`), or NULL when it can. Names the first such part.
GGML_API const char * ggml_sparq_params_unsupported(const struct ggml_tensor * node, uint32_t honours);
// A feature bit's name ("a window list", ...), "unknown" for a bit this build does not know.
GGML_API const char * ggml_sparq_feature_name(uint32_t bit);
// The op_params slots no mode of the layout uses (at least GGML_SPARQ_PARAMS_MIN_FREE).
GGML_API int ggml_sparq_params_free_slots(void);

static inline enum ggml_sparq_mode ggml_sparq_mode_of(const struct ggml_tensor * t) {
    struct ggml_sparq_params p;
    return ggml_sparq_params_decode(t, &p) ? p.mode : GGML_SPARQ_MODE_COUNT;
}

#ifdef __cplusplus
}
#endif
