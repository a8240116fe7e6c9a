// llama-sparq: the C API's version and names, the default settings, and llama_sparq_set_params /
// llama_sparq_get_params (validation, then the context's SparQ state made or updated). The
// defaults and the range checks are expanded from the settings' table (llama-sparq-settings.def).
#include "llama-sparq-basis.h"
#include "llama-sparq-buffers.h"
#include "llama-sparq-coverage.h"
#include "llama-sparq-messages.h"
#include "llama-sparq-op.h"
#include "llama-sparq-selector.h"
#include "llama-sparq-state.h"
#include "llama-sparq-upstream.h"
#include "llama-sparq-version.h"

#include "ggml-backend.h"
#include "ggml-sparq.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>

const char * llama_sparq_version(void) {
    return "llama-sparq " LLAMA_SPARQ_VERSION_STR " abi " LLAMA_SPARQ_STR(LLAMA_SPARQ_ABI_VERSION)
           " llama.cpp " LLAMA_SPARQ_UPSTREAM_COMMIT_STR;
}

int llama_sparq_abi_version(void) {
    return LLAMA_SPARQ_ABI_VERSION;
}

const char * llama_sparq_dense_reason_name(int32_t reason) {
    return reason >= 0 && reason < LLAMA_SPARQ_DENSE_COUNT ? sparq_reason_names[reason] : nullptr;
}

struct llama_sparq_params llama_sparq_default_params(void) {
    llama_sparq_params p;
    memset(&p, 0, sizeof(p));
    p.size = sizeof(p);
#define LLAMA_SPARQ_SETTING(type, name, dflt, ...) p.name = dflt;
#include "llama-sparq-settings.def"
    return p;
}

// the names of the enums' values: the one list the front ends (Python, the flags, llama-bench) use (the
// selectors' beside their rows, llama-sparq-selectors.cpp)
static const char * const sparq_gqa_names[LLAMA_SPARQ_GQA_COUNT] = { "shared", "per_head" };
static const char * const sparq_basis_names[LLAMA_SPARQ_BASIS_COUNT] = { "model", "scaled", "pca" };

const char * llama_sparq_gqa_name(int32_t gqa) {
    return gqa >= 0 && gqa < LLAMA_SPARQ_GQA_COUNT ? sparq_gqa_names[gqa] : nullptr;
}

const char * llama_sparq_basis_name(int32_t basis) {
    return basis >= 0 && basis < LLAMA_SPARQ_BASIS_COUNT ? sparq_basis_names[basis] : nullptr;
}

// ---------------------------------------------------------------------------
// llama_sparq_set_params: validation
// ---------------------------------------------------------------------------

// the smallest head size of the full-attention layers (it bounds r)
static int64_t sparq_min_head_size(const llama_hparams & hp) {
    int64_t d_min = INT64_MAX;
    for (uint32_t il = 0; il < hp.n_layer(); ++il) {
        if (!hp.is_swa(il) && hp.n_embd_head_k(il) > 0) {
            d_min = std::min<int64_t>(d_min, hp.n_embd_head_k(il));
        }
    }
    if (d_min == INT64_MAX) {
        d_min = hp.n_embd_head_k();
    }
    return d_min;
}

// A setting's range, from its row of llama-sparq-settings.def (the SPARQ_* forms described there).
struct sparq_range {
    enum kind_t { ANY, INTS, SHARE, VALUES, NAMES } kind;
    double lo, hi;
    const char * bound;                 // SPARQ_INTS_TO: what hi is ("k", "head size")
    const char * (*names)(int32_t);     // SPARQ_NAMES
    int32_t values[4] = {};             // SPARQ_VALUES: the allowed integers, n_values of them
    int n_values = 0;
};

// SPARQ_VALUES' range: its integers, in order
static sparq_range sparq_values(std::initializer_list<int32_t> vals) {
    sparq_range r{ sparq_range::VALUES, 0, 0, nullptr, nullptr };
    for (int32_t v : vals) {
        r.values[r.n_values++] = v;
    }
    return r;
}

static bool sparq_value_listed(const sparq_range & range, double v) {
    for (int i = 0; i < range.n_values; ++i) {
        if (v == range.values[i]) {
            return true;
        }
    }
    return false;
}

// the one value allowed outside the range (SPARQ_OR), and what it stands for
struct sparq_or {
    bool has;
    double value;
    const char * meaning;
};

// "0 (name), 1 (name), ...": the allowed values of an enum setting, for the error messages
static std::string sparq_allowed_names(const char * (*names)(int32_t)) {
    std::string s;
    for (int32_t i = 0; names(i) != nullptr; ++i) {
        s += (i ? ", " : "") + std::to_string(i) + " (" + names(i) + ")";
    }
    return s;
}

// setting `name` = v within its range, or false with the message in err. pass 0 checks the
// settings with fixed ranges, pass 1 those bounded by another setting or the head size (so a
// bad bound is reported as itself, not through the setting it bounds)
static bool sparq_setting_ok(const char * name, bool is_float, double v, const sparq_range & range, const sparq_or & alt,
                             int pass, char * err, size_t err_size) {
    if ((range.bound != nullptr) != (pass == 1) || range.kind == sparq_range::ANY || (alt.has && v == alt.value)) {
        return true;
    }
    if (range.kind == sparq_range::NAMES) {
        if (range.names((int32_t) v) == nullptr) {
            sparq_err(err, err_size, "SparQ: %s = %d is unknown: allowed %s", name, (int) v,
                      sparq_allowed_names(range.names).c_str());
            return false;
        }
        return true;
    }
    const bool known = range.bound == nullptr || range.hi > 0; // the head size is not known without a model
    if (!known) {
        return true;
    }
    const bool ok = range.kind == sparq_range::SHARE    ? v > range.lo && v <= range.hi :
                    range.kind == sparq_range::VALUES ? sparq_value_listed(range, v) :
                                                        v >= range.lo && v <= range.hi;
    if (ok) {
        return true;
    }
    char value[32], allowed[160];
    if (is_float) {
        snprintf(value, sizeof(value), "%g", v);
    } else {
        snprintf(value, sizeof(value), "%lld", (long long) v);
    }
    if (range.kind == sparq_range::SHARE) {
        snprintf(allowed, sizeof(allowed), "(%g, %g]", range.lo, range.hi);
    } else if (range.kind == sparq_range::VALUES) {
        std::string s; // "a, b or c"
        for (int i = 0; i < range.n_values; ++i) {
            s += (i == 0 ? "" : i + 1 == range.n_values ? " or " : ", ") + std::to_string(range.values[i]);
        }
        snprintf(allowed, sizeof(allowed), "%s", s.c_str());
    } else if (range.bound) {
        snprintf(allowed, sizeof(allowed), "%lld..%s (%s = %lld)", (long long) range.lo, range.bound, range.bound,
                 (long long) range.hi);
    } else if (range.hi >= INT32_MAX) {
        snprintf(allowed, sizeof(allowed), "%s >= %lld", name, (long long) range.lo);
    } else {
        snprintf(allowed, sizeof(allowed), "%lld..%lld", (long long) range.lo, (long long) range.hi);
    }
    if (alt.has) {
        sparq_err(err, err_size, "SparQ: %s = %s is out of range: allowed %s, or %lld for %s", name, value, allowed,
                  (long long) alt.value, alt.meaning);
    } else {
        sparq_err(err, err_size, "SparQ: %s = %s is out of range: allowed %s", name, value, allowed);
    }
    return false;
}

// every setting within its range (the first one that is not: false, with the message in err);
// head_size <= 0: not known, the settings it bounds wait for the check with the context
static bool sparq_params_in_range(const llama_sparq_params * p, int64_t head_size, char * err, size_t err_size) {
#define SPARQ_ANY                    sparq_range{ sparq_range::ANY, 0, 0, nullptr, nullptr }
#define SPARQ_INTS(lo, hi)           sparq_range{ sparq_range::INTS, (double) (lo), (double) (hi), nullptr, nullptr }
#define SPARQ_INTS_TO(lo, bound, hi) sparq_range{ sparq_range::INTS, (double) (lo), (double) (hi), bound, nullptr }
#define SPARQ_SHARE                  sparq_range{ sparq_range::SHARE, 0, 1, nullptr, nullptr }
#define SPARQ_VALUES(...)            sparq_values({ __VA_ARGS__ })
#define SPARQ_NAMES(names)           sparq_range{ sparq_range::NAMES, 0, 0, nullptr, names }
#define SPARQ_OR(value, meaning)     sparq_or{ true, (double) (value), meaning }
#define SPARQ_NONE                   sparq_or{ false, 0, nullptr }
#define LLAMA_SPARQ_SETTING(type, name, dflt, range, alt, ...)                                                    \
    if (!sparq_setting_ok(#name, std::is_floating_point<type>::value, (double) p->name, range, alt, pass, err, \
                          err_size)) {                                                                         \
        return false;                                                                                          \
    }
    for (int pass = 0; pass < 2; ++pass) {
#include "llama-sparq-settings.def"
    }
    return true;
}

// the ranges, then the settings against each other (the context aside)
static bool sparq_params_consistent(const llama_sparq_params * p, int64_t head_size, char * err, size_t err_size) {
    if (!sparq_params_in_range(p, head_size, err, err_size)) {
        return false;
    }
    if (!p->enabled) {
        return true;
    }
    const sparq_selector & sel = sparq_selector_of(p->selector);
    if (p->k == 0 && !sel.ranks_scores) {
        sparq_err(err, err_size, "SparQ: k = 0 (calibrated) needs the %s selector (it cuts step 2's "
                  "approximate scores); selector %s needs k >= 1", sparq_ranking_selector_names().c_str(),
                  llama_sparq_selector_name(p->selector));
        return false;
    }
    if (p->topk_buckets > 0) {
        if (!sel.ranks_scores) {
            sparq_err(err, err_size, "SparQ: topk_buckets = %d ranks step 2's approximate scores: it needs the %s "
                      "selector, not %s (0: the exact top-k)", (int) p->topk_buckets,
                      sparq_ranking_selector_names().c_str(), llama_sparq_selector_name(p->selector));
            return false;
        }
        if (p->k == 0) {
            sparq_err(err, err_size, "SparQ: topk_buckets = %d needs a fixed k (k >= 1); k = 0 is the calibrated k, "
                      "which cuts the exact ranking (0: the exact top-k)", (int) p->topk_buckets);
            return false;
        }
        if (p->topk_buckets < p->k) {
            sparq_err(err, err_size, "SparQ: topk_buckets = %d is below k = %d: each bucket offers one cell, so it needs "
                      "at least k buckets; allowed 0 (the exact top-k) or k..%d", (int) p->topk_buckets, (int) p->k,
                      (int) GGML_SPARQ_K_MAX);
            return false;
        }
    }
    return !sel.check || sel.check(*p, nullptr, err, err_size);
}

// the struct is this library's (a caller built against another header would pass another size)
static bool sparq_params_size_ok(const llama_sparq_params * p, char * err, size_t err_size) {
    if (p->size != sizeof(llama_sparq_params)) {
        sparq_err(err, err_size, "SparQ: params.size is %zu, this library's struct llama_sparq_params is %zu bytes "
                  "(initialise it with llama_sparq_default_params())", p->size, sizeof(llama_sparq_params));
        return false;
    }
    return true;
}

int32_t llama_sparq_check_params(const struct llama_sparq_params * p, int32_t head_size, char * err, size_t err_size) {
    if (err && err_size) {
        err[0] = '\0';
    }
    if (!p) {
        sparq_err(err, err_size, "SparQ: params must not be NULL");
        return -1;
    }
    return sparq_params_size_ok(p, err, err_size) && sparq_params_consistent(p, head_size, err, err_size) ? 0 : -1;
}

// the settings checked against their ranges and the context: 0, or -1 (a bad argument or setting) /
// -2 (the context cannot run them), with the message in err
static int32_t sparq_validate_params(llama_context * ctx, const llama_sparq_params * p, char * err, size_t err_size) {
    if (!ctx || !p) {
        sparq_err(err, err_size, "SparQ: ctx and params must not be NULL");
        return -1;
    }
    if (!sparq_params_size_ok(p, err, err_size)) {
        return -1;
    }
    if (!sparq_params_consistent(p, sparq_min_head_size(upstream::model(ctx).hparams), err, err_size)) {
        return -1;
    }
    const sparq_selector & sel = sparq_selector_of(p->selector);
    if (p->enabled && sel.check && !sel.check(*p, &upstream::cparams(ctx), err, err_size)) {
        return -2;
    }
    return 0;
}

// ---------------------------------------------------------------------------
// llama_sparq_set_params: application
// ---------------------------------------------------------------------------

// the context's SparQ state, made when SparQ is first enabled (its cache found, K^T and the sums
// allocated): 0, or -2 with the message in err
static int32_t sparq_create(llama_context * ctx, int32_t kt_bits, char * err, size_t err_size) {
    llama_kv_cache * kv = sparq_find_cache(ctx->get_memory());
    if (!kv) {
        sparq_err(err, err_size, "SparQ: this context has no attention KV cache (recurrent or embedding model?)");
        return -2;
    }
    if (upstream::kv_size(kv) > (uint32_t) LLAMA_SPARQ_MAX_CELLS) {
        sparq_err(err, err_size, "SparQ: the KV cache has %u cells per stream; SparQ supports up to %u (2^24: the "
                  "op counts the valid cells in f32)", upstream::kv_size(kv), (uint32_t) LLAMA_SPARQ_MAX_CELLS);
        return -2;
    }
    auto S = std::make_shared<llama_sparq_ctx>();
    S->lctx = ctx;
    S->kv = kv;
    S->balloc = upstream::balloc(ctx);
    if (!sparq_alloc(*S, upstream::model(ctx), kt_bits, err, err_size)) {
        return -2;
    }
    upstream::cparams(ctx).sparq = S;
    return 0;
}

static bool sparq_layer_quantized(const sparq_layer & L) {
    return ggml_is_quantized(L.type_k) || ggml_is_quantized(L.type_v);
}

// the calibrated k's floor in use: the setting, or for k_min = 0 the default of the cache's type
// (LLAMA_SPARQ_K_MIN_QUANTIZED where a layer that runs SparQ keeps K or V quantized)
static int32_t sparq_k_min(const llama_sparq_ctx & S, const llama_sparq_params * p) {
    if (p->k_min > 0) {
        return p->k_min;
    }
    for (const sparq_layer & L : S.layers) {
        if (L.data.kt && sparq_layer_quantized(L)) {
            return LLAMA_SPARQ_K_MIN_QUANTIZED;
        }
    }
    return LLAMA_SPARQ_K_MIN_F16;
}

// The settings' probe: for each device that holds a SparQ layer (the CPU for a cache in host memory),
// once per device, the node the graph would build for a decode step of that layer with these settings
// (sparq_op_probe: the graph's own road from the settings to the op) is checked by the op's constructor
// and put to the device's supports_op. A device that is not the CPU must run the op where the cache is:
// the scheduler would otherwise run it on the CPU and copy the layer's cache to the host at every step.
// With `types` the default selector and a fixed k (what every device op runs, so only the cache's types
// can be refused). 0, or -2 with the device and what it refused in err
static int32_t sparq_check_device_runs(const llama_sparq_ctx & S, const llama_sparq_params * p, bool types, char * err,
                                       size_t err_size) {
    std::vector<ggml_backend_dev_t> checked;
    llama_sparq_params pp = *p;
    pp.k_min = sparq_k_min(S, p);
    if (types) {
        pp.selector = LLAMA_SPARQ_SELECTOR_SPARQ;
        pp.k = pp.k > 0 ? pp.k : pp.k_min;
        pp.gqa = LLAMA_SPARQ_GQA_SHARED;
        pp.topk_buckets = 0;
    }
    for (const sparq_layer & L : S.layers) {
        if (!L.data.kt) {
            continue;
        }
        const bool host = ggml_backend_buffer_is_host(L.data.kt->buffer);
        ggml_backend_dev_t dev = host ? ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)
                                      : ggml_backend_buft_get_device(ggml_backend_buffer_get_type(L.data.kt->buffer));
        if (!dev || std::find(checked.begin(), checked.end(), dev) != checked.end()) {
            continue;
        }
        checked.push_back(dev);
        const bool cpu = ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU;
        ggml_init_params ip = { 32 * ggml_tensor_overhead(), nullptr, true };
        ggml_context * c = ggml_init(ip);
        const char * why = nullptr;
        ggml_tensor * op = sparq_op_probe(c, S, L, pp, 64, false, &why);
        const bool ok = op && ggml_backend_dev_supports_op(dev, op);
        ggml_free(c);
        if (!op) {
            sparq_err(err, err_size, "SparQ: these settings make no valid node of the op in layer %d (%s)", L.il, why);
            return -2;
        }
        const bool quantized = sparq_layer_quantized(L);
        if (ok || (types && !quantized) || (cpu && types)) {
            continue; // (refused for something else than the types: the settings' probe says what)
        }
        if (types) {
            sparq_err(err, err_size, "SparQ: the KV cache on %s is K %s, V %s, which that device's SparQ op does not "
                      "read (it reads f16 and f32; the CPU op also the quantized types): use an f16 cache there (-ctk f16 -ctv f16, "
                      "type_k/type_v), or keep the cache in host memory (--no-kv-offload / offload_kqv = false)",
                      ggml_backend_dev_name(dev), ggml_type_name(L.type_k), ggml_type_name(L.type_v));
            return -2;
        }
        if (cpu) {
            sparq_err(err, err_size, "SparQ: the CPU op does not run selector %s with these settings in layer %d",
                      llama_sparq_selector_name(p->selector), L.il);
            return -2;
        }
        // (a device's op runs the selectors that rank K^T's scores)
        sparq_err(err, err_size, "SparQ: selector %s with k = %d%s does not run on %s, which holds the KV cache "
                  "(running it on the CPU would copy the cache to the host at every step): use selector %s "
                  "there, or keep the cache in host memory (--no-kv-offload / offload_kqv = false)",
                  llama_sparq_selector_name(p->selector), (int) p->k, p->k == 0 ? " (calibrated)" : "",
                  ggml_backend_dev_name(dev), sparq_ranking_selector_names().c_str());
        return -2;
    }
    return 0;
}

// enabled settings applied to the context's SparQ state: the selectors' and the basis's tensors,
// and every stream rebuilt when SparQ is switched on or the basis changes. 0, or -2 with the message in err
static int32_t sparq_apply_params(llama_context * ctx, llama_sparq_ctx & S, const llama_sparq_params * p, char * err,
                                  size_t err_size) {
    const sparq_selector & sel = sparq_selector_of(p->selector);
    if (p->enabled && sel.apply && !sel.apply(S, *p, err, err_size)) {
        return -2;
    }
    // the cache's types first: whatever the settings, a device that cannot read them cannot run the op;
    // then the settings (the calibrated k too: the CUDA op and an RPC host's CPU op cut the selection
    // themselves; they do not report their cells, so the counters count the cap there)
    if (sparq_check_device_runs(S, p, true, err, err_size) != 0 ||
        sparq_check_device_runs(S, p, false, err, err_size) != 0) {
        return -2;
    }
    if (p->basis == LLAMA_SPARQ_BASIS_PCA && !sparq_alloc_basis(S, err, err_size)) {
        return -2;
    }
    if (p->kt_bits != S.mem.kt_bits) {
        // K^T of another type: allocated anew, and every stream rebuilt into it before its next use
        if (!sparq_alloc_kt(S, p->kt_bits, err, err_size)) {
            return -2;
        }
        for (auto & st : S.streams) {
            st.valid = false;
        }
    }
    {
        // the device windows' length follows the local window of these settings
        llama_sparq_params resolved = *p;
        resolved.k_min = sparq_k_min(S, p);
        const int32_t cap = sparq_window_cap(resolved);
        if (cap != S.mem.win_cap && !sparq_alloc_win(S, cap, err, err_size)) {
            return -2;
        }
    }
    if (p->basis != S.params.basis || !S.params.enabled) {
        // switched on (nothing kept the data while SparQ was off) or a new basis: every stream is rebuilt
        // before its next use, in the new basis (a calibrated one at the next SparQ step)
        S.basis.calibrated = false;
        sparq_basis_reset(S);
        // upstream's Hadamard rotation (a quantized K cache) undone in K^T but in the PCA basis
        S.hadamard.kt_unrotated = S.hadamard.n > 0 && p->basis != LLAMA_SPARQ_BASIS_PCA;
        for (auto & st : S.streams) {
            st.valid = false;
        }
    }
    // the default's value read back (llama_sparq_get_params) and passed back unchanged, as the front
    // ends' "change one setting" does, stays the default: with another kind of k it resolves anew
    const bool min_kv_auto = p->min_kv < 0 || (S.min_kv_auto && p->min_kv == S.params.min_kv);
    S.params = *p;
    S.params.k_min = sparq_k_min(S, p); // the cache's types never change: no need to remember it was 0
    S.min_kv_auto = min_kv_auto;
    if (min_kv_auto) {
        // the default: by where the cache is (a layer on a GPU: the GPU's crossover for the kind of k;
        // an RPC host runs the CPU op there: the host's)
        bool device = false;
        for (const sparq_layer & L : S.layers) {
            if (L.data.kt && !ggml_backend_buffer_is_host(L.data.kt->buffer)) {
                ggml_backend_dev_t dev = ggml_backend_buft_get_device(ggml_backend_buffer_get_type(L.data.kt->buffer));
                ggml_backend_reg_t reg = dev ? ggml_backend_dev_backend_reg(dev) : nullptr;
                device |= !reg || strncmp(ggml_backend_reg_name(reg), "RPC", 3) != 0; // "RPC" or "RPC[host:port]"
            }
        }
        S.params.min_kv = !device          ? LLAMA_SPARQ_MIN_KV_HOST
                          : S.params.k > 0 ? LLAMA_SPARQ_MIN_KV_DEVICE
                                           : LLAMA_SPARQ_MIN_KV_DEVICE_CALIBRATED;
    }
    sparq_coverage_reset(S); // the guard measures the new settings at the next SparQ step
    // graphs built with the old settings must not be reused
    upstream::need_reserve(ctx);
    return 0;
}

int32_t llama_sparq_set_params(struct llama_context * ctx, const struct llama_sparq_params * p, char * err, size_t err_size) {
    if (err && err_size) {
        err[0] = '\0';
    }
    const int32_t rc = sparq_validate_params(ctx, p, err, err_size);
    if (rc != 0) {
        return rc;
    }
    llama_cparams & cp = upstream::cparams(ctx);
    if (!p->enabled) {
        if (cp.sparq) {
            cp.sparq->params = *p;
            upstream::need_reserve(ctx);
        }
        return 0;
    }
    if (!cp.sparq) {
        const int32_t rc_create = sparq_create(ctx, p->kt_bits, err, err_size);
        if (rc_create != 0) {
            return rc_create;
        }
    }
    if (cp.sparq->n_layers == 0) {
        // every step would run dense: refused, with each reason and its layer count, rather than
        // "on" with nothing sparse
        int n_by_reason[LLAMA_SPARQ_DENSE_COUNT] = {};
        std::string types; // the cache types of the first layer refused for them
        const char * variant = nullptr; // the first layer's attention variant
        for (const sparq_layer & L : cp.sparq->layers) {
            if (L.reason >= 0 && L.reason < LLAMA_SPARQ_DENSE_COUNT) {
                n_by_reason[L.reason]++;
            }
            if (L.reason == LLAMA_SPARQ_DENSE_ATTN_VARIANT && !variant) {
                variant = L.variant;
            }
            if (L.reason == LLAMA_SPARQ_DENSE_CACHE_TYPE && types.empty()) {
                types = std::string(" (here K ") + ggml_type_name(L.type_k) + ", V " + ggml_type_name(L.type_v) +
                        "; use -ctk/-ctv or type_k/type_v f16, q8_0 or q4_0)";
            }
        }
        std::string why;
        for (int i = 0; i < LLAMA_SPARQ_DENSE_COUNT; ++i) {
            if (n_by_reason[i]) {
                why += std::string(why.empty() ? "" : "; ") + std::to_string(n_by_reason[i]) + " " +
                       sparq_reason_names[i] + ": " +
                       (i == LLAMA_SPARQ_DENSE_ATTN_VARIANT && variant ? variant : sparq_reason_text[i]) +
                       (i == LLAMA_SPARQ_DENSE_CACHE_TYPE ? types : "");
            }
        }
        sparq_err(err, err_size, "SparQ: no KV-cache layer of this context can run SparQ (%s); refusing to run dense "
                  "while SparQ is asked for", why.empty() ? "no KV-cache layers" : why.c_str());
        return -2;
    }
    return sparq_apply_params(ctx, *cp.sparq, p, err, err_size);
}

int32_t llama_sparq_get_params(const struct llama_context * ctx, struct llama_sparq_params * out) {
    if (!out || out->size != sizeof(llama_sparq_params)) {
        return -1;
    }
    const auto & cp = upstream::cparams(const_cast<llama_context *>(ctx));
    *out = cp.sparq ? cp.sparq->params : llama_sparq_default_params();
    return 0;
}
