// llama-sparq: what the rows of a ubatch run (llama-sparq-rows.h): SparQ or dense per row and why,
// the append floor, the always-dense contexts, and the cells of a sequence's most recent positions.
#include "llama-sparq-rows.h"

#include "llama-sparq-selector.h"
#include "llama-sparq-state.h"
#include "llama-sparq-upstream.h"

#include "llama-kv-cache-iswa.h"
#include "llama-memory-hybrid.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

uint32_t sparq_used_max(const llama_kv_cache_context * m) {
    const auto & si = upstream::sinfo(m);
    uint32_t n = 0;
    for (uint32_t s = 0; s < si.n_stream(); ++s) {
        n = std::max(n, upstream::cells(upstream::cache(m), si.strm[s]).get_used());
    }
    return n;
}

// Under the dense threshold a graph needs SparQ's data only to keep it current for later, which costs
// its appends at every ubatch (on a GPU a few small launches per layer, 5-10 % of a dense decode step).
// Well under it a graph builds none of SparQ's nodes: its streams are then marked stale (the graph input
// has no appends: keep_streams_current) and rebuilt once, from K, V and the cells, by the first graph
// that appends again. The floor is one ubatch below min_kv: a stream gains at most n_ubatch cells per
// ubatch, so the first graph at or over the floor still holds fewer than min_kv cells and runs dense
// (short, or a prompt): the rebuild comes before the first SparQ step, never at it, and the appends
// run for at most one ubatch's worth of cells (min_kv <= n_ubatch: always). Selectors whose state
// follows every step (every_step, a prompt's attention included) are never skipped; they run SparQ
// under the threshold too.
uint32_t sparq_append_floor(const llama_sparq_ctx & S, uint32_t n_ubatch) {
    const llama_sparq_params & P = S.params;
    if (sparq_selector_of(P.selector).every_step || P.min_kv <= 0 || (uint32_t) P.min_kv <= n_ubatch) {
        return 0;
    }
    return (uint32_t) P.min_kv - n_ubatch;
}

bool sparq_shared_stream(const llama_cparams & cp) {
    return cp.kv_unified && cp.n_seq_max > 1;
}

// A context whose every step runs dense whatever its length: several sequences in one unified stream
// (its kv_unified and n_seq_max are fixed for the context's life), or a dense threshold over the cells
// a stream holds (until the settings change: a new graph then appends again and rebuilds first, as
// over the floor). Its graphs build none of SparQ's nodes, as under the floor; selectors that follow
// every step run SparQ under the threshold and keep their appends.
int sparq_dense_always(const llama_sparq_ctx & S, const llama_cparams & cp) {
    if (sparq_shared_stream(cp)) {
        return LLAMA_SPARQ_DENSE_SHARED_STREAM;
    }
    const llama_sparq_params & P = S.params;
    if (!sparq_selector_of(P.selector).every_step && P.min_kv > 0 && (uint32_t) P.min_kv > upstream::kv_size(S.kv)) {
        return LLAMA_SPARQ_DENSE_SHORT;
    }
    return -1;
}

bool sparq_appends_skipped(const llama_sparq_ctx & S, const llama_kv_cache_context * m, const llama_cparams & cp) {
    if (sparq_dense_always(S, cp) >= 0) {
        return true;
    }
    const uint32_t floor = sparq_append_floor(S, cp.n_ubatch);
    return floor > 0 && sparq_used_max(m) < floor;
}

int sparq_rows_mode(const llama_sparq_ctx & S, const llama_ubatch & ub, uint32_t n_stream,
                    std::vector<uint8_t> * prompt) {
    if (prompt) {
        prompt->assign(n_stream, 0);
    }
    // several rows per stream are prompt rows and dense anyway (or all SparQ in all-rows mode)
    if (S.params.all_rows || !S.balloc || n_stream == 0 || ub.n_tokens != n_stream || !ub.seq_id) {
        return SPARQ_ROWS_SPARQ;
    }
    uint32_t n = 0;
    for (uint32_t s = 0; s < n_stream; ++s) {
        const llama_seq_id seq = ub.seq_id[s][0];
        const bool p = seq >= 0 && seq < LLAMA_MAX_SEQ && S.balloc->seq_pos_max(seq) > S.balloc->seq_pos_min(seq);
        n += p;
        if (prompt) {
            (*prompt)[s] = p;
        }
    }
    return n == 0 ? SPARQ_ROWS_SPARQ : n == n_stream ? SPARQ_ROWS_DENSE : SPARQ_ROWS_MIXED;
}

int sparq_stretch_rows(const llama_sparq_ctx & S, const llama_kv_cache::slot_info & si, const std::vector<uint8_t> & prompt,
                       std::vector<uint8_t> & rows) {
    const llama_sparq_params & P = S.params;
    rows.assign(si.n_stream(), SPARQ_ROW_SPARQ);
    uint32_t n_dec = 0, n_in = 0;
    for (uint32_t s = 0; s < si.n_stream(); ++s) {
        if (s < prompt.size() && prompt[s]) {
            continue; // a prompt row: dense anyway
        }
        const uint32_t strm = si.strm[s];
        if (upstream::cells(S.kv, strm).get_used() < (uint32_t) P.min_kv) {
            rows[s] = SPARQ_ROW_SHORT; // under the dense threshold, as alone
        }
        n_dec++;
        n_in += rows[s] != SPARQ_ROW_SPARQ;
    }
    return n_in == 0 ? SPARQ_STRETCH_NONE : n_in == n_dec ? SPARQ_STRETCH_ALL : SPARQ_STRETCH_SOME;
}

const llama_kv_cache_context * sparq_base_mctx(const llama_memory_context_i * m) {
    if (auto * kc = dynamic_cast<const llama_kv_cache_context *>(m)) {
        return kc;
    }
    if (auto * iswa = dynamic_cast<const llama_kv_cache_iswa_context *>(m)) {
        return iswa->get_base();
    }
    if (auto * hyb = dynamic_cast<const llama_memory_hybrid_context *>(m)) {
        return hyb->get_attn();
    }
    return nullptr;
}

void sparq_recent_cells(const llama_kv_cells & cells, llama_seq_id seq, llama_pos pos, int32_t * dst, int64_t n) {
    std::fill(dst, dst + n, -1);
    const auto & sp = cells.seq_pos_get(seq);
    auto it = sp.upper_bound({ pos, UINT32_MAX });
    for (int64_t j = 0; j < n && it != sp.begin(); ++j) {
        --it;
        dst[j] = (int32_t) it->second;
    }
}

bool sparq_rows_latest(const llama_sparq_ctx & S, const llama_ubatch & ub, const llama_kv_cache::slot_info & si) {
    if (ub.n_tokens != si.n_stream() || !ub.seq_id || !ub.pos) {
        return false;
    }
    for (uint32_t s = 0; s < si.n_stream(); ++s) {
        const auto & sp = upstream::cells(S.kv, si.strm[s]).seq_pos_get(ub.seq_id[s][0]);
        if (si.idxs[s].empty() || sp.empty() || *sp.rbegin() != std::make_pair(ub.pos[s], si.idxs[s][0])) {
            return false;
        }
    }
    return true;
}
