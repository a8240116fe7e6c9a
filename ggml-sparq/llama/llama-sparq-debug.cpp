// llama-sparq: the debugging entry points of the C API: an eval callback on the context's graphs,
// the check of the kept K^T and sums against a recomputation, the last graph's host traffic, the op
// parameters the settings' probe builds, and the device's graph rebuild run on host memory.
#include "llama-sparq-op.h"
#include "llama-sparq-rebuild.h"
#include "llama-sparq-rows.h"
#include "llama-sparq-state.h"
#include "llama-sparq-transfers.h"
#include "llama-sparq-upkeep.h"
#include "llama-sparq-upstream.h"

#include "llama-context.h"
#include "llama-graph.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <unordered_set>

std::atomic<uint64_t> sparq_n_transfers{0};

static bool sparq_is_view_op(ggml_op op) {
    return op == GGML_OP_NONE || op == GGML_OP_VIEW || op == GGML_OP_RESHAPE || op == GGML_OP_PERMUTE ||
           op == GGML_OP_TRANSPOSE;
}

// what ggml_backend_sched copies to a device per computation when every node runs there: each
// distinct source of a non-view node that is a graph input or a view of one
int32_t llama_sparq_debug_graph_io(struct llama_context * ctx, struct llama_sparq_graph_io * out) {
    if (!out || out->size != sizeof(llama_sparq_graph_io)) {
        return -1;
    }
    const size_t size = out->size;
    memset(out, 0, sizeof(*out));
    out->size = size;
    out->n_transfers = sparq_n_transfers.load();
    llm_graph_result * res = ctx ? upstream::last_graph(ctx) : nullptr;
    ggml_cgraph * gf = res ? res->get_gf() : nullptr;
    if (!gf) {
        return -2;
    }
    std::unordered_set<const ggml_tensor *> seen;
    for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
        const ggml_tensor * n = ggml_graph_node(gf, i);
        if (sparq_is_view_op(n->op)) {
            continue;
        }
        out->n_nodes++;
        out->n_nodes_sparq += n->op == GGML_OP_SPARQ_ATTN;
        for (int j = 0; j < GGML_MAX_SRC; ++j) {
            const ggml_tensor * s = n->src[j];
            const ggml_tensor * base = s && s->view_src ? s->view_src : s;
            if (!s || !(base->flags & GGML_TENSOR_FLAG_INPUT) || !seen.insert(s).second) {
                continue;
            }
            const bool sparq = strncmp(base->name, "sparq", 5) == 0;
            out->n_inputs++;
            out->n_inputs_sparq += sparq;
            out->input_bytes += ggml_nbytes(s);
            out->input_bytes_sparq += sparq ? ggml_nbytes(s) : 0;
        }
    }
    return 0;
}

void llama_sparq_debug_set_eval_callback(struct llama_context * ctx, ggml_backend_sched_eval_callback cb,
                                         void * user_data) {
    llama_cparams & cp = upstream::cparams(ctx);
    cp.cb_eval = cb;
    cp.cb_eval_user_data = user_data;
    // upstream hands cparams' callback to the scheduler only when it builds a graph: a step that
    // reuses the previous graph would run with the callback set before (possibly freed by now)
    ggml_backend_sched_set_eval_callback(ctx->get_sched(), cb, user_data);
}

// the stream's device windows against what the host computes, where the host holds them exact for the
// stream's cells as they are (else the next decode step uploads them): the entries that differ, over layers
static double sparq_check_windows(llama_sparq_ctx & S, uint32_t strm) {
    const sparq_stream_state & st = S.streams[strm];
    const llama_kv_cells & cells = upstream::cells(S.kv, strm);
    if (!st.win_valid || st.win_hash != upstream::cells_hash(cells) || S.mem.win_cap <= 0) {
        return 0.0;
    }
    std::vector<int32_t> want(S.mem.win_cap), have(S.mem.win_cap);
    sparq_recent_cells(cells, st.win_seq, st.win_pos, want.data(), S.mem.win_cap);
    double n = 0.0;
    for (const sparq_layer & L : S.layers) {
        if (L.data.win) {
            sparq_tensor_get(L.data.win, have.data(), strm * L.data.win->nb[1], have.size() * sizeof(int32_t));
            for (size_t j = 0; j < want.size(); ++j) {
                n += have[j] != want[j];
            }
        }
    }
    return n;
}

int32_t llama_sparq_debug_graph_rebuild(struct llama_context * ctx, bool on) {
    auto & cp = upstream::cparams(ctx);
    if (!cp.sparq) {
        return -1;
    }
    cp.sparq->graph_rebuild_host = on;
    return 0;
}

double llama_sparq_debug_check(struct llama_context * ctx) {
    auto & cp = upstream::cparams(ctx);
    if (!cp.sparq || cp.sparq->n_layers == 0) {
        return -1.0;
    }
    sparq_llama_sync(ctx);
    llama_sparq_ctx & S = *cp.sparq;
    double d = 0.0;
    for (uint32_t strm = 0; strm < upstream::n_stream(S.kv); ++strm) {
        // a stream that is not current is rebuilt before its next use: nothing to compare
        if (sparq_stream_current(S, strm)) {
            d = std::max(d, sparq_rebuild_stream(S, strm, {}, true));
        }
        d = std::max(d, sparq_check_windows(S, strm));
    }
    return d;
}

int32_t llama_sparq_debug_op_params(struct llama_context * ctx, int32_t il, int32_t n_kv, bool measure,
                                    int32_t * op_params) {
    const auto & cp = upstream::cparams(ctx);
    if (!cp.sparq || !cp.sparq->params.enabled || !op_params) {
        return -1;
    }
    const llama_sparq_ctx & S = *cp.sparq;
    for (const sparq_layer & L : S.layers) {
        if (L.il != il || !L.data.kt) {
            continue;
        }
        ggml_init_params ip = { 32 * ggml_tensor_overhead(), nullptr, true };
        ggml_context * c = ggml_init(ip);
        const char * why = nullptr;
        const ggml_tensor * op = sparq_op_probe(c, S, L, S.params, n_kv, measure, &why);
        if (op) {
            memcpy(op_params, op->op_params, sizeof(op->op_params));
        }
        ggml_free(c);
        return op ? 0 : -2;
    }
    return -1;
}
