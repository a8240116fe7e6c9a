// llama-sparq: the arguments each selector runs with, and the layout of the scratch: units,
// waves, chunks and every phase's buffers (shared and per thread).

#include "sparq-cpu-phases.h"

namespace sparq_cpu {

// the paper's baselines: no approximate scores, no mean of V, one choice per KV head
void baseline_args(sparq_args & b) {
    b.r = 1;
    b.no_mean_v = 1;
    b.per_head = 0;
    b.q_sel = nullptr;
    b.comp_w = nullptr;
}

// the arguments a selector actually runs with (its args hook: exact scores with every component,
// say, or none at all)
sparq_args effective_args(const sparq_args * a) {
    sparq_args b = *a;
    if (const auto args = selector_of(b.selector).args) {
        args(b);
    }
    return b;
}

layout make_layout(const sparq_args * a, int nth) {
    const selector & sel = selector_of(a->selector);
    layout L{};
    L.n_rows_all = a->n_stream * a->n_rows;
    L.n_units    = L.n_rows_all * a->n_head_kv;
    L.group_size = a->n_head / a->n_head_kv;
    L.n_chunks   = nth;
    L.ph         = a->per_head && L.group_size > 1 ? L.group_size : 1;
    L.wcap = sel.window_choice ? a->k : a->l;
    L.sel_max = L.ph * a->k;
    // block of cells whose g rows of scores stay in L1/L2 while the r rows of K^T stream through
    L.block_cells = std::max(256, std::min(SPARQ_BLOCK_MAX, (4096 / L.group_size) & ~31));
    const size_t S = (size_t) a->n_kv;
    if (L.group_size == 1) {
        L.wave_units = L.n_units;
    } else {
        const size_t per_unit = (size_t) L.group_size * S * sizeof(float);
        L.wave_units = (int) std::max<size_t>(1, std::min<size_t>(L.n_units, SPARQ_LOGIT_CAP / std::max<size_t>(per_unit, 1)));
    }
    L.chunk_max = (int) ((S + nth - 1) / nth) + 1;
    L.chunk_cap = sparq_cap(a, L.chunk_max);
    size_t o = 0;
    L.off_mask   = o; o += align_up((a->mask && a->mask_type == SPARQ_F16) ? (size_t) L.n_rows_all * S * sizeof(float) : 0);
    L.off_cnt    = o; o += align_up((size_t) L.n_rows_all * L.n_chunks * sizeof(int32_t));
    L.off_row    = o; o += align_up((size_t) L.n_rows_all * sizeof(row_info));
    L.off_win    = o; o += align_up((size_t) L.n_rows_all * (L.wcap + 1) * sizeof(int32_t));
    L.off_i1     = o; o += align_up((size_t) L.n_units * a->r * sizeof(int32_t));
    L.off_qs     = o; o += align_up((size_t) L.n_units * L.group_size * a->r * sizeof(float));
    L.off_stat   = o; o += align_up((size_t) L.wave_units * L.n_chunks * L.group_size * 2 * sizeof(float));
    L.off_ccount = o; o += align_up((size_t) L.wave_units * L.n_chunks * L.ph * sizeof(int32_t));
    L.off_cand   = o; o += align_up((size_t) L.wave_units * L.n_chunks * L.ph * L.chunk_cap * sizeof(cand));
    L.off_cbound = o; o += align_up((size_t) L.wave_units * L.n_chunks * L.ph * sizeof(float));
    L.off_uplan  = o; o += align_up((size_t) L.wave_units * sizeof(unit_plan));
    L.off_usel   = o; o += align_up((size_t) L.wave_units * (L.sel_max + 1) * sizeof(int32_t));
    L.off_ualpha = o; o += align_up((size_t) L.wave_units * L.group_size * sizeof(float));
    L.off_uvbar  = o; o += align_up((size_t) L.wave_units * a->dv * sizeof(float));
    L.n_waves    = (L.n_units + L.wave_units - 1) / L.wave_units;
    L.off_sync   = o; o += align_up((size_t) (2 * L.n_units + L.n_waves) * sizeof(std::atomic<int32_t>));
    // decode rows only (a row per stream: never a function of the batch, so that a sequence's
    // results do not depend on the sequences beside it); a selector that sums weights per head over
    // the whole selection: never split
    L.parts_max  = a->n_rows == 1 && !sel.even_attend ? SPARQ_PARTS_MAX : 1;
    L.off_part   = o; o += align_up(L.parts_max > 1 ? (size_t) L.wave_units * L.parts_max * L.group_size * (a->dv + 2) * sizeof(float) : 0);
    L.off_logit  = o; o += align_up(L.group_size > 1 && sel.ranks_scores ? (size_t) L.wave_units * L.group_size * S * sizeof(float) : 0);
    L.keep_exps  = L.group_size > 1 && sel.ranks_scores && L.ph == 1;
    L.blocks_per_chunk = (L.chunk_max + L.block_cells - 1) / L.block_cells;
    L.off_blkm   = o; o += align_up(L.keep_exps ? (size_t) L.wave_units * L.group_size * L.n_chunks * L.blocks_per_chunk * sizeof(float) : 0);
    // per thread: g x B approximate scores of a block, the chunk's keys, filter indices,
    // group maxima, the tie fallback buffer, the merge buffer, the selection, exact
    // logits and their weights, and y / vbar / a K row (phase_components: |q| and an order)
    const int dmax = std::max(a->d, a->dv);
    size_t t = 0;
    L.t_blk   = t; t += align_up((size_t) L.group_size * L.block_cells * sizeof(float));
    // the chunk's keys (a selector searching per query head without a shared choice: one row per head)
    L.t_ck    = t; t += align_up((size_t) L.chunk_max * (sel.ranks_scores ? 1 : L.ph) * sizeof(float));
    L.t_idx   = t; t += align_up((size_t) (L.chunk_max + 16) * sizeof(int32_t)); // filter_gt stores whole vectors
    L.t_gm    = t; t += align_up((size_t) (L.chunk_max + 2) * sizeof(float));
    L.t_big   = t; t += align_up((size_t) L.chunk_max * sizeof(cand));
    L.t_merge = t; t += align_up(((size_t) L.n_chunks * L.chunk_cap + k_rank(a) + 1) * sizeof(cand));
    L.t_sel   = t; t += align_up(((size_t) L.sel_max + 1) * sizeof(int32_t));
    L.t_ex    = t; t += align_up(((size_t) L.sel_max + 1) * sizeof(float));
    L.t_p     = t; t += align_up(((size_t) L.sel_max + 1) * sizeof(float));
    L.t_vec   = t; t += align_up((size_t) 3 * dmax * sizeof(float));
    L.t_gh    = t; t += align_up((size_t) 2 * L.group_size * sizeof(float));
    L.t_rows  = t; t += align_up((size_t) a->r * sizeof(void *));
    // the window's cells as bits (merge_candidates)
    L.t_wbits = t; t += align_up(a->win ? (S + 63) / 64 * sizeof(uint64_t) : 0);
    // the bucketed top-k: a chunk's keys, and each bucket's best cell in it (select_chunk)
    L.t_bk    = t; t += align_up(a->topk_buckets > 0 ? (size_t) L.chunk_max * sizeof(float) : 0);
    L.t_bb    = t; t += align_up(a->topk_buckets > 0 ? (size_t) std::min(a->topk_buckets, L.chunk_max) * sizeof(int32_t) : 0);
    L.att_block = std::max(16, std::min(SPARQ_ATT_BLOCK, SPARQ_ATT_FLOATS / L.group_size) & ~15);
    L.t_aex   = t; t += align_up((size_t) L.group_size * L.att_block * sizeof(float));
    L.t_ap    = t; t += align_up((size_t) L.group_size * L.att_block * sizeof(float));
    L.t_aidx  = t; t += align_up((size_t) L.att_block * sizeof(int32_t));
    L.t_ast   = t; t += align_up((size_t) L.group_size * (a->dv + 2) * sizeof(float));
    L.t_aq    = t; t += align_up((size_t) L.group_size * sizeof(const float *));
    if (sel.scratch) {
        sel.scratch(a, L, nth, &o, &t);
    }
    L.thread_bytes = t;
    L.off_thread = o; o += L.thread_bytes * nth;
    L.total = o + SPARQ_ALIGN; // room to align the base pointer
    return L;
}

} // namespace sparq_cpu
