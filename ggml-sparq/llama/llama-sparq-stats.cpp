// llama-sparq: the counters: llama_sparq_get_stats / llama_sparq_reset_stats, the calls' counted
// reads, and the counters' log line when the context goes.
#include "llama-sparq-stats.h"

#include "llama-sparq-coverage.h"
#include "llama-sparq-messages.h"
#include "llama-sparq-selector.h"
#include "llama-sparq-state.h"
#include "llama-sparq-upstream.h"

#include "llama-impl.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>

// The calls of the last execution whose op reported the rows of K their selector read to choose
// (sparq_selector::rows_read): the cost model's estimate of those reads replaced by the count (a call
// that reported nothing keeps the estimate). Holds S.stats.mtx.
static void sparq_count_reads(llama_sparq_ctx & S) {
    for (const auto & p : S.stats.reads_pending) {
        const auto rows_read = sparq_selector_of(p.selector).rows_read;
        const double rows = rows_read ? rows_read(S, p) : -1.0;
        if (rows < 0.0) {
            continue;
        }
        // the estimate's c.rk key elements per cell become the counted rows' (mean over KV heads and streams)
        const double ms = p.ms + (rows * p.c.d - p.n_cells * p.c.rk) * p.c.bk;
        S.stats.counters.compression_sum += (ms - p.ms) / p.md;
        S.stats.counters.n_reads_counted++;
    }
    S.stats.reads_pending.clear();
}

void sparq_count_last_execution(llama_sparq_ctx & S) {
    sparq_count_reads(S);
    sparq_count_reports(S);
}

// the mean cost-model compression of the SparQ calls
static double sparq_compression(const llama_sparq_ctx & S) {
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
        sparq_count_last_execution(S);
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
        S.stats.reads_pending.clear();
        S.stats.counters.n_reads_counted = 0;
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
    for (int32_t id = 0; id < LLAMA_SPARQ_SELECTOR_COUNT; ++id) {
        if (const auto log_stats = sparq_selector_of(id).log_stats) {
            log_stats(*this);
        }
    }
}
