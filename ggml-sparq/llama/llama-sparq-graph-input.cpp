// llama-sparq: the graph's SparQ input: whether a built graph can be reused, and per ubatch its
// input tensors, the upkeep it triggers (calibration, rebuilds, the selector's state) and the counters.
#include "llama-sparq-graph-input.h"

#include "llama-sparq-basis.h"
#include "llama-sparq-graph.h"
#include "llama-sparq-messages.h"
#include "llama-sparq-rebuild.h"
#include "llama-sparq-rows.h"
#include "llama-sparq-selector.h"
#include "llama-sparq-state.h"
#include "llama-sparq-stats.h"
#include "llama-sparq-transfers.h"
#include "llama-sparq-upkeep.h"
#include "llama-sparq-upstream.h"

#include "ggml-backend.h"
#include "llama-impl.h"

#include <algorithm>
#include <bitset>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

bool llm_graph_input_sparq::can_reuse(const llm_graph_params & params) {
    const llama_kv_cache_context * m = sparq_base_mctx(params.mctx);
    if (!m || upstream::cache(m) != S->kv) {
        return false;
    }
    mctx = m;
    bool ok = true;
    if (win) {
        ok &= win->ne[1] * win->ne[2] == (int64_t) params.ubatch.n_tokens;
    }
    if (!win_layers.empty()) {
        // the ops read the device windows only where every row's new cell is its sequence's latest
        ok &= win_device == sparq_rows_latest(*S, params.ubatch, upstream::sinfo(m));
    }
    // prompt rows beside decode rows: the graph holds SparQ, dense attention or both
    ok &= rows_mode == sparq_rows_mode(*S, params.ubatch, upstream::sinfo(m).n_stream());
    if (measure >= 0) {
        // the guard's measuring step is built once: the next graph runs without it
        ok &= measure == (int) S->stats.measure_due;
    }
    if (ok && !stretch.empty()) {
        // a stream crossed the dense threshold beside others
        sparq_rows_mode(*S, params.ubatch, upstream::sinfo(m).n_stream(), &prompt_buf);
        const int mode = sparq_stretch_rows(*S, upstream::sinfo(m), prompt_buf, rows_buf);
        for (const auto & [ikv, st] : stretch) {
            ok &= mode == st.mode && rows_buf == st.rows;
        }
    }
    // built with SparQ's nodes or without (well under the dense threshold, or a context that runs dense
    // at every step): rebuild when that changes
    ok &= skip == sparq_appends_skipped(*S, m, params.cparams);
    if (short_ctx >= 0) {
        // the graph holds SparQ or dense attention by the dense threshold: rebuild when the context crosses it
        ok &= short_ctx == (int) (sparq_used_max(m) < (uint32_t) S->params.min_kv);
    }
    return ok;
}

bool llm_graph_input_sparq::runs_sparq() const {
    return std::any_of(decisions.begin(), decisions.end(), [](const sparq_decision & dc) { return dc.reason < 0; });
}

// the PCA basis is calibrated on the cache's keys at the first step that runs SparQ; K^T is then
// rebuilt in it (this graph rotates its own appends with the tensors written here)
void llm_graph_input_sparq::calibrate_if_due() {
    llama_sparq_ctx & St = *S;
    const auto & si = upstream::sinfo(mctx);
    if (St.params.basis == LLAMA_SPARQ_BASIS_PCA && !St.basis.calibrated && St.basis.ctx && runs_sparq()) {
        std::vector<std::vector<uint32_t>> fresh(upstream::n_stream(St.kv));
        for (uint32_t s = 0; s < si.n_stream(); ++s) {
            fresh[si.strm[s]].assign(si.idxs[s].begin(), si.idxs[s].end());
        }
        sparq_calibrate(St, true, fresh);
        for (auto & st : St.streams) {
            st.valid = false;
        }
    }
}

// upkeep: the data of a stream is current when the stream's cells are those it was
// brought up to date for plus the cells this ubatch writes, which were empty (the
// version hash then changed by exactly those cells' terms); else it is rebuilt. O(ubatch).
void llm_graph_input_sparq::keep_streams_current() {
    llama_sparq_ctx & St = *S;
    const auto & si = upstream::sinfo(mctx);
    for (uint32_t s = 0; s < si.n_stream(); ++s) {
        const uint32_t strm = si.strm[s];
        const llama_kv_cells & cells = upstream::cells(St.kv, strm);
        sparq_stream_state & st = St.streams[strm];
        if (!appends) {
            // the ubatch's cells written without K^T's, the sums' or the windows' appends (a graph under
            // sparq_append_floor): rebuilt, the device windows written, by the next graph that appends
            st.valid = false;
            st.win_valid = false;
            continue;
        }
        uint64_t want = st.hash;
        for (uint32_t i = 0; i < si.size(); ++i) {
            want ^= upstream::cell_ver_hash(cells, si.idxs[s][i]);
        }
        if (!st.valid || upstream::cells_hash(cells) != want) {
            sparq_rebuild_stream(St, strm, si.idxs[s]);
            sparq_count_rebuild(St);
        }
        st.hash = upstream::cells_hash(cells);
        st.valid = true;
    }
}

// the selector's state brought up to date for each stream's cells before a step that runs SparQ
void llm_graph_input_sparq::selector_before_step() {
    llama_sparq_ctx & St = *S;
    const auto & si = upstream::sinfo(mctx);
    const auto before_step = sparq_selector_of(St.params.selector).before_step;
    if (before_step && appends && runs_sparq()) {
        for (uint32_t s = 0; s < si.n_stream(); ++s) {
            const uint32_t strm = si.strm[s];
            const llama_kv_cells & cells = upstream::cells(St.kv, strm);
            const uint32_t n_used = cells.get_used() > si.size() ? cells.get_used() - si.size() : 0;
            before_step(St, strm, si.idxs[s], n_used, false);
        }
    }
}

// prompt rows beside decode rows (one row per stream), and a layer's streams under the dense
// threshold beside streams that run SparQ: each token's row of [SparQ; dense]
void llm_graph_input_sparq::set_pick(const llama_ubatch * ubatch, const std::vector<uint8_t> & prompt) {
    const auto & si = upstream::sinfo(mctx);
    if (!pick && layer_pick.empty()) {
        return;
    }
    auto fill = [&](ggml_tensor * t, const sparq_stretch * st) {
        GGML_ASSERT(ggml_backend_buffer_is_host(t->buffer) && (int64_t) ubatch->n_tokens == t->ne[0]);
        int32_t * data = (int32_t *) t->data;
        for (uint32_t s = 0; s < si.n_stream(); ++s) {
            const bool dense = prompt[s] || (st && s < st->rows.size() && st->rows[s] == SPARQ_ROW_SHORT);
            data[s] = dense ? (int32_t) (ubatch->n_tokens + s) : (int32_t) s;
        }
    };
    if (pick) {
        fill(pick, nullptr);
    }
    for (auto & [ikv, t] : layer_pick) {
        fill(t, &stretch.at(ikv));
    }
}

// the local window: per query row, the cells of its sequence's l most recent positions
void llm_graph_input_sparq::set_window(const llama_ubatch * ubatch) {
    const auto & si = upstream::sinfo(mctx);
    if (win) {
        GGML_ASSERT(ggml_backend_buffer_is_host(win->buffer));
        int32_t * data = (int32_t *) win->data;
        const int64_t nw = win->ne[0], n_tps = win->ne[1];
        for (uint32_t s = 0; s < si.n_stream(); ++s) {
            const llama_kv_cells & cells = upstream::cells(S->kv, si.strm[s]);
            for (int64_t i = 0; i < n_tps; ++i) {
                const int64_t tok = (int64_t) s * n_tps + i;
                int32_t * dst = data + tok * nw;
                const llama_seq_id seq = ubatch->seq_id[tok][0];
                sparq_recent_cells(cells, seq, ubatch->pos[tok], dst, std::min<int64_t>(win_recent, nw));
                std::fill(dst + std::min<int64_t>(win_recent, nw), dst + nw, -1);
                // a whole choice (window_choice): then the cells of the earliest positions (the attention sinks)
                const auto & sp = cells.seq_pos_get(seq);
                const auto end = sp.upper_bound({ ubatch->pos[tok], UINT32_MAX });
                auto first = sp.begin();
                for (int64_t j = win_recent; j < nw && first != end; ++j, ++first) {
                    dst[j] = (int32_t) first->second;
                }
            }
        }
    }
}

// The device windows of a decode step (one token per stream), whose K^T appends push each stream's new
// cell into them. Per stream, O(1): the push alone is exact when the windows were exact for the stream's
// cells before this step and the cells changed since by the step's new cell only, a newer position of the
// same sequence (the cells' version hash, as keep_streams_current). Where it is not (the first decode
// after a prompt, a cache operation, another sequence in the stream), and some op reads the windows, each
// pushing layer's rows of the ubatch's streams are written once, as they were before the push, so that
// after it they hold what set_window computes. Steady decode steps write nothing.
void llm_graph_input_sparq::set_device_windows(const llama_ubatch * ubatch) {
    if (win_layers.empty()) {
        return;
    }
    llama_sparq_ctx & St = *S;
    const auto & si = upstream::sinfo(mctx);
    const uint32_t ns = si.n_stream();
    GGML_ASSERT(ubatch->n_tokens == ns && "llama_sparq: the device windows' push needs one token per stream");
    win_exact.assign(ns, 0);
    bool upload = false;
    for (uint32_t s = 0; s < ns; ++s) {
        const llama_kv_cells & cells = upstream::cells(St.kv, si.strm[s]);
        const sparq_stream_state & st = St.streams[si.strm[s]];
        const uint32_t cell = si.idxs[s][0];
        win_exact[s] = st.win_valid && st.win_seq == ubatch->seq_id[s][0] && ubatch->pos[s] > st.win_pos &&
                       upstream::cells_hash(cells) == (st.win_hash ^ upstream::cell_ver_hash(cells, cell));
        upload |= !win_exact[s];
    }
    upload &= win_read;
    if (upload) {
        const int64_t cap = St.mem.win_cap;
        win_buf.resize((size_t) ns * cap);
        for (uint32_t s = 0; s < ns; ++s) {
            // the rows before the push: the window's entries after its first (the new cell)
            int32_t * row = win_buf.data() + (size_t) s * cap;
            sparq_recent_cells(upstream::cells(St.kv, si.strm[s]), ubatch->seq_id[s][0], ubatch->pos[s], row, cap);
            GGML_ASSERT(row[0] == (int32_t) si.idxs[s][0] &&
                        "llama_sparq: a decode row's cell is not its sequence's latest");
            std::copy(row + 1, row + cap, row);
            row[cap - 1] = -1;
        }
        for (const int32_t ikv : win_layers) {
            ggml_tensor * w = St.layers[ikv].data.win;
            sparq_tensor_set(w, win_buf.data(), (size_t) si.s0 * w->nb[1], (size_t) ns * w->nb[1]);
        }
    }
    // what the windows hold after this step: what set_window computes for each row, in every layer that
    // has one when all of them pushed (a layer without appends, if any, would not have)
    const bool all = win_layers.size() == St.mem.win_layers;
    for (uint32_t s = 0; s < ns; ++s) {
        const llama_kv_cells & cells = upstream::cells(St.kv, si.strm[s]);
        sparq_stream_state & st = St.streams[si.strm[s]];
        const auto & sp = cells.seq_pos_get(ubatch->seq_id[s][0]);
        const bool latest = !sp.empty() && *sp.rbegin() == std::make_pair(ubatch->pos[s], si.idxs[s][0]);
        st.win_valid = all && latest && (win_exact[s] || upload);
        st.win_seq = ubatch->seq_id[s][0];
        st.win_pos = ubatch->pos[s];
        st.win_hash = upstream::cells_hash(cells);
    }
}

// the input tensors of this ubatch, the upkeep they need first (the PCA calibration, the streams'
// rebuilds, the selector's state), then the counters of this graph's decisions
void llm_graph_input_sparq::set_input(const llama_ubatch * ubatch) {
    llama_sparq_ctx & St = *S;
    const auto & si = upstream::sinfo(mctx);

    calibrate_if_due();
    keep_streams_current();
    selector_before_step();
    // which streams bring a prompt (their rows run dense, picked; they report nothing)
    const int mode = sparq_rows_mode(St, *ubatch, si.n_stream(), &prompt_buf);
    GGML_ASSERT(mode == rows_mode);
    set_pick(ubatch, prompt_buf);
    set_window(ubatch);
    set_device_windows(ubatch);

    // counters: this graph's decisions, once per execution
    const double n_cells = std::max<double>(1.0, sparq_used_max(mctx));
    std::lock_guard<std::mutex> lock(St.stats.mtx);
    sparq_count_last_execution(St); // the previous execution has run
    const sparq_selector & sel = sparq_selector_of(St.params.selector);
    bool measuring = false;
    for (const sparq_decision & dc : decisions) {
        if (dc.reason < 0) { // SparQ ran (for every row, or for the decode rows beside prompt rows)
            St.stats.counters.n_sparq++;
            St.stats.counters.n_sparq_device += dc.device == 1;
            if (dc.device == 2 && !St.stats.logged_host_fallback) {
                St.stats.logged_host_fallback = true;
                LLAMA_LOG_WARN("%s: SparQ runs on the CPU for layer %d: K^T is on %s, which does not support this "
                               "SPARQ_ATTN node (its log says why); the scheduler copies the cache across every step\n",
                               __func__, dc.il, dc.device_name.c_str());
            }
            const double md = dc.cost.dense(n_cells);
            const double ms = n_cells <= dc.k ? md : dc.cost.sparq(n_cells, dc.rows);
            St.stats.counters.compression_sum += ms / md;
            if (dc.report && n_cells > dc.k) {
                // the rows whose output is not the op's (prompt rows, short rows) report nothing
                std::bitset<LLAMA_MAX_SEQ> unused;
                const auto it = stretch.find(dc.ikv);
                for (size_t s = 0; s < prompt_buf.size() && s < unused.size(); ++s) {
                    unused[s] = prompt_buf[s] || (it != stretch.end() && s < it->second.rows.size() && it->second.rows[s]);
                }
                St.stats.report_pending.push_back({ { dc.ikv, dc.il, si.s0, si.n_stream(), n_cells, md, ms, dc.cost }, unused });
                measuring |= measure == 1;
            }
            if (sel.rows_read && n_cells > dc.k) {
                // the op reports what it read: counted once this execution has run (the vector's
                // capacity stays across steps: no allocation once warm)
                St.stats.reads_pending.push_back({ { dc.ikv, dc.il, si.s0, si.n_stream(), n_cells, md, ms, dc.cost },
                                                   St.params.selector });
            }
        } else {
            St.stats.counters.n_dense[dc.reason]++;
            if (!(St.stats.logged & (1u << dc.reason))) {
                St.stats.logged |= 1u << dc.reason;
                LLAMA_LOG_INFO("%s: SparQ on, dense attention where: %s (first seen on layer %d; counted in the stats)\n",
                               __func__, sparq_reason_text[dc.reason], dc.il);
            }
        }
    }
    if (measuring) {
        // this execution measures a fixed k's coverage: its reports are checked once it has run
        St.stats.measure_due = false;
        St.stats.guard_due = true;
    }
}


void llama_sparq_graph_computed(llm_graph_result * res, ggml_backend_sched * sched) {
    if (!res || !sched) {
        return;
    }
    for (const auto & in : res->inputs) {
        const auto * inp = dynamic_cast<const llm_graph_input_sparq *>(in.get());
        if (!inp) {
            continue;
        }
        for (const auto & w : inp->reports) {
            const sparq_layer & L = inp->S->layers[w.ikv];
            if (!L.report.entries.device()) {
                continue; // host memory: the op wrote it there
            }
            const ggml_tensor * t = L.data.report;
            ggml_backend_dev_t dev = ggml_backend_buft_get_device(ggml_backend_buffer_get_type(t->buffer));
            for (int i = 0; i < ggml_backend_sched_get_n_backends(sched); ++i) {
                ggml_backend_t be = ggml_backend_sched_get_backend(sched, i);
                if (ggml_backend_get_device(be) == dev) {
                    const size_t off = (size_t) w.s0 * t->nb[2];
                    ggml_backend_tensor_get_async(be, t, (char *) L.report.entries.host + off, off,
                                                  (size_t) w.n_stream * t->nb[2]);
                    break;
                }
            }
        }
        return; // (one SparQ input per graph)
    }
}
