// llama-sparq: what the op reports of its choice (cells attended, their estimated share of the
// attention mass, the cells that reach the coverage target; the CPU op writes it, a GPU's op copies
// it into the layer's page-locked entries during the step) folded into the counters per layer,
// the guard's one-line warning when a fixed k falls short of the target, and
// llama_sparq_get_layer_stats.
#include "llama-sparq-coverage.h"

#include "llama-sparq-state.h"
#include "llama-sparq-upstream.h"

#include "llama-impl.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <cstring>
#include <string>
#include <vector>

void sparq_coverage_reset(llama_sparq_ctx & S) {
    S.stats.report_pending.clear();
    for (sparq_layer & L : S.layers) {
        std::fill(L.report.entries.begin(), L.report.entries.end(), SPARQ_REPORT_TAKEN);
    }
    S.stats.measure_due = true;
    S.stats.guard_due = false;
}

// the layers whose mean coverage is below the target, worst first: one line
static void sparq_guard(llama_sparq_ctx & S) {
    const llama_sparq_params & P = S.params;
    struct low { int il; double cov, reach; bool reached; };
    std::vector<low> lows;
    int n_measured = 0;
    for (const sparq_layer & L : S.layers) {
        if (L.report.n_calls == 0) {
            continue;
        }
        n_measured++;
        const double cov = L.report.cov_sum / L.report.n_calls;
        if (cov < P.coverage - 0.005) {
            const sparq_layer_report & R = L.report;
            lows.push_back({ L.il, cov, R.n_reach_calls ? R.reach_sum / R.n_reach_calls : -1.0,
                             R.n_reached_calls == R.n_reach_calls });
        }
    }
    if (n_measured == 0) {
        S.stats.guard_due = true; // nothing reported yet (every call ran dense): look again after the next step
        return;
    }
    if (lows.empty()) {
        return;
    }
    std::sort(lows.begin(), lows.end(), [](const low & a, const low & b) { return a.cov < b.cov; });
    std::string shown;
    for (size_t i = 0; i < lows.size() && i < 3; ++i) {
        char buf[160];
        snprintf(buf, sizeof(buf), "%slayer %d: %.2f, %s%.0f cells reach it", i ? "; " : "", lows[i].il,
                 lows[i].cov, lows[i].reached ? "" : "over ", lows[i].reach);
        shown += buf;
    }
    LLAMA_LOG_WARN("llama_sparq: k = %d holds less than the coverage target %.2f of the estimated attention mass on %zu "
                   "of %d layers (%s): answers may differ from dense; sparq_k = 0 (calibrated) picks the cells per step "
                   "(llama_sparq_get_layer_stats has every layer)\n",
                   P.k, (double) P.coverage, lows.size(), n_measured, shown.c_str());
}

void sparq_count_reports(llama_sparq_ctx & S) {
    for (const auto & p : S.stats.report_pending) {
        if (p.ikv < 0 || p.ikv >= (int32_t) S.layers.size()) {
            continue;
        }
        sparq_layer & L = S.layers[p.ikv];
        const int64_t hkv = L.data.kt ? L.data.kt->ne[2] : 0;
        double k_sum = 0.0, cov_sum = 0.0, reach_sum = 0.0;
        int n = 0, n_reach = 0, n_reached = 0;
        for (uint32_t st = p.s0; st < p.s0 + p.n_stream; ++st) {
            const bool unused = st - p.s0 < p.unused.size() && p.unused.test(st - p.s0);
            for (int64_t h = 0; h < hkv; ++h) {
                float * e = L.report.entries.data() + ((size_t) st * hkv + h) * 4;
                if (unused || e[0] == SPARQ_REPORT_TAKEN || e[0] < 0.0f) {
                    // not reported (no report, or a device's copy not landed: read after the step's
                    // synchronisation it has), the row ran dense, or its output was not used
                    e[0] = SPARQ_REPORT_TAKEN;
                    continue;
                }
                k_sum += e[0];
                cov_sum += e[1];
                if (e[2] >= 0.0f) {
                    reach_sum += e[2];
                    n_reach++;
                    n_reached += e[3] > 0.0f;
                }
                n++;
                e[0] = SPARQ_REPORT_TAKEN;
            }
        }
        if (n == 0) {
            continue;
        }
        const double k_mean = k_sum / n;
        // the estimate counted at set_input (its k) becomes the cells the op attended
        const double ms = p.c.sparq(p.n_cells, k_mean);
        S.stats.counters.compression_sum += (ms - p.ms) / p.md;
        L.report.n_calls++;
        L.report.k_sum += k_mean;
        L.report.cov_sum += cov_sum / n;
        L.report.compression_sum += ms / p.md;
        if (n_reach) {
            L.report.n_reach_calls++;
            L.report.reach_sum += reach_sum / n_reach;
            L.report.n_reached_calls += n_reached == n_reach;
        }
    }
    const bool measured = !S.stats.report_pending.empty();
    S.stats.report_pending.clear();
    if (S.stats.guard_due && measured) {
        S.stats.guard_due = false;
        sparq_guard(S);
    }
}

int32_t llama_sparq_get_layer_stats(const struct llama_context * ctx, int32_t i, struct llama_sparq_layer_stats * out) {
    if (!out || out->size != sizeof(llama_sparq_layer_stats)) {
        return -1;
    }
    const size_t size = out->size;
    memset(out, 0, sizeof(*out));
    out->size = size;
    const auto & cp = upstream::cparams(const_cast<llama_context *>(ctx));
    if (!cp.sparq) {
        return -1;
    }
    llama_sparq_ctx & S = *cp.sparq;
    std::lock_guard<std::mutex> lock(S.stats.mtx);
    sparq_count_reports(S);
    int32_t seen = 0;
    for (const sparq_layer & L : S.layers) {
        if (!L.data.kt) {
            continue;
        }
        if (seen++ != i) {
            continue;
        }
        out->layer = L.il;
        out->n_measured = L.report.n_calls;
        out->mean_k = L.report.n_calls ? L.report.k_sum / L.report.n_calls : 0.0;
        out->coverage = L.report.n_calls ? L.report.cov_sum / L.report.n_calls : 0.0;
        out->k_reach = L.report.n_reach_calls ? L.report.reach_sum / L.report.n_reach_calls : -1.0;
        out->reached = L.report.n_reach_calls ? (double) L.report.n_reached_calls / L.report.n_reach_calls : 0.0;
        out->compression = L.report.n_calls ? L.report.compression_sum / L.report.n_calls : 0.0;
        return 0;
    }
    return -1;
}
