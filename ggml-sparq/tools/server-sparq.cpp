// llama-sparq: SparQ in llama-server (see server-sparq.h).

#include "server-sparq.h"

#include "log.h"

#include <mutex>
#include <sstream>

namespace {

// what the endpoints report: written by the decoding thread, read by the HTTP threads
struct server_sparq_snapshot {
    std::mutex         mutex;
    bool               enabled = false;
    llama_sparq_params params  = llama_sparq_default_params();
    llama_sparq_stats  stats   = {};
};

server_sparq_snapshot & server_sparq_state() {
    static server_sparq_snapshot s;
    return s;
}

} // namespace

bool server_sparq_prepare_params(common_params & params, bool kv_unified_requested) {
    if (!params.sparq.enabled) {
        return true;
    }
    if (kv_unified_requested && params.n_parallel != 1) {
        LOG_ERR("%s: --sparq with --kv-unified and several slots: the slots would share one KV stream, where SparQ "
                "runs dense; drop --kv-unified (with --sparq every slot gets its own KV stream of n_ctx / slots "
                "cells) or use -np 1\n", __func__);
        return false;
    }
    if (params.kv_unified && !kv_unified_requested) {
        // upstream's automatic slot count (-np not given) shares one stream between the slots
        params.kv_unified = false;
        LOG_INF("%s: --sparq: %d slots with one KV stream each (n_ctx / %d cells per slot) instead of a unified "
                "KV cache, so that decode steps run SparQ\n", __func__, params.n_parallel, params.n_parallel);
    }
    return true;
}

void server_sparq_update(llama_context * ctx) {
    llama_sparq_params p = llama_sparq_default_params();
    llama_sparq_stats  st = {};
    st.size = sizeof(st);
    if (ctx) {
        llama_sparq_get_params(ctx, &p);
        llama_sparq_get_stats(ctx, &st);
    }
    server_sparq_snapshot & s = server_sparq_state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.enabled = ctx && p.enabled;
    s.params  = p;
    s.stats   = st;
}

std::string server_sparq_prometheus() {
    server_sparq_snapshot & s = server_sparq_state();
    std::lock_guard<std::mutex> lock(s.mutex);
    std::ostringstream out;
    auto item = [&out](const char * type, const char * name, const char * help, double value) {
        out << "# HELP llamacpp:" << name << " " << help << "\n"
            << "# TYPE llamacpp:" << name << " " << type << "\n"
            << "llamacpp:" << name << " " << value << "\n";
    };
    item("gauge", "sparq_enabled", "SparQ attention on (1) or off (0)", s.enabled ? 1.0 : 0.0);
    item("gauge", "sparq_layers", "KV-cache layers with SparQ data (full-attention layers)", s.stats.n_layers);
    item("counter", "sparq_calls_total", "Attention calls (layer x ubatch) run with SparQ", (double) s.stats.n_sparq);
    out << "# HELP llamacpp:sparq_dense_calls_total Attention calls run dense while SparQ was on, by reason\n"
        << "# TYPE llamacpp:sparq_dense_calls_total counter\n";
    for (int r = 0; r < LLAMA_SPARQ_DENSE_COUNT; ++r) {
        const char * name = llama_sparq_dense_reason_name(r);
        out << "llamacpp:sparq_dense_calls_total{reason=\"" << (name ? name : "unknown") << "\"} "
            << s.stats.n_dense[r] << "\n";
    }
    item("gauge", "sparq_compression", "Mean cost-model compression M_sparq / M_dense of the SparQ calls and the calibrated k's dense stretches",
         s.stats.compression);
    item("counter", "sparq_rebuilds_total", "Rebuilds of K^T and the V sums after KV-cache changes",
         (double) s.stats.n_rebuilds);
    item("gauge", "sparq_extra_bytes", "Memory taken by K^T and the V sums", (double) s.stats.extra_bytes);
    return out.str();
}

static const char * name_or_unknown(const char * name) { return name ? name : "unknown"; }

common_json server_sparq_props() {
    server_sparq_snapshot & s = server_sparq_state();
    std::lock_guard<std::mutex> lock(s.mutex);
    common_json dense = common_json::object();
    for (int r = 0; r < LLAMA_SPARQ_DENSE_COUNT; ++r) {
        const char * name = llama_sparq_dense_reason_name(r);
        dense[name ? name : "unknown"] = s.stats.n_dense[r];
    }
    return common_json {
        { "enabled",     s.enabled },
        { "r",           s.params.r },
        { "k",           s.params.k },
        { "l",           s.params.l },
        { "min_kv",      s.params.min_kv },
        { "all_rows",    s.params.all_rows },
        { "selector",    name_or_unknown(llama_sparq_selector_name(s.params.selector)) },
        { "gqa",         name_or_unknown(llama_sparq_gqa_name(s.params.gqa)) },
        { "basis",       name_or_unknown(llama_sparq_basis_name(s.params.basis)) },
        { "mean_v",      s.params.mean_v },
        { "index_lists", s.params.index_lists },
        { "index_probe", s.params.index_probe },
        { "coverage",    s.params.coverage },
        { "k_min",       s.params.k_min },
        { "k_frac",      s.params.k_frac },
        { "n_layers",    s.stats.n_layers },
        { "extra_bytes", s.stats.extra_bytes },
        { "kv_bytes",    s.stats.kv_bytes },
        { "n_sparq",     s.stats.n_sparq },
        { "n_sparq_device", s.stats.n_sparq_device },
        { "n_dense",     dense },
        { "compression", s.stats.compression },
        { "n_rebuilds",  s.stats.n_rebuilds },
        { "n_measured",  s.stats.n_measured },
        { "mean_k",      s.stats.mean_k },
        { "coverage_measured", s.stats.coverage },
        { "coverage_min", s.stats.coverage_min },
    };
}
