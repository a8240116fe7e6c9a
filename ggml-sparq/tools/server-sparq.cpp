// llama-sparq: SparQ in llama-server (see server-sparq.h).

#include "server-sparq.h"

#include "log.h"
#include "sparq-settings.h"

#include <mutex>
#include <sstream>

namespace {

// what the endpoints report: written by the decoding thread, read by the HTTP threads
struct server_sparq_snapshot {
    std::mutex         mutex;
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
    s.params  = p; // llama_sparq_default_params() (off) without a context
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
    // the settings, one gauge per row of the table (an enum's value by name, in a label)
    for (size_t i = 0; i < sparq_n_settings; ++i) {
        const sparq_setting & st = sparq_settings[i];
        if (!(st.shown & SPARQ_IN_METRICS)) {
            continue;
        }
        const std::string name = std::string("sparq_") + st.name;
        const std::string help = std::string("SparQ setting ") + st.name + ": " + st.help;
        if (st.kind == SPARQ_KIND_ENUM) {
            out << "# HELP llamacpp:" << name << " " << help << " (1 for the value in use)\n"
                << "# TYPE llamacpp:" << name << " gauge\n"
                << "llamacpp:" << name << "{" << st.name << "=\"" << sparq_setting_text(s.params, st) << "\"} 1\n";
        } else {
            item("gauge", name.c_str(), help.c_str(), sparq_setting_get(s.params, st));
        }
    }
    item("gauge", "sparq_layers", "KV-cache layers with SparQ data (full-attention layers)", s.stats.n_layers);
    item("counter", "sparq_calls_total", "Attention calls (layer x ubatch) run with SparQ", (double) s.stats.n_sparq);
    out << "# HELP llamacpp:sparq_dense_calls_total Attention calls run dense while SparQ was on, by reason\n"
        << "# TYPE llamacpp:sparq_dense_calls_total counter\n";
    for (int r = 0; r < LLAMA_SPARQ_DENSE_COUNT; ++r) {
        const char * name = llama_sparq_dense_reason_name(r);
        out << "llamacpp:sparq_dense_calls_total{reason=\"" << (name ? name : "unknown") << "\"} "
            << s.stats.n_dense[r] << "\n";
    }
    item("gauge", "sparq_compression", "Mean cost-model compression M_sparq / M_dense of the SparQ calls",
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
    common_json props = common_json::object();
    // the settings, one field per row of the table
    for (size_t i = 0; i < sparq_n_settings; ++i) {
        const sparq_setting & st = sparq_settings[i];
        if (!(st.shown & SPARQ_IN_PROPS)) {
            continue;
        }
        const double v = sparq_setting_get(s.params, st);
        switch (st.kind) {
            case SPARQ_KIND_BOOL:  props[st.name] = v != 0.0; break;
            case SPARQ_KIND_INT:   props[st.name] = (int32_t) v; break;
            case SPARQ_KIND_FLOAT: props[st.name] = (float) v; break;
            case SPARQ_KIND_ENUM:  props[st.name] = name_or_unknown(st.names((int32_t) v)); break;
        }
    }
    const common_json counters {
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
    for (const auto & [key, value] : counters.items()) {
        props[key] = value;
    }
    return props;
}
