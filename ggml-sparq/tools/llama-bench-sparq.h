// llama-sparq: SparQ parameters in llama-bench (included by tools/llama-bench/llama-bench.cpp,
// patch 0007). Every row of the settings' table is swept like any parameter (--sparq 0,1
// --sparq-r 16,32 --sparq-k 128 ...) and reported in every output format, with the counters
// that prove SparQ ran.
#pragma once

#include "llama-sparq.h"
#include "sparq-settings.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

struct sparq_bench_params {
    // per row of the settings' table, the values given (a comma list; empty: the default)
    std::vector<std::vector<double>> lists = std::vector<std::vector<double>>(sparq_n_settings);
    bool fill_synthetic = false; // --depth-fill synthetic: llama_sparq_bench_fill instead of a prefill
    bool any() const {
        for (const auto & l : lists) {
            if (!l.empty()) {
                return true;
            }
        }
        return false;
    }
};


// the SparQ part of one test: its settings and what the counters said over its timed runs
struct sparq_bench_fields {
    llama_sparq_params p = llama_sparq_default_params();
    uint64_t calls = 0, dense = 0;
    double compression = 0.0;
    double compr_sum = 0.0;      // compression x its SparQ calls, summed over the timed runs
    double compr_n = 0.0;        // those calls
    double mean_k = 0.0;         // cells attended per KV head and step, as the op reported them
    double k_sum = 0.0;          // mean_k x reported calls, summed over the timed runs
    uint64_t measured = 0;
    llama_sparq_stats at = {};   // the counters when the current timed run began
};

// row i of the table is a llama-bench list and column
static inline bool sparq_bench_row(size_t i) {
    return (sparq_settings[i].shown & SPARQ_IN_BENCH) != 0;
}

static inline bool sparq_bench_is_arg(const std::string & a) {
    const int i = sparq_setting_by_flag(a);
    return a == "--depth-fill" || (i >= 0 && sparq_bench_row((size_t) i));
}

static inline void sparq_bench_usage() {
    const llama_sparq_params d = llama_sparq_default_params();
    for (size_t i = 0; i < sparq_n_settings; ++i) {
        if (!sparq_bench_row(i)) {
            continue;
        }
        const sparq_setting & s = sparq_settings[i];
        const char * hint = s.kind == SPARQ_KIND_BOOL ? "<0|1>" : s.kind == SPARQ_KIND_ENUM ? "<name>" :
                            s.kind == SPARQ_KIND_FLOAT ? "<x>" : "<n>";
        std::string text = std::string(i == sparq_enabled_row() ? "" : "SparQ: ") + s.help + " (default: " +
                           sparq_setting_text(d, s) + ")";
        std::string arg = sparq_spelling_of(i).flag + " " + hint;
        // wrapped at 120 columns, as upstream's usage
        while (!text.empty()) {
            size_t cut = text.size() <= 74 ? text.size() : text.rfind(' ', 74);
            cut = cut == std::string::npos || cut == 0 ? std::min<size_t>(74, text.size()) : cut;
            printf("  %-42s %s\n", arg.c_str(), text.substr(0, cut).c_str());
            text = text.substr(std::min(text.size(), cut + 1));
            arg.clear();
        }
    }
    printf("  --depth-fill <prefill|synthetic>           how -d fills the context: a real prompt, or random K/V\n");
    printf("                                             written straight into the cache, for timing only (default: prefill)\n");
}

// parses one comma list; false with a message on a value that does not parse (a name that is not one of
// the C API's names, a number that is not an integer, an on/off value other than 0 or 1). The ranges of
// the numbers are checked once, by llama_sparq_set_params, whose message sparq_bench_apply prints.
static inline bool sparq_bench_parse(const std::string & arg, const char * value, sparq_bench_params & p) {
    if (arg == "--depth-fill") {
        const std::string v(value);
        if (v != "prefill" && v != "synthetic") {
            fprintf(stderr, "error: --depth-fill: '%s' is not allowed (prefill or synthetic)\n", value);
            return false;
        }
        p.fill_synthetic = v == "synthetic";
        return true;
    }
    const int row = sparq_setting_by_flag(arg);
    const std::string s(value);
    size_t pos = 0;
    while (pos <= s.size()) {
        const size_t end = s.find(',', pos);
        const std::string tok = s.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
        double v = 0.0;
        std::string allowed;
        if (!sparq_setting_parse(sparq_settings[row], tok, v, allowed)) {
            fprintf(stderr, "error: %s: '%s' is not allowed (%s)\n", arg.c_str(), tok.c_str(), allowed.c_str());
            return false;
        }
        p.lists[row].push_back(v);
        if (end == std::string::npos) {
            break;
        }
        pos = end + 1;
    }
    return true;
}

// one instance per combination of the SparQ lists (the instance type has a .sparq member); with
// SparQ off the other settings do not matter: one instance. The last row varies fastest.
template <typename Inst>
static void sparq_bench_expand(std::vector<Inst> & insts, const sparq_bench_params & p) {
    if (!p.any()) {
        return;
    }
    const size_t on_row = sparq_enabled_row();
    const std::vector<double> on = p.lists[on_row].empty() ? std::vector<double>{ 1.0 } : p.lists[on_row];
    std::vector<Inst> out;
    for (const Inst & base : insts) {
        for (double o : on) {
            if (o == 0.0) {
                Inst inst = base;
                inst.sparq.enabled = false;
                out.push_back(inst);
                continue;
            }
            std::vector<size_t> at(sparq_n_settings, 0); // the odometer over the rows' lists
            for (;;) {
                Inst inst = base;
                inst.sparq.enabled = true;
                for (size_t i = 0; i < sparq_n_settings; ++i) {
                    if (i != on_row && !p.lists[i].empty()) {
                        sparq_setting_set(inst.sparq, sparq_settings[i], p.lists[i][at[i]]);
                    }
                }
                out.push_back(inst);
                size_t i = sparq_n_settings;
                while (i-- > 0 && (i == on_row || p.lists[i].empty() || ++at[i] == p.lists[i].size())) {
                    at[i] = 0;
                }
                if (i == (size_t) -1) {
                    break;
                }
            }
        }
    }
    insts = out;
}

// applies the settings to a new context; false (with a message) when refused
static inline bool sparq_bench_apply(llama_context * ctx, const llama_sparq_params & p, sparq_bench_fields & f) {
    f.p = p;
    if (!p.enabled) {
        return true;
    }
    char err[512];
    if (llama_sparq_set_params(ctx, &p, err, sizeof(err)) != 0) {
        fprintf(stderr, "llama-bench: error: %s\n", err);
        return false;
    }
    llama_sparq_get_params(ctx, &f.p);
    return true;
}

// around each timed run, so the counters cover the timed decode/prompt steps only (not the
// warm-up, the -d prefill or fill): begin brings K^T up to date after a state restore
// (untimed) and takes the counters; end adds what changed since
static inline void sparq_bench_begin(llama_context * ctx, sparq_bench_fields & f) {
    llama_sparq_sync(ctx);
    f.at = {};
    f.at.size = sizeof(f.at);
    if (llama_sparq_get_stats(ctx, &f.at) != 0) {
        f.at = {};
    }
}

static inline void sparq_bench_end(const llama_context * ctx, sparq_bench_fields & f) {
    llama_sparq_stats st = {};
    st.size = sizeof(st);
    if (llama_sparq_get_stats(ctx, &st) != 0) {
        return;
    }
    f.calls += st.n_sparq - f.at.n_sparq;
    for (int i = 0; i < LLAMA_SPARQ_DENSE_COUNT; ++i) {
        f.dense += st.n_dense[i] - f.at.n_dense[i];
    }
    // the compression is over the SparQ calls
    auto weight = [](const llama_sparq_stats & x) {
        return (double) x.n_sparq;
    };
    f.compr_sum += st.compression * weight(st) - f.at.compression * weight(f.at);
    f.compr_n += weight(st) - weight(f.at);
    f.compression = f.compr_n > 0 ? f.compr_sum / f.compr_n : 0.0;
    f.k_sum += st.mean_k * (double) st.n_measured - f.at.mean_k * (double) f.at.n_measured;
    f.measured += st.n_measured - f.at.n_measured;
    f.mean_k = f.measured ? f.k_sum / (double) f.measured : 0.0;
}

// --depth-fill synthetic: fills the cleared cache with n_depth random cells instead of a
// prefill; false (with a message) when the context cannot take it
static inline bool sparq_bench_fill(llama_context * ctx, int n_depth) {
    char err[512];
    if (llama_sparq_bench_fill(ctx, n_depth, 1, err, sizeof(err)) != 0) {
        fprintf(stderr, "llama-bench: error: %s\n", err);
        return false;
    }
    return true;
}

// the counters' columns, after the settings'
static const char * const sparq_bench_counters[] = { "sparq_calls", "sparq_dense", "sparq_compr", "sparq_mean_k" };

// upstream's fields with the SparQ columns after n_depth: the settings (sparq, sparq_r, ...), then
// the counters (patch 0007)
static inline std::vector<std::string> sparq_bench_add_fields(std::vector<std::string> fields) {
    std::vector<std::string> ours;
    for (size_t i = 0; i < sparq_n_settings; ++i) {
        if (sparq_bench_row(i)) {
            ours.push_back(sparq_spelling_of(i).key);
        }
    }
    ours.insert(ours.end(), std::begin(sparq_bench_counters), std::end(sparq_bench_counters));
    auto at = std::find(fields.begin(), fields.end(), "n_depth");
    fields.insert(at == fields.end() ? at : at + 1, ours.begin(), ours.end());
    return fields;
}

// the test's values inserted where sparq_bench_add_fields put the columns (patch 0007)
static inline void sparq_bench_add_values(std::vector<std::string> & values, const std::vector<std::string> & fields,
                                          const sparq_bench_fields & f) {
    std::vector<std::string> ours;
    for (size_t i = 0; i < sparq_n_settings; ++i) {
        if (sparq_bench_row(i)) {
            ours.push_back(sparq_setting_text(f.p, sparq_settings[i]));
        }
    }
    char compr[32], mean_k[32];
    snprintf(compr, sizeof(compr), "%.4f", f.compression);
    snprintf(mean_k, sizeof(mean_k), "%.1f", f.mean_k);
    for (const std::string & v : { std::to_string(f.calls), std::to_string(f.dense), std::string(compr),
                                   std::string(mean_k) }) {
        ours.push_back(v);
    }
    const size_t at = (size_t) (std::find(fields.begin(), fields.end(), "sparq") - fields.begin());
    values.insert(values.begin() + (ptrdiff_t) std::min(at, values.size()), ours.begin(), ours.end());
}

// a SparQ column's type (patch 0007): the settings' by their kind, the counters' by what they count
static inline bool sparq_bench_is_int_field(const std::string & f) {
    for (size_t i = 0; i < sparq_n_settings; ++i) {
        if (sparq_bench_row(i) && f == sparq_spelling_of(i).key) {
            return sparq_settings[i].kind == SPARQ_KIND_BOOL || sparq_settings[i].kind == SPARQ_KIND_INT;
        }
    }
    return f == "sparq_calls" || f == "sparq_dense";
}

static inline bool sparq_bench_is_float_field(const std::string & f) {
    for (size_t i = 0; i < sparq_n_settings; ++i) {
        if (sparq_bench_row(i) && f == sparq_spelling_of(i).key) {
            return sparq_settings[i].kind == SPARQ_KIND_FLOAT;
        }
    }
    return f == "sparq_compr" || f == "sparq_mean_k";
}

// the markdown table shows the SparQ columns when SparQ is swept: the rows marked
// SPARQ_BENCH_MD_ALWAYS and the counters, and the other settings when swept or not at their default
static inline void sparq_bench_md_fields(const sparq_bench_params & p, std::vector<std::string> & fields) {
    if (!p.any()) {
        return;
    }
    for (size_t i = 0; i < sparq_n_settings; ++i) {
        if (sparq_bench_row(i) && (sparq_settings[i].shown & SPARQ_BENCH_MD_ALWAYS)) {
            fields.push_back(sparq_spelling_of(i).key);
        }
    }
    for (const char * f : { "sparq_calls", "sparq_compr", "sparq_mean_k" }) {
        fields.emplace_back(f);
    }
    const llama_sparq_params d = llama_sparq_default_params();
    for (size_t i = 0; i < sparq_n_settings; ++i) {
        const std::vector<double> & l = p.lists[i];
        if (sparq_bench_row(i) && !(sparq_settings[i].shown & SPARQ_BENCH_MD_ALWAYS) && !l.empty() &&
            (l.size() > 1 || l[0] != sparq_setting_get(d, sparq_settings[i]))) {
            fields.push_back(sparq_spelling_of(i).key);
        }
    }
}
