// llama-sparq: additions to the GGML_OP_SPARQ_ATTN op beyond its ggml.h constructor.
#pragma once

#include "ggml.h"
#include "ggml-sparq-e5m2.h"
#include "ggml-sparq-kt4.h"
#include "ggml-sparq-params.h"

#ifdef __cplusplus
extern "C" {
#endif

// The types of a KV cache whose K and V rows the op reads (f16, f32, and the blocks of q8_0, q4_0, q4_1,
// q5_0, q5_1 and iq4_nl: a quantized cache's K^T is kept f16 from its dequantized keys). The one list:
// the op's checks and libllama's choice of the layers that run SparQ both use it.
GGML_API bool ggml_sparq_cache_type_ok(enum ggml_type t);

// The largest k the op accepts (scratch is sized by k).
#define GGML_SPARQ_K_MAX (1 << 20)
// The largest r (and so head size to rank in full) the op's parameters hold: 12 bits of their head slot.
#define GGML_SPARQ_R_MAX 4095

// Selectors: how the op chooses the cells it attends over (steps 1-3 of docs/algorithm.md); the
// exact attention over them and the mean-value mix are shared.
enum ggml_sparq_selector {
    GGML_SPARQ_SEL_SPARQ  = 0, // approximate scores from the r largest query components (default)
    GGML_SPARQ_SEL_ORACLE = 1, // exact scores, the oracle top-k (reads all of K: a baseline)
    // The paper's baselines (Appendix G). Neither reads K^T or mixes in the mean of V.
    // LM-Infinite / StreamingLLM: the l most recent cells and the k - l earliest ones (attention
    // sinks). With a window list (ggml_sparq_attn_srcs::win) of k entries per row, entries
    // 0..l-1 name the l most recent positions' cells and entries l..k-1 the earliest positions';
    // without one they are the last l and the first k - l valid cells by index.
    GGML_SPARQ_SEL_STREAMING = 2,
    // H2O (heavy hitters): the l most recent cells and the k - l cells with the largest
    // accumulated attention (its input, ggml_sparq_attn_srcs::sel), ties to the lower index. The op adds each
    // row's attention weights over the cells it attended to (summed over the query heads of the
    // group) into those scores after every row chose: a cell left out keeps its score, which is
    // H2O's eviction with a fixed budget of k cells.
    GGML_SPARQ_SEL_H2O = 3,
    // Top-k attention over an inverted-file (IVF) index of the keys (the vector-index selector of
    // "Running huge context windows on tiny GPUs"): its inputs (ggml_sparq_attn_srcs::sel) give n_list
    // centroids per KV head and each cell's list. The group's summed query ranks the lists by
    // q . centroid; the cells of the n_probe best lists, outside the l most recent, are ranked by
    // their exact logit summed over the group, the best k - l kept (ties to the lower index). A
    // valid cell whose list is -1 is first assigned to its nearest centroid (L2, ties to the lower
    // list) and the op writes that id. No K^T, no mean of V.
    GGML_SPARQ_SEL_INDEX = 4,
    GGML_SPARQ_SEL_COUNT,
};

struct ggml_sparq_attn_srcs;

// A selector as the op and its backends know it: one row per value of enum ggml_sparq_selector
// (op/ggml-sparq-selectors.c). Outside its row and its own files no code of the op names a
// selector: the checks, the feature bits and the backends' glue ask its row.
struct ggml_sparq_selector_info {
    const char * name;            // as the settings spell it
    uint32_t feature;             // its bit of enum ggml_sparq_feature (0: the default selector, none)
    const char * feature_name;    // that bit's name, for a refusal
    uint32_t reads_feature;       // the bit of its read report (index_reads), 0 where it has none
    const char * reads_feature_name;
    bool ranks;                   // ranks approximate scores: sel[] is a basis (q_sel, comp_w), and
                                  // topk_buckets and a coverage target apply
    bool every_component;         // ranks the exact scores: it runs with r = d whatever the node's r
    bool probes;                  // takes n_probe (>= 1; 0 for every other selector)
    // why its inputs (srcs->sel) and its own parameters do not make a node, or NULL
    const char * (*check)(const struct ggml_sparq_attn_srcs * s, const struct ggml_sparq_attn_params * p);
};

// The row of a selector value; NULL for a value this build does not know.
GGML_API const struct ggml_sparq_selector_info * ggml_sparq_selector_row(int32_t selector);

// The sources of an attention node (ggml_sparq_attn_ext), in the node's src[] in this order. q to
// v_count are required; the rest NULL where unused. Shapes as in ggml_sparq_attn (ggml.h).
struct ggml_sparq_attn_srcs {
    struct ggml_tensor * q;       // src[0]: f32 [d, n_rows, n_head, n_stream]
    struct ggml_tensor * k;       // src[1]: [d, n_kv, n_head_kv, n_stream] f16, f32 or a quantized cache type (whole blocks)
    struct ggml_tensor * kt;      // src[2]: [n_kv, d, n_head_kv, n_stream] f16, f32, i8 (e5m2) or q4_1 (4-bit)
    struct ggml_tensor * v;       // src[3]: [dv, n_kv, n_head_kv, n_stream] as K's types
    struct ggml_tensor * v_sum;   // src[4]: f32 [dv, n_head_kv, n_stream]
    struct ggml_tensor * v_count; // src[5]: f32 [n_stream]
    struct ggml_tensor * mask;    // src[6]: f16 or f32 [n_kv, >= n_rows, 1, 1 or n_stream]; NULL: all cells valid
    // src[7]: the local window explicitly, i32 [w, n_rows, n_stream]: per query row the cells of the
    // l most recent positions (w >= l entries used, -1 for none). Without it the window is the last l
    // valid cells by cell index, which is the same thing only while cells are in position order. The
    // streaming selector reads k entries per row: 0..l-1 the most recent positions' cells, l..k-1 the
    // earliest positions'.
    struct ggml_tensor * win;
    // src[8], src[9]: the selector's inputs.
    // - sparq, oracle (a basis, both optional): q_sel (f32, q's shape), the query in the basis K^T is
    //   stored in (steps 1-2 use it; step 4 uses q and K); comp_w (f32 [d, n_head_kv, 1 or n_stream]),
    //   which weighs the components in step 1's choice and tau's norms.
    // - h2o: sel[0] the accumulated attention per cell, f32 [n_kv, n_head_kv, n_stream], read to choose
    //   and written by the op (a side effect: it must live in memory the op's device writes, and no
    //   other node of the graph may read it after the op).
    // - index: sel[0] the centroids, f32 [d, n_list, n_head_kv, n_stream]; sel[1] each cell's list,
    //   f32 [n_kv, n_head_kv, n_stream], -1 for a cell not yet assigned, which the op assigns and
    //   writes (as H2O's scores). With index_reads the op also writes, per (KV head, stream), the key
    //   rows it scored for the stream's last query row (-1 when it ran dense) as an f32 into element 0
    //   of row n_list of the centroids' block: that row must exist beyond the view (centroids->nb[2]
    //   >= (n_list + 1) * nb[1]).
    struct ggml_tensor * sel[2];
    // src[10]: optional, what each stream's last query row did, per (stream, KV head): 4 floats
    // {cells attended (-1: the row ran dense), the estimated coverage of those cells (mean over the
    // group's heads), the cells reaching the coverage target with the window (-1 without a target),
    // 1 if the ranked cells reached it else 0}, f32 [4, n_head_kv, n_stream], contiguous, written by
    // the op on its device (a side effect, as H2O's scores). On a GPU a diffuse row's reach is a
    // lower bound at or above its cap.
    struct ggml_tensor * report;
    // src[11]: optional, attention sinks (gpt-oss): f32 [n_head], contiguous, a logit per query head
    // with a zero value row: exp(sink - max) joins every softmax's denominator, approximate and exact
    struct ggml_tensor * sinks;
    // src[12..14]: optional, together, on a decode step (one query row per stream): the step's append.
    // Before it attends the op brings its kept data up to date with each stream's new cell, reading
    // that cell's K and V rows from the cache (written there before the op, as the values the cache
    // holds): K^T's column (encoded as ggml_sparq_cell_scatter encodes it), v_sum (+= v, compensated
    // with v_comp), v_count (+= 1), k_sq (+= k^2) and, with a window, the push of the cell into its
    // row (the window is then the kept one: all w entries move, the first l are read). So the step
    // needs no node of its own for them.
    // - cells: i64 [n_stream], contiguous, each stream's new cell as upstream's K row index (stream *
    //   kv_size + cell, kv_size K^T's row length, the cache's cells per stream)
    // - v_comp: f32 [dv, n_head_kv, n_stream] as v_sum, its Kahan compensation
    // - k_sq: f32 [d, n_head_kv, n_stream], the sums of k^2 per component. A ranking selector's comp_w
    //   (src[9]) that is this same tensor holds those sums: the weights are their square roots, taken
    //   after the append.
    struct ggml_tensor * cells;
    struct ggml_tensor * v_comp;
    struct ggml_tensor * k_sq;
    // src[15]: optional, a bias added to the scores (T5's relative position bias, upstream's kq_b):
    // f32 [n_kv, n_rows, n_head, 1 or n_stream], rows of contiguous floats. As build_attn_mha adds it
    // before soft_max_ext's scale, a score is softcap(scale q.k) + scale b + slope m, in step 2's
    // approximate scores (the coverage, the calibrated k and alpha included) and step 4's exact ones.
    // It must be finite at the valid cells (the mask alone says which cells are valid).
    struct ggml_tensor * kq_b;
};

// An attention node's parameters with their defaults: the sparq selector, no flags, no optional part.
GGML_API struct ggml_sparq_attn_params ggml_sparq_attn_params_default(int32_t r, int32_t k, int32_t l, float scale);

// Why the sources and parameters do not make an attention node (a shape, a type, a value out of range,
// a part its selector does not take), or NULL when they do. The fields of ggml_sparq_attn_params:
// - r in [1, d]; k in [1, GGML_SPARQ_K_MAX]; l in [0, k]; scale finite and > 0.
// - selector: enum ggml_sparq_selector; flags: enum ggml_sparq_flag.
// - n_probe (index): lists probed per query, [1, n_list]; 0 for the other selectors. index_reads: index only.
// - topk_buckets (sparq, oracle): step 3 ranks by the approximate bucketed top-k (Key et al., arXiv
//   2412.04358, one cell per bucket): the cells outside the window split into topk_buckets buckets by
//   cell index modulo topk_buckets, each bucket offers its best cell by the ranking key (ties to the
//   lower cell), and the k - l best of those are chosen (fewer where fewer buckets hold a candidate).
//   [k, GGML_SPARQ_K_MAX], or 0 for the exact top-k; not with a coverage target applied.
// - cov_p (sparq, oracle), in (0, 1] or 0 for none: the op ranks the max(k, k_scan) best cells by
//   step 2's approximate scores and finds the fewest of them which, with the local window, hold a
//   share cov_p of the estimated attention mass (the approximate softmax; with GQA the mean over the
//   group's heads; with the per-head flag each head's own). cov_apply: that set is the selection, at
//   least k_min and at most k cells (the k best where the target needs more) (Twilight's top-p over estimated weights); otherwise the
//   selection stays the k best and the count is only measured (for the report). k_min in [0, k],
//   k_scan in [0, GGML_SPARQ_K_MAX].
// - k_frac (with cov_apply), in (0, 1] or 0 for none: each query row's cap is its own,
//   min(k, max(k_min, ceil(k_frac * n))) for the n valid cells of its stream (a row whose target needs
//   more attends over the cap's best cells, the rest to the mean of V; a row with at most that many
//   cells runs dense), so that a row's
//   choice does not depend on the other streams of the call; k still sizes the scratch.
// - r is at most GGML_SPARQ_R_MAX; k_min is never set without cov_apply, nor k_scan with it (one slot
//   holds them).
// - softcap, max_bias: 0 (none) or finite and > 0 (ggml_sparq_attn_params; any selector: steps 1-3
//   of sparq and oracle, step 4 of all).
GGML_API const char * ggml_sparq_attn_check(const struct ggml_sparq_attn_srcs * srcs, const struct ggml_sparq_attn_params * p);

// The attention node of these sources and parameters, the one way every caller builds it (aborts with
// ggml_sparq_attn_check's reason). The result: f32 [dv, n_head, n_rows, n_stream].
GGML_API struct ggml_tensor * ggml_sparq_attn_ext(struct ggml_context * ctx, const struct ggml_sparq_attn_srcs * srcs,
                                                  const struct ggml_sparq_attn_params * p);

// An attention node as a backend reads it: its parameters, shapes, its selector's row and each
// source by its role. The one reading of a node's sources, shared by the CPU and CUDA glue;
// sources a node does not use are NULL.
struct ggml_sparq_attn_view {
    struct ggml_sparq_attn_params p;
    const struct ggml_sparq_selector_info * selector; // the row of p.selector
    int d, dv, n_kv, n_rows, n_head, n_head_kv, n_stream;
    const struct ggml_tensor * q, * k, * kt, * v, * v_sum, * v_count, * mask, * win;
    const struct ggml_tensor * q_sel, * comp_w;      // a selector that ranks scores: the basis
    struct ggml_tensor * sel[2];                     // any other: its inputs (which it may write)
    struct ggml_tensor * report;                     // the report (written by the op)
    const struct ggml_tensor * sinks;                // attention sinks
    const struct ggml_tensor * kq_b;                 // a bias added to the scores
    // the step's append (ggml_sparq_attn_srcs::cells): NULL without; kt, v_sum, v_count, win and
    // k_sq are then written by the op; comp_sq: comp_w holds k_sq's sums (the weights their roots)
    const struct ggml_tensor * cells;
    struct ggml_tensor * v_comp, * k_sq;
    bool comp_sq;
    struct ggml_tensor * out;
};

// The view of attention node dst; false (and *v untouched) for a node of another mode or layout, or
// of a selector this build does not know.
GGML_API bool ggml_sparq_attn_view_of(struct ggml_tensor * dst, struct ggml_sparq_attn_view * v);

// The 8-bit K^T's writes, as a mode of GGML_OP_SPARQ_ATTN (no new ggml op): row idx[i] of dst
// (i8, rows of ne0 bytes, dst->nb[0] == 1) = e5m2 of row i of src (f32 or f16 [ne0, n], contiguous);
// without idx, row i of dst. The result is a view of dst (as ggml_set_rows's), to order later readers.
// idx: i64 [n]. The CPU and CUDA backends compute it.
GGML_API struct ggml_tensor * ggml_sparq_kt_append(struct ggml_context * ctx, struct ggml_tensor * dst,
                                                   struct ggml_tensor * src, struct ggml_tensor * idx);

static inline bool ggml_sparq_is_kt_append(const struct ggml_tensor * t) {
    return ggml_sparq_mode_of(t) == GGML_SPARQ_MODE_KT_APPEND;
}

// A ubatch's per-cell values written at its cells, as a mode of GGML_OP_SPARQ_ATTN: value j of
// token i (src [E, n_tokens], f32 or f16, contiguous) goes to dst element (cell c, j, stream s),
// where idx[i] = s * kv_size + c is upstream's own index of the token's K row (i64 [n_tokens], the
// graph's k_idxs), so the appends need no index input of their own. dst: contiguous
// [kv_size, E1, E2, n_stream] with E1 * E2 = E (K^T: [kv_size, d, n_head_kv, n_stream]); f32, f16
// (rounded as ggml_set_rows rounds), i8 (e5m2, through f16 as ggml_sparq_kt_append) or q4_1 (a 4-bit
// K^T: each value through f16 into its block, ggml_sparq_kt4_put; kv_size a multiple of 32). The
// result is a view of dst. The CPU and CUDA backends compute it.
GGML_API struct ggml_tensor * ggml_sparq_cell_scatter(struct ggml_context * ctx, struct ggml_tensor * dst,
                                                      struct ggml_tensor * src, struct ggml_tensor * idx);

// Optional, on a cell scatter: the local windows kept where the cells are (win: i32 [w, n_stream],
// contiguous, n_stream = dst->ne[3]; row s the cells of stream s's w most recent positions, most
// recent first, -1 after them). Token by token, in order, the node also pushes the token's cell
// into its stream's row: entries 0..w-2 move to 1..w-1 (the last one drops out) and entry 0
// becomes the cell. A decode step's window so follows on the device with no upload, exact while
// every new cell is its sequence's latest position (the host checks that). The CPU and CUDA
// backends compute it.
GGML_API void ggml_sparq_cell_scatter_set_window(struct ggml_tensor * cell_scatter, struct ggml_tensor * win);

static inline bool ggml_sparq_is_cell_scatter(const struct ggml_tensor * t) {
    return ggml_sparq_mode_of(t) == GGML_SPARQ_MODE_CELL_SCATTER;
}

// A per-stream sum's append of a decode step (one new token per stream), as a mode of
// GGML_OP_SPARQ_ATTN: one node where the graph took four to six small ones (casts, a square, an
// add, the compensation's subtractions), each a kernel launch on a GPU and a thread barrier on the
// CPU. Per stream s and element j: x = x_new[j, s] rounded to type (f16: to f16 and back; f32: as
// it is), squared with squares; then sum[j, s] += x, compensated when comp is given (Kahan:
// y = x - comp, t = sum + y, comp = (t - sum) - y, sum = t); every product and sum rounded on its
// own (no fused multiply-add). sum, comp: f32 [n, n_stream] (views with their own row stride);
// x_new: f32 [n, n_stream], contiguous; type: f16 or f32. The result is a view of sum; comp is
// written in place. The CPU and CUDA backends compute it.
GGML_API struct ggml_tensor * ggml_sparq_sum_append(struct ggml_context * ctx, struct ggml_tensor * sum,
                                                    struct ggml_tensor * comp, struct ggml_tensor * x_new,
                                                    enum ggml_type type, bool squares);

// Optional, on a sum's append: count (f32 [n_stream], contiguous) += 1 per stream as well, the
// stream's valid cells kept beside its sums (the op's v_count), so that no count is uploaded per step.
GGML_API void ggml_sparq_sum_append_set_count(struct ggml_tensor * sum_append, struct ggml_tensor * count);

static inline bool ggml_sparq_is_sum_append(const struct ggml_tensor * t) {
    return ggml_sparq_mode_of(t) == GGML_SPARQ_MODE_SUM_APPEND;
}

#ifdef __cplusplus
}
#endif
