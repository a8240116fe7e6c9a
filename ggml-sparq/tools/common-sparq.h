// llama-sparq: the SparQ flags of the common arguments (every tool built on common:
// llama-cli, llama-completion, llama-server, llama-perplexity, ...) and their application
// to a new context. Included by common/arg.cpp and common/common.cpp (patch 0006).
#pragma once

#include "arg.h"
#include "common.h"
#include "llama-sparq.h"
#include "sparq-names.h"

#include <stdexcept>
#include <string>

// after the arguments are parsed (patch 0006, common/arg.cpp): SparQ needs the flash-attention
// KV layout, so with SparQ on `-fa auto` (the default) becomes `-fa on` and `-fa off` is refused
// (std::invalid_argument, reported like any bad argument)
void common_sparq_postprocess_params(common_params & params);

// applies params.sparq to a new context; false (after logging why) when refused, also when
// the context has no layer SparQ can run on (e.g. flash attention forced off by the model)
bool common_sparq_apply(llama_context * ctx, const common_params & params);

// the value of an enum setting from its name (the C API's names: llama_sparq_selector_name, ...),
// or std::invalid_argument naming the flag and the allowed values
inline int32_t common_sparq_parse_enum(const char * flag, const std::string & value, const char * (*name_of)(int32_t)) {
    std::string allowed;
    const int32_t i = sparq_enum_from_name(value, name_of, allowed);
    if (i < 0) {
        throw std::invalid_argument(std::string(flag) + ": unknown value '" + value + "'; allowed: " + allowed);
    }
    return i;
}

// a number (the library checks its range), or std::invalid_argument naming the flag
inline float common_sparq_parse_float(const char * flag, const std::string & value) {
    size_t end = 0;
    float v = 0.0f;
    try {
        v = std::stof(value, &end);
    } catch (const std::exception &) {
        end = 0;
    }
    if (end == 0 || end != value.size()) {
        throw std::invalid_argument(std::string(flag) + ": '" + value + "' is not a number");
    }
    return v;
}

template <typename AddOpt>
void common_sparq_add_args(AddOpt && add_opt, const common_params & params) {
    add_opt(common_arg(
        {"--sparq"}, {"--no-sparq"},
        "SparQ attention on decode steps of full-attention layers (default: off; any --sparq-* value "
        "also turns it on). Needs the flash-attention KV layout: turns -fa auto into -fa on, refuses -fa off",
        [](common_params & params, bool value) { params.sparq.enabled = value; }
    ).set_env("LLAMA_ARG_SPARQ"));
    add_opt(common_arg(
        {"--sparq-r"}, "N",
        string_format("SparQ: query components kept, 1..head size; 0 = head size / 4 (default: %d)", params.sparq.r),
        [](common_params & params, int value) {
            params.sparq.r = value;
            params.sparq.enabled = true;
        }
    ).set_env("LLAMA_ARG_SPARQ_R"));
    add_opt(common_arg(
        {"--sparq-k"}, "N",
        string_format("SparQ: positions attended per decode step: >= 1 a fixed budget, 0 calibrated (per step, KV head "
                      "and layer the fewest cells reaching --sparq-coverage, between --sparq-k-min and --sparq-k-frac "
                      "of the cells; CPU op) (default: %d)", params.sparq.k),
        [](common_params & params, int value) {
            params.sparq.k = value;
            params.sparq.enabled = true;
        }
    ).set_env("LLAMA_ARG_SPARQ_K"));
    add_opt(common_arg(
        {"--sparq-coverage"}, "P",
        string_format("SparQ: the share of the estimated attention mass the calibrated k reaches, (0, 1]; with a fixed "
                      "k the first SparQ step warns when k holds less (default: %.2f)", (double) params.sparq.coverage),
        [](common_params & params, const std::string & value) {
            params.sparq.coverage = common_sparq_parse_float("--sparq-coverage", value);
            params.sparq.enabled = true;
        }
    ).set_env("LLAMA_ARG_SPARQ_COVERAGE"));
    add_opt(common_arg(
        {"--sparq-k-min"}, "N",
        string_format("SparQ: the calibrated k's fewest cells, >= 1 (default: %d)", params.sparq.k_min),
        [](common_params & params, int value) {
            params.sparq.k_min = value;
            params.sparq.enabled = true;
        }
    ).set_env("LLAMA_ARG_SPARQ_K_MIN"));
    add_opt(common_arg(
        {"--sparq-k-frac"}, "F",
        string_format("SparQ: the calibrated k's most cells as a share of the KV cells, (0, 1] (default: %.3f)",
                      (double) params.sparq.k_frac),
        [](common_params & params, const std::string & value) {
            params.sparq.k_frac = common_sparq_parse_float("--sparq-k-frac", value);
            params.sparq.enabled = true;
        }
    ).set_env("LLAMA_ARG_SPARQ_K_FRAC"));
    add_opt(common_arg(
        {"--sparq-l"}, "N",
        string_format("SparQ: local window of most recent positions, counted in k, 0..k; -1 = k / 4 (calibrated k: "
                      "k_min / 4) (default: %d)",
                      params.sparq.l),
        [](common_params & params, int value) {
            params.sparq.l = value;
            params.sparq.enabled = true;
        }
    ).set_env("LLAMA_ARG_SPARQ_L"));
    add_opt(common_arg(
        {"--sparq-min-kv"}, "N",
        string_format("SparQ: decode stays dense below this many KV cells, >= 0; -1 (default): %d with the cache in "
                      "host memory, %d on a GPU", LLAMA_SPARQ_MIN_KV_HOST, LLAMA_SPARQ_MIN_KV_DEVICE),
        [](common_params & params, int value) {
            params.sparq.min_kv = value;
            params.sparq.enabled = true;
        }
    ).set_env("LLAMA_ARG_SPARQ_MIN_KV"));
    add_opt(common_arg(
        {"--sparq-selector"}, "NAME",
        "SparQ: how cells are chosen: sparq (approximate scores, default), oracle (exact top-k: an accuracy "
        "baseline that reads all of K), or the paper's baselines streaming (LM-Infinite: the first 16 positions "
        "and the most recent rest of k) and h2o (heavy hitters: the l most recent cells and the k - l that "
        "received the most attention; one sequence, KV cache in host memory) and index (top-k over a vector "
        "index of the keys: --sparq-index-lists, --sparq-index-probe; KV cache in host memory)",
        [](common_params & params, const std::string & value) {
            params.sparq.selector = common_sparq_parse_enum("--sparq-selector", value, llama_sparq_selector_name);
            params.sparq.enabled = true;
        }
    ).set_env("LLAMA_ARG_SPARQ_SELECTOR"));
    add_opt(common_arg(
        {"--sparq-index-lists"}, "N",
        string_format("SparQ selector index: lists (k-means centroids) per layer and KV head, 1..65536 (default: %d)",
                      params.sparq.index_lists),
        [](common_params & params, int value) {
            params.sparq.index_lists = value;
            params.sparq.enabled = true;
        }
    ).set_env("LLAMA_ARG_SPARQ_INDEX_LISTS"));
    add_opt(common_arg(
        {"--sparq-index-probe"}, "N",
        string_format("SparQ selector index: lists whose keys a decode step reads, 1..lists (default: %d)",
                      params.sparq.index_probe),
        [](common_params & params, int value) {
            params.sparq.index_probe = value;
            params.sparq.enabled = true;
        }
    ).set_env("LLAMA_ARG_SPARQ_INDEX_PROBE"));
    add_opt(common_arg(
        {"--sparq-gqa"}, "MODE",
        "SparQ with grouped-query attention: shared (one choice per KV head, default) or per_head (each query head "
        "chooses k - l cells, the group attends over their union)",
        [](common_params & params, const std::string & value) {
            params.sparq.gqa = common_sparq_parse_enum("--sparq-gqa", value, llama_sparq_gqa_name);
            params.sparq.enabled = true;
        }
    ).set_env("LLAMA_ARG_SPARQ_GQA"));
    add_opt(common_arg(
        {"--sparq-basis"}, "NAME",
        "SparQ step 1: model (rank the keys' components by |q|, the paper), scaled (by |q| times the keys' RMS per "
        "component, calibrated on the cache; default) or pca (the keys' principal axes, ranked likewise)",
        [](common_params & params, const std::string & value) {
            params.sparq.basis = common_sparq_parse_enum("--sparq-basis", value, llama_sparq_basis_name);
            params.sparq.enabled = true;
        }
    ).set_env("LLAMA_ARG_SPARQ_BASIS"));
    add_opt(common_arg(
        {"--sparq-mean-v"}, {"--no-sparq-mean-v"},
        "SparQ: mix the mean of V into the output by the chosen cells' approximate mass (step 5; default: on)",
        [](common_params & params, bool value) {
            params.sparq.mean_v = value;
            params.sparq.enabled = true;
        }
    ));
    add_opt(common_arg(
        {"--sparq-all-rows"},
        "SparQ: also on every query row of a batch (teacher-forced evaluation, e.g. llama-perplexity; default: off)",
        [](common_params & params) {
            params.sparq.all_rows = true;
            params.sparq.enabled = true;
        }
    ));
}
