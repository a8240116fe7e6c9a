// llama-sparq: SparQ parameters in llama-bench (included by tools/llama-bench/llama-bench.cpp,
// patch 0007). Swept like any parameter: --sparq 0,1 --sparq-r 16,32 --sparq-k 128 ...
// and reported in every output format, with the counters that prove SparQ ran.
#pragma once

#include "llama-sparq.h"
#include "sparq-names.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

struct sparq_bench_params {
    std::vector<int> on, r, k, l, min_kv, selector, gqa, basis, mean_v, index_lists, index_probe;
    bool fill_synthetic = false; // --depth-fill synthetic: llama_sparq_bench_fill instead of a prefill
    // the calibrated k's settings: one value each, for every SparQ instance (not swept)
    bool has_coverage = false, has_k_min = false, has_k_frac = false;
    float coverage = 0.0f, k_frac = 0.0f;
    int k_min = 0;
    bool any() const {
        return !on.empty() || !r.empty() || !k.empty() || !l.empty() || !min_kv.empty() || !selector.empty() ||
               !gqa.empty() || !basis.empty() || !mean_v.empty() || !index_lists.empty() || !index_probe.empty() ||
               has_coverage || has_k_min || has_k_frac;
    }
};


// the SparQ part of one test: its settings and what the counters said over its timed runs
struct sparq_bench_fields {
    llama_sparq_params p = llama_sparq_default_params();
    uint64_t calls = 0, dense = 0;
    double compression = 0.0;
    double compr_sum = 0.0;      // compression x its calls (SparQ and diffuse), summed over the timed runs
    double compr_n = 0.0;        // those calls
    double mean_k = 0.0;         // cells attended per KV head and step, as the op reported them
    double k_sum = 0.0;          // mean_k x reported calls, summed over the timed runs
    uint64_t measured = 0;
    llama_sparq_stats at = {};   // the counters when the current timed run began
};

static inline bool sparq_bench_is_arg(const std::string & a) {
    return a == "--sparq" || a == "--sparq-r" || a == "--sparq-k" || a == "--sparq-l" || a == "--sparq-min-kv" ||
           a == "--sparq-selector" || a == "--sparq-gqa" || a == "--sparq-basis" || a == "--sparq-mean-v" ||
           a == "--sparq-index-lists" || a == "--sparq-index-probe" || a == "--depth-fill" || a == "--sparq-coverage" ||
           a == "--sparq-k-min" || a == "--sparq-k-frac";
}

static inline void sparq_bench_usage() {
    printf("  --sparq <0|1>                              SparQ attention off/on (default: 0)\n");
    printf("  --sparq-r <n>                              SparQ query components, 0 = head size/4 (default: 0)\n");
    printf("  --sparq-k <n>                              SparQ positions per decode step; 0 = calibrated (default: 0)\n");
    printf("  --sparq-l <n>                              SparQ local window, -1 = k/4 (default: -1)\n");
    printf("  --sparq-coverage <p>                       calibrated k: target share of the attention mass (default: 0.95)\n");
    printf("  --sparq-k-min <n>                          calibrated k: fewest cells (default: 128)\n");
    printf("  --sparq-k-frac <f>                         calibrated k: most cells, share of the KV cells (default: 0.25)\n");
    printf("  --sparq-min-kv <n>                         SparQ dense below this many KV cells (default: 1024)\n");
    printf("  --sparq-selector <sparq|oracle|streaming|h2o|index> cell choice; oracle = exact top-k; streaming, h2o =\n"
           "                                             the paper's baselines; index = top-k over a vector index of\n"
           "                                             the keys (256 lists, 16 probed) (default: sparq)\n");
    printf("  --sparq-gqa <shared|per_head>              SparQ choice per KV head or per query head (default: shared)\n");
    printf("  --sparq-basis <model|scaled|pca>           SparQ step-1 ranking of components (default: scaled)\n");
    printf("  --sparq-mean-v <0|1>                       SparQ mean-V reallocation (default: 1)\n");
    printf("  --sparq-index-lists <n>                    selector index: lists per layer and KV head, 1..65536 (default: 256)\n");
    printf("  --sparq-index-probe <n>                    selector index: lists a step reads, 1..lists (default: 16)\n");
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
    if (arg == "--sparq-coverage" || arg == "--sparq-k-frac" || arg == "--sparq-k-min") {
        // one number each (the library checks the range)
        char * e = nullptr;
        const double v = arg == "--sparq-k-min" ? (double) strtol(value, &e, 10) : strtod(value, &e);
        if (!*value || *e != '\0' || (arg == "--sparq-k-min" && (v < INT32_MIN || v > INT32_MAX))) {
            fprintf(stderr, "error: %s: '%s' is not allowed (one %s)\n", arg.c_str(), value,
                    arg == "--sparq-k-min" ? "integer" : "number");
            return false;
        }
        if (arg == "--sparq-coverage") {
            p.has_coverage = true, p.coverage = (float) v;
        } else if (arg == "--sparq-k-frac") {
            p.has_k_frac = true, p.k_frac = (float) v;
        } else {
            p.has_k_min = true, p.k_min = (int) v;
        }
        return true;
    }
    const char * (*name_of)(int32_t) = nullptr;
    std::vector<int> * dst = &p.min_kv;
    if (arg == "--sparq-selector") {
        name_of = llama_sparq_selector_name, dst = &p.selector;
    } else if (arg == "--sparq-gqa") {
        name_of = llama_sparq_gqa_name, dst = &p.gqa;
    } else if (arg == "--sparq-basis") {
        name_of = llama_sparq_basis_name, dst = &p.basis;
    } else if (arg == "--sparq-mean-v") {
        dst = &p.mean_v;
    } else {
        dst = arg == "--sparq" ? &p.on : arg == "--sparq-r" ? &p.r : arg == "--sparq-k" ? &p.k :
              arg == "--sparq-l" ? &p.l : arg == "--sparq-index-lists" ? &p.index_lists :
              arg == "--sparq-index-probe" ? &p.index_probe : &p.min_kv;
    }
    const bool on_off = arg == "--sparq" || arg == "--sparq-mean-v";
    std::string s(value);
    size_t pos = 0;
    while (pos <= s.size()) {
        const size_t end = s.find(',', pos);
        const std::string tok = s.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
        if (name_of) {
            std::string allowed;
            const int32_t found = sparq_enum_from_name(tok, name_of, allowed);
            if (found < 0) {
                fprintf(stderr, "error: %s: '%s' is not allowed (%s)\n", arg.c_str(), tok.c_str(), allowed.c_str());
                return false;
            }
            dst->push_back(found);
            if (end == std::string::npos) {
                break;
            }
            pos = end + 1;
            continue;
        }
        char * e = nullptr;
        const long v = strtol(tok.c_str(), &e, 10);
        if (tok.empty() || *e != '\0' || (on_off && v != 0 && v != 1) || v < INT32_MIN || v > INT32_MAX) {
            fprintf(stderr, "error: %s: '%s' is not allowed (%s)\n", arg.c_str(), tok.c_str(),
                    on_off ? "0 or 1" : "integers");
            return false;
        }
        dst->push_back((int) v);
        if (end == std::string::npos) {
            break;
        }
        pos = end + 1;
    }
    return true;
}

// one instance per combination of the SparQ lists (the instance type has a .sparq member)
template <typename Inst>
static void sparq_bench_expand(std::vector<Inst> & insts, const sparq_bench_params & p) {
    if (!p.any()) {
        return;
    }
    const llama_sparq_params d = llama_sparq_default_params();
    const std::vector<int> on = p.on.empty() ? std::vector<int>{ 1 } : p.on;
    const std::vector<int> rs = p.r.empty() ? std::vector<int>{ d.r } : p.r;
    const std::vector<int> ks = p.k.empty() ? std::vector<int>{ d.k } : p.k;
    const std::vector<int> ls = p.l.empty() ? std::vector<int>{ d.l } : p.l;
    const std::vector<int> ms = p.min_kv.empty() ? std::vector<int>{ d.min_kv } : p.min_kv;
    const std::vector<int> ss = p.selector.empty() ? std::vector<int>{ d.selector } : p.selector;
    const std::vector<int> gs = p.gqa.empty() ? std::vector<int>{ d.gqa } : p.gqa;
    const std::vector<int> bs = p.basis.empty() ? std::vector<int>{ d.basis } : p.basis;
    const std::vector<int> vs = p.mean_v.empty() ? std::vector<int>{ (int) d.mean_v } : p.mean_v;
    const std::vector<int> il = p.index_lists.empty() ? std::vector<int>{ d.index_lists } : p.index_lists;
    const std::vector<int> ip = p.index_probe.empty() ? std::vector<int>{ d.index_probe } : p.index_probe;
    std::vector<Inst> out;
    for (const Inst & base : insts) {
        for (int o : on) {
            // with SparQ off the other settings do not matter: one instance
            const size_t nr = o ? rs.size() : 1, nk = o ? ks.size() : 1, nl = o ? ls.size() : 1, nm = o ? ms.size() : 1;
            const size_t ns = o ? ss.size() : 1, ng = o ? gs.size() : 1, nb = o ? bs.size() : 1, nv = o ? vs.size() : 1;
            const size_t nil = o ? il.size() : 1, nip = o ? ip.size() : 1;
            for (size_t a = 0; a < nr; ++a)
            for (size_t b = 0; b < nk; ++b)
            for (size_t c = 0; c < nl; ++c)
            for (size_t e = 0; e < nm; ++e)
            for (size_t f = 0; f < ns; ++f)
            for (size_t h = 0; h < ng; ++h)
            for (size_t i = 0; i < nb; ++i)
            for (size_t j = 0; j < nv; ++j)
            for (size_t x = 0; x < nil; ++x)
            for (size_t y = 0; y < nip; ++y) {
                Inst inst = base;
                inst.sparq.enabled = o != 0;
                if (o) {
                    inst.sparq.r = rs[a];
                    inst.sparq.k = ks[b];
                    inst.sparq.l = ls[c];
                    inst.sparq.min_kv = ms[e];
                    inst.sparq.selector = ss[f];
                    inst.sparq.gqa = gs[h];
                    inst.sparq.basis = bs[i];
                    inst.sparq.mean_v = vs[j] != 0;
                    inst.sparq.index_lists = il[x];
                    inst.sparq.index_probe = ip[y];
                    if (p.has_coverage) {
                        inst.sparq.coverage = p.coverage;
                    }
                    if (p.has_k_min) {
                        inst.sparq.k_min = p.k_min;
                    }
                    if (p.has_k_frac) {
                        inst.sparq.k_frac = p.k_frac;
                    }
                }
                out.push_back(inst);
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
    // the compression is over the SparQ calls and the calibrated k's dense stretches ("diffuse")
    auto weight = [](const llama_sparq_stats & x) {
        return (double) x.n_sparq + (double) x.n_dense[LLAMA_SPARQ_DENSE_DIFFUSE];
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

// field names, in the order of sparq_bench_value()
#define SPARQ_BENCH_FIELDS "sparq", "sparq_r", "sparq_k", "sparq_l", "sparq_min_kv", "sparq_calls", "sparq_dense", "sparq_compr", \
                           "sparq_selector", "sparq_gqa", "sparq_basis", "sparq_mean_v", "sparq_index_lists", "sparq_index_probe", \
                           "sparq_mean_k"

// their values, in the test's row (patch 0007)
#define SPARQ_BENCH_VALUES(f) \
    sparq_bench_value(f, 0), sparq_bench_value(f, 1), sparq_bench_value(f, 2), sparq_bench_value(f, 3), \
    sparq_bench_value(f, 4), sparq_bench_value(f, 5), sparq_bench_value(f, 6), sparq_bench_value(f, 7), \
    sparq_bench_value(f, 8), sparq_bench_value(f, 9), sparq_bench_value(f, 10), sparq_bench_value(f, 11), \
    sparq_bench_value(f, 12), sparq_bench_value(f, 13), sparq_bench_value(f, 14)

static inline bool sparq_bench_is_int_field(const std::string & f) {
    return f == "sparq" || f == "sparq_r" || f == "sparq_k" || f == "sparq_l" || f == "sparq_min_kv" ||
           f == "sparq_calls" || f == "sparq_dense" || f == "sparq_mean_v" || f == "sparq_index_lists" ||
           f == "sparq_index_probe";
}

static inline std::string sparq_bench_value(const sparq_bench_fields & f, int i) {
    switch (i) {
        case 0: return std::to_string((int) f.p.enabled);
        case 1: return std::to_string(f.p.r);
        case 2: return std::to_string(f.p.k);
        case 3: return std::to_string(f.p.l);
        case 4: return std::to_string(f.p.min_kv);
        case 5: return std::to_string(f.calls);
        case 6: return std::to_string(f.dense);
        case 8: return llama_sparq_selector_name(f.p.selector) ? llama_sparq_selector_name(f.p.selector) : "?";
        case 9: return llama_sparq_gqa_name(f.p.gqa) ? llama_sparq_gqa_name(f.p.gqa) : "?";
        case 10: return llama_sparq_basis_name(f.p.basis) ? llama_sparq_basis_name(f.p.basis) : "?";
        case 11: return std::to_string((int) f.p.mean_v);
        case 12: return std::to_string(f.p.index_lists);
        case 13: return std::to_string(f.p.index_probe);
        case 14: {
            char buf[32];
            snprintf(buf, sizeof(buf), "%.1f", f.mean_k);
            return buf;
        }
        default: {
            char buf[32];
            snprintf(buf, sizeof(buf), "%.4f", f.compression);
            return buf;
        }
    }
}

// the markdown table shows the SparQ columns when SparQ is swept
static inline void sparq_bench_md_fields(const sparq_bench_params & p, std::vector<std::string> & fields) {
    if (p.any()) {
        for (const char * f : { "sparq", "sparq_r", "sparq_k", "sparq_l", "sparq_calls", "sparq_compr", "sparq_mean_k" }) {
            fields.emplace_back(f);
        }
        // the selection variants appear when they are swept or differ from the default
        const llama_sparq_params d = llama_sparq_default_params();
        if (!p.selector.empty() && (p.selector.size() > 1 || p.selector[0] != d.selector)) {
            fields.emplace_back("sparq_selector");
        }
        if (!p.gqa.empty() && (p.gqa.size() > 1 || p.gqa[0] != d.gqa)) {
            fields.emplace_back("sparq_gqa");
        }
        if (!p.basis.empty() && (p.basis.size() > 1 || p.basis[0] != d.basis)) {
            fields.emplace_back("sparq_basis");
        }
        if (!p.mean_v.empty() && (p.mean_v.size() > 1 || p.mean_v[0] != (int) d.mean_v)) {
            fields.emplace_back("sparq_mean_v");
        }
        if (!p.index_lists.empty() && (p.index_lists.size() > 1 || p.index_lists[0] != d.index_lists)) {
            fields.emplace_back("sparq_index_lists");
        }
        if (!p.index_probe.empty() && (p.index_probe.size() > 1 || p.index_probe[0] != d.index_probe)) {
            fields.emplace_back("sparq_index_probe");
        }
    }
}
