// llama-sparq: additions to the GGML_OP_SPARQ_ATTN op beyond its ggml.h constructor.
#pragma once

#include "ggml.h"
#include "ggml-sparq-e5m2.h"
#include "ggml-sparq-params.h"

#ifdef __cplusplus
extern "C" {
#endif

// Give a sparq_attn node the local window explicitly: win is i32 [w, n_rows, n_stream]
// with, per query row, the cells of the l most recent positions (w >= l entries used,
// -1 for none). Without it the window is the last l valid cells by cell index, which is
// the same thing only while cells are in position order.
GGML_API void ggml_sparq_attn_set_window(struct ggml_tensor * attn, struct ggml_tensor * win);

// The largest k the op accepts (scratch is sized by k).
#define GGML_SPARQ_K_MAX (1 << 20)

// Selectors: how the op chooses the cells it attends over (steps 1-3 of docs/algorithm.md); the
// exact attention over them and the mean-value mix are shared.
enum ggml_sparq_selector {
    GGML_SPARQ_SEL_SPARQ  = 0, // approximate scores from the r largest query components (default)
    GGML_SPARQ_SEL_ORACLE = 1, // exact scores, the oracle top-k (reads all of K: a baseline)
    // The paper's baselines (Appendix G). Neither reads K^T or mixes in the mean of V.
    // LM-Infinite / StreamingLLM: the l most recent cells and the k - l earliest ones (attention
    // sinks). With a window list (ggml_sparq_attn_set_window) of k entries per row, entries
    // 0..l-1 name the l most recent positions' cells and entries l..k-1 the earliest positions';
    // without one they are the last l and the first k - l valid cells by index.
    GGML_SPARQ_SEL_STREAMING = 2,
    // H2O (heavy hitters): the l most recent cells and the k - l cells with the largest
    // accumulated attention (ggml_sparq_attn_set_h2o), ties to the lower index. The op adds each
    // row's attention weights over the cells it attended to (summed over the query heads of the
    // group) into those scores after every row chose: a cell left out keeps its score, which is
    // H2O's eviction with a fixed budget of k cells.
    GGML_SPARQ_SEL_H2O = 3,
    // Top-k attention over an inverted-file (IVF) index of the keys (the vector-index selector of
    // "Running huge context windows on tiny GPUs"): ggml_sparq_attn_set_index gives n_list
    // centroids per KV head and each cell's list. The group's summed query ranks the lists by
    // q . centroid; the cells of the n_probe best lists, outside the l most recent, are ranked by
    // their exact logit summed over the group, the best k - l kept (ties to the lower index). A
    // valid cell whose list is -1 is first assigned to its nearest centroid (L2, ties to the lower
    // list) and the op writes that id. No K^T, no mean of V.
    GGML_SPARQ_SEL_INDEX = 4,
    GGML_SPARQ_SEL_COUNT,
};

GGML_API void ggml_sparq_attn_set_selector(struct ggml_tensor * attn, int32_t selector, int32_t flags);

// The H2O selector's accumulated attention per cell: f32 [n_kv, n_head_kv, n_stream], read to
// choose and written by the op (a side effect on this tensor: it must live in memory the op's
// device writes, and no other node of the graph may read it after the op). Call after
// ggml_sparq_attn_set_selector(attn, GGML_SPARQ_SEL_H2O, ...); it takes the slot of set_basis's
// q_sel, which H2O does not use.
GGML_API void ggml_sparq_attn_set_h2o(struct ggml_tensor * attn, struct ggml_tensor * scores);

// The index selector's centroids (f32 [d, n_list, n_head_kv, n_stream]) and list ids (f32
// [n_kv, n_head_kv, n_stream], -1 for a cell not yet assigned: written by the op, as H2O's
// scores are), and how many lists a query probes (1..n_list). Call after
// ggml_sparq_attn_set_selector(attn, GGML_SPARQ_SEL_INDEX, ...); the two take the slots of
// set_basis's q_sel and comp_w.
GGML_API void ggml_sparq_attn_set_index(struct ggml_tensor * attn, struct ggml_tensor * centroids,
                                        struct ggml_tensor * lists, int32_t n_probe);

// Optional, after ggml_sparq_attn_set_index: the op also reports what it read. Per (KV head,
// stream) it writes the number of key rows it scored for the stream's last query row (the valid
// cells, before the window when the window is the tail of the cells, of the lists that row's
// searches probed), or -1 when that row ran dense, as an f32 into element 0 of row n_list of the
// centroids' (KV head, stream) block: that row must exist beyond the view (centroids->nb[2] >=
// (n_list + 1) * nb[1]) and is written as a side effect, like the lists.
GGML_API void ggml_sparq_attn_set_index_reads(struct ggml_tensor * attn);

// Approximate scores in another basis of the keys: q_sel (f32, q's shape) is the query in
// the basis K^T is stored in (steps 1-2 use it; step 4 uses q and K); comp_w (f32
// [d, n_head_kv, 1 or n_stream], optional) weighs the components in step 1's choice and tau's norms.
// Either may be NULL. The SparQ and oracle selectors only.
GGML_API void ggml_sparq_attn_set_basis(struct ggml_tensor * attn, struct ggml_tensor * q_sel, struct ggml_tensor * comp_w);

// A coverage target for the SparQ and oracle selectors: the op ranks the max(k, k_scan) best
// cells by step 2's approximate scores and finds the fewest of them which, with the local
// window, hold a share p of the estimated attention mass (the approximate softmax; with GQA the
// mean over the group's heads; with GGML_SPARQ_FLAG_PER_HEAD each head's own). apply: that set
// is the selection, at least k_min and at most k cells (Twilight's top-p over estimated weights);
// otherwise the selection stays the k best and the count is only measured (for the report).
// p in (0, 1]; 0 <= k_min <= k.
GGML_API void ggml_sparq_attn_set_coverage(struct ggml_tensor * attn, float p, int32_t k_min, int32_t k_scan, bool apply);

// Optional, after ggml_sparq_attn_set_coverage with apply: each query row's cap is its own,
// min(k, max(k_min, ceil(k_frac * n))) for the n valid cells of its stream (a row whose target
// needs more attends over all of them; a row with at most that many cells runs dense), so that a
// row's choice does not depend on the other streams of the call; k still sizes the scratch.
// k_frac in (0, 1]. The CPU and CUDA ops apply it.
GGML_API void ggml_sparq_attn_set_coverage_cap(struct ggml_tensor * attn, float k_frac);

// Optional, after ggml_sparq_attn_set_selector with the sparq or oracle selector: step 3 ranks the
// cells by the approximate bucketed top-k (Key et al., arXiv 2412.04358, one cell per bucket): the
// cells outside the window split into `buckets` buckets by cell index modulo buckets, each bucket
// offers its best cell by the ranking key (ties to the lower cell), and the k - l best of those are
// chosen (fewer where fewer buckets hold a candidate). buckets in [k, GGML_SPARQ_K_MAX], 0 for the
// exact top-k; not with a coverage target applied (the calibrated k). The CPU and CUDA ops apply it.
GGML_API void ggml_sparq_attn_set_topk_buckets(struct ggml_tensor * attn, int32_t buckets);

// Optional: where the op reports what each stream's last query row did, per (stream, KV head):
// 4 floats {cells attended (-1: the row ran dense), the estimated coverage of those cells (mean
// over the group's heads), the cells reaching the coverage target with the window (-1 without a
// target), 1 if the ranked cells reached it else 0}, at report[(stream * n_head_kv + kv_head) * 4].
// A host pointer kept in the node's parameters (as ggml's custom ops keep theirs): the CPU op
// writes it while it runs; the CUDA op queues a copy into it on its stream (no wait: read it after
// synchronising), which needs page-locked memory (for other memory it reports nothing); there a
// diffuse row's reach is a lower bound at or above its cap. It must outlive every computation of
// the node.
GGML_API void ggml_sparq_attn_set_report(struct ggml_tensor * attn, float * report);
GGML_API float * ggml_sparq_attn_get_report(const struct ggml_tensor * attn);
// The layer's tickets: device memory of GGML_SPARQ_TICKETS unsigned ints (ggml-sparq-params.h) on
// the device of the node's K^T, zero when given, which the CUDA op's one launch per layer
// (LLAMA_SPARQ_CUDA_FUSED) counts its blocks in and leaves zero; the same address at every step, so a
// captured CUDA graph replays it. Without them the CUDA op takes three launches; the CPU ignores them.
// They must outlive every computation of the node, and one node at a time may use them.
GGML_API void ggml_sparq_attn_set_tickets(struct ggml_tensor * attn, void * tickets);

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
// (rounded as ggml_set_rows rounds) or i8 (e5m2, through f16 as ggml_sparq_kt_append). The result
// is a view of dst. The CPU and CUDA backends compute it.
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
