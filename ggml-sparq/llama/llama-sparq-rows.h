// llama-sparq: what the rows of a ubatch run, decided from the batch, the cells and the settings:
// SparQ, upstream's dense attention or both (prompt rows, streams under the dense threshold), the
// graphs that build none of SparQ's nodes (the append floor, the always-dense contexts), and the
// cells of a sequence's most recent positions (the local window). The graph hook and the graph's
// input both ask these; neither asks the other.
#pragma once

#include "llama-sparq-state.h"

#include "llama-batch.h"
#include "llama-cparams.h"
#include "llama-kv-cache.h"
#include "llama-kv-cells.h"
#include "llama-memory.h"

#include <cstdint>
#include <vector>

// How the query rows of a ubatch split between SparQ and upstream's dense attention, decided
// per ubatch at graph build (graph reuse keeps the decision: can_reuse compares it). A sequence
// that brings several tokens to the current llama_decode is prompt processing even where the
// equal split gives it one row per stream (llama-server batches one slot's prompt beside other
// slots' decode steps): alone those rows run upstream's dense attention (build_attn_mha), so they
// run exactly that here too. No stream brings a prompt: SparQ only. Every stream does: the dense
// path (counted as `prefill`). Some do: both, and each token's row is copied from the one that
// applies (a bit-exact pick); the dense attention of the decode rows is then wasted work, once
// per llama_decode that mixes a prompt with decode steps.
enum sparq_rows_mode { SPARQ_ROWS_SPARQ = 0, SPARQ_ROWS_DENSE = 1, SPARQ_ROWS_MIXED = 2 };

// Decode rows that run dense as their sequence would alone (a stretch of them): a stream under the
// dense threshold (min_kv) beside longer ones. A ubatch's decode rows of a layer may be: none so
// (SparQ), all (the layer runs dense, counted as `short`), or some (both run and each row is picked,
// like prompt rows beside decode rows). A sequence's steps so do not depend on the sequences decoded
// beside it.
enum sparq_stretch_mode { SPARQ_STRETCH_NONE = 0, SPARQ_STRETCH_ALL = 1, SPARQ_STRETCH_SOME = 2 };
enum sparq_row_kind { SPARQ_ROW_SPARQ = 0, SPARQ_ROW_SHORT = 1 };
struct sparq_stretch {
    int mode = SPARQ_STRETCH_NONE;
    std::vector<uint8_t> rows; // per stream of the ubatch: its decode row's sparq_row_kind
};

// the mode of a ubatch over n_stream streams; prompt (optional): per stream, whether its sequence is a prompt
int sparq_rows_mode(const llama_sparq_ctx & S, const llama_ubatch & ub, uint32_t n_stream,
                    std::vector<uint8_t> * prompt = nullptr);
// the stretch mode for the streams of si (prompt: per stream, from sparq_rows_mode), and its rows
int sparq_stretch_rows(const llama_sparq_ctx & S, const llama_kv_cache::slot_info & si, const std::vector<uint8_t> & prompt,
                       std::vector<uint8_t> & rows);
// the most cells in use among the streams of the ubatch (the context length the dense threshold is about:
// the graph's KV view is padded to 256 cells, which would make a 1000-token context count as 1024)
uint32_t sparq_used_max(const llama_kv_cache_context * m);
// The cells under which a graph builds none of SparQ's nodes (no appends, no op: dense's graph), for a
// context whose ubatches hold at most n_ubatch tokens; 0: every graph appends. skipped: whether a graph
// over the ubatch of m does (its longest stream, this ubatch's cells included, under the floor; or a
// context of sparq_dense_always)
uint32_t sparq_append_floor(const llama_sparq_ctx & S, uint32_t n_ubatch);
bool sparq_appends_skipped(const llama_sparq_ctx & S, const llama_kv_cache_context * m, const llama_cparams & cp);
// several sequences share one unified KV stream (SparQ's sums are per stream: dense, shared_stream)
bool sparq_shared_stream(const llama_cparams & cp);
// the reason every step of the context runs dense, whatever its length (shared_stream; short: min_kv over
// a stream's cells), or -1
int sparq_dense_always(const llama_sparq_ctx & S, const llama_cparams & cp);
// the full-attention cache's context of a memory context (plain, iSWA or hybrid), or NULL
const llama_kv_cache_context * sparq_base_mctx(const llama_memory_context_i * m);
// whether each row of a decode ubatch (one token per stream) has its sequence's latest position in its
// stream at its new cell, which the device windows' push then puts in front (the op reads them only then)
bool sparq_rows_latest(const llama_sparq_ctx & S, const llama_ubatch & ub, const llama_kv_cache::slot_info & si);
// the cells of sequence seq's n most recent positions at or before pos in a stream, most recent first,
// -1 after them (the op's local window)
void sparq_recent_cells(const llama_kv_cells & cells, llama_seq_id seq, llama_pos pos, int32_t * dst, int64_t n);
