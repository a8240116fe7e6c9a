// llama-sparq: the counters: llama_sparq_get_stats / llama_sparq_reset_stats, the index calls'
// counted reads, and the counters' log line when the context goes.
#include "llama-sparq-impl.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>

// The index calls of the last execution: their estimated key reads replaced by the op's count
// (per KV head and stream of the call, the stream's last row; a row that ran dense reports -1 and
// keeps the estimate). Holds S.stats.mtx. Called when the next execution's counters are taken and by
// llama_sparq_get_stats; on another thread than the decoding one it may read the count of a step
// still running, which is a count of the same layer one step later.
void sparq_count_index_reads(llama_sparq_ctx & S) {
    for (const auto & p : S.stats.ivf_pending) {
        const ggml_tensor * c = p.ikv >= 0 && p.ikv < (int32_t) S.layers.size() ? S.layers[p.ikv].sel.ivf_cent : nullptr;
        if (!c) {
            continue;
        }
        double sum = 0.0;
        int64_t n = 0;
        bool ok = true;
        for (uint32_t st = p.s0; st < p.s0 + p.n_stream && ok; ++st) {
            for (int64_t h = 0; h < c->ne[2] && ok; ++h) {
                float v = -1.0f;
                sparq_tensor_get(c, &v, st * c->nb[3] + h * c->nb[2] + (size_t) S.index.n_list * c->nb[1], sizeof(v));
                ok = v >= 0.0f;
                sum += v;
                n++;
            }
        }
        if (!ok || n == 0) {
            continue;
        }
        // the estimate's S d p / C key elements become the counted rows' (mean over KV heads and streams)
        const double ms = p.ms + ((sum / (double) n) * p.c.d - p.n_cells * p.c.rk) * p.c.bk;
        S.stats.counters.compression_sum += (ms - p.ms) / p.md;
        S.stats.counters.n_index_measured++;
    }
    S.stats.ivf_pending.clear();
}

// the mean cost-model compression of the SparQ calls
double sparq_compression(const llama_sparq_ctx & S) {
    const double n = (double) S.stats.counters.n_sparq;
    return n > 0 ? S.stats.counters.compression_sum / n : 0.0;
}

int32_t llama_sparq_get_stats(const struct llama_context * ctx, struct llama_sparq_stats * out) {
    if (!out || out->size != sizeof(llama_sparq_stats)) {
        return -1;
    }
    const size_t size = out->size;
    memset(out, 0, sizeof(*out));
    out->size = size;
    const auto & cp = upstream::cparams(const_cast<llama_context *>(ctx));
    if (cp.sparq) {
        llama_sparq_ctx & S = *cp.sparq;
        std::lock_guard<std::mutex> lock(S.stats.mtx);
        sparq_count_index_reads(S);
        sparq_count_reports(S);
        out->n_sparq = S.stats.counters.n_sparq;
        memcpy(out->n_dense, S.stats.counters.n_dense, sizeof(out->n_dense));
        out->compression = sparq_compression(S);
        out->n_rebuilds = S.stats.counters.n_rebuilds;
        out->extra_bytes = S.mem.extra_bytes;
        out->kv_bytes = S.mem.kv_bytes;
        out->n_layers = S.n_layers;
        out->n_sparq_device = S.stats.counters.n_sparq_device;
        out->coverage_min = -1.0;
        out->coverage_min_layer = -1;
        out->k_reach = -1.0;
        double k = 0.0, cov = 0.0;
        for (const sparq_layer & L : S.layers) {
            if (L.report.n_calls == 0) {
                continue;
            }
            out->n_measured += L.report.n_calls;
            k += L.report.k_sum;
            cov += L.report.cov_sum;
            const double c = L.report.cov_sum / L.report.n_calls;
            if (out->coverage_min < 0.0 || c < out->coverage_min) {
                out->coverage_min = c;
                out->coverage_min_layer = L.il;
                out->k_reach = L.report.n_reach_calls ? L.report.reach_sum / L.report.n_reach_calls : -1.0;
            }
        }
        out->mean_k = out->n_measured ? k / out->n_measured : 0.0;
        out->coverage = out->n_measured ? cov / out->n_measured : 0.0;
    }
    return 0;
}

void llama_sparq_reset_stats(struct llama_context * ctx) {
    auto & cp = upstream::cparams(ctx);
    if (cp.sparq) {
        llama_sparq_ctx & S = *cp.sparq;
        std::lock_guard<std::mutex> lock(S.stats.mtx);
        S.stats.counters.n_sparq = 0;
        S.stats.counters.n_sparq_device = 0;
        memset(S.stats.counters.n_dense, 0, sizeof(S.stats.counters.n_dense));
        S.stats.counters.compression_sum = 0.0;
        S.stats.counters.n_rebuilds = 0;
        S.stats.ivf_pending.clear();
        S.stats.counters.n_index_measured = 0;
        S.stats.report_pending.clear();
        for (sparq_layer & L : S.layers) {
            L.report.n_calls = L.report.n_reach_calls = L.report.n_reached_calls = 0;
            L.report.k_sum = L.report.cov_sum = L.report.reach_sum = L.report.compression_sum = 0.0;
            std::fill(L.report.entries.begin(), L.report.entries.end(), SPARQ_REPORT_TAKEN);
        }
    }
}

// the counters once more when the context goes (the tools' logs show whether SparQ ran)
llama_sparq_ctx::~llama_sparq_ctx() {
    sparq_count_reports(*this); // the last execution's reports (and the guard, when still due)
    uint64_t nd = 0;
    char buf[256] = "";
    size_t o = 0;
    for (int i = 0; i < LLAMA_SPARQ_DENSE_COUNT; ++i) {
        nd += stats.counters.n_dense[i];
        if (stats.counters.n_dense[i] && o < sizeof(buf)) {
            o += snprintf(buf + o, sizeof(buf) - o, "%s%s %llu", o ? ", " : "", sparq_reason_names[i],
                          (unsigned long long) stats.counters.n_dense[i]);
        }
    }
    LLAMA_LOG_INFO("llama_sparq: counters: SparQ calls = %llu, dense calls = %llu%s%s%s, compression = %.4f, rebuilds = %llu, "
                   "SparQ calls on a device (GPU, RPC host) = %llu\n",
                   (unsigned long long) stats.counters.n_sparq, (unsigned long long) nd, o ? " (" : "", buf, o ? ")" : "",
                   sparq_compression(*this), (unsigned long long) stats.counters.n_rebuilds,
                   (unsigned long long) stats.counters.n_sparq_device);
    uint64_t n_meas = 0;
    double k_sum = 0.0, cov_sum = 0.0;
    for (const sparq_layer & L : layers) {
        n_meas += L.report.n_calls;
        k_sum += L.report.k_sum;
        cov_sum += L.report.cov_sum;
    }
    if (n_meas) {
        LLAMA_LOG_INFO("llama_sparq: the op reported %llu calls: %.1f cells attended per KV head and step, %.3f of the "
                       "estimated attention mass (mean)\n", (unsigned long long) n_meas, k_sum / n_meas, cov_sum / n_meas);
    }
    if (stats.counters.n_index_trainings) {
        LLAMA_LOG_INFO("llama_sparq: the vector index (selector index, %d lists) was trained %llu times; the keys its "
                       "calls read were counted for %llu calls (the others: estimated from even lists)\n", index.n_list,
                       (unsigned long long) stats.counters.n_index_trainings, (unsigned long long) stats.counters.n_index_measured);
    }
}
