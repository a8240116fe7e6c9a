// llama-sparq: the SparQ flags of the common arguments (every tool built on common:
// llama-cli, llama-completion, llama-server, llama-perplexity, ...), one per row of the
// settings' table, and their application to a new context. Included by common/arg.cpp and
// common/common.cpp (patch 0006).
#pragma once

#include "arg.h"
#include "common.h"
#include "llama-sparq.h"
#include "sparq-settings.h"

#include <stdexcept>
#include <string>
#include <utility>

// after the arguments are parsed (patch 0006, common/arg.cpp): SparQ needs the flash-attention
// KV layout, so with SparQ on `-fa auto` (the default) becomes `-fa on` and `-fa off` is refused
// (std::invalid_argument, reported like any bad argument)
void common_sparq_postprocess_params(common_params & params);

// applies params.sparq to a new context; false (after logging why) when refused, also when
// the context has no layer SparQ can run on (e.g. flash attention forced off by the model)
bool common_sparq_apply(llama_context * ctx, const common_params & params);

// row I's flag set a value: the field, and SparQ on (any setting given switches it on; --no-sparq off)
template <size_t I> void common_sparq_set(common_params & params, double value) {
    sparq_setting_set(params.sparq, sparq_settings[I], value);
    if (I != sparq_enabled_row()) {
        params.sparq.enabled = true;
    }
}

template <size_t I> void common_sparq_set_bool(common_params & params, bool value) { common_sparq_set<I>(params, value); }

template <size_t I> void common_sparq_set_int(common_params & params, int value) { common_sparq_set<I>(params, value); }

// a number or an enum's name (std::invalid_argument naming the flag and what is allowed)
template <size_t I> void common_sparq_set_text(common_params & params, const std::string & value) {
    double v = 0.0;
    std::string allowed;
    if (!sparq_setting_parse(sparq_settings[I], value, v, allowed)) {
        const std::string & flag = sparq_spelling_of(I).flag;
        throw std::invalid_argument(sparq_settings[I].kind == SPARQ_KIND_ENUM ?
            flag + ": unknown value '" + value + "'; allowed: " + allowed :
            flag + ": '" + value + "' is not a number");
    }
    common_sparq_set<I>(params, v);
}

// row I's flag (--sparq-<name>, with --no-sparq-<name> for a bool) and its environment variable
template <size_t I, typename AddOpt> void common_sparq_add_arg(AddOpt & add_opt, const common_params & params) {
    const sparq_setting & s = sparq_settings[I];
    if (!(s.shown & SPARQ_IN_FLAGS)) {
        return;
    }
    const sparq_spelling & sp = sparq_spelling_of(I);
    const std::string help = std::string(I == sparq_enabled_row() ? "" : "SparQ: ") + s.help + " (default: " +
                             sparq_setting_text(params.sparq, s, true) + ")";
    switch (s.kind) {
        case SPARQ_KIND_BOOL:
            add_opt(common_arg({ sp.flag.c_str() }, { sp.no_flag.c_str() }, help, common_sparq_set_bool<I>)
                        .set_env(sp.env.c_str()));
            break;
        case SPARQ_KIND_INT:
            add_opt(common_arg({ sp.flag.c_str() }, "N", help, common_sparq_set_int<I>).set_env(sp.env.c_str()));
            break;
        default:
            add_opt(common_arg({ sp.flag.c_str() }, s.kind == SPARQ_KIND_ENUM ? "NAME" : "F", help,
                               common_sparq_set_text<I>).set_env(sp.env.c_str()));
            break;
    }
}

template <typename AddOpt, size_t... I>
void common_sparq_add_rows(AddOpt & add_opt, const common_params & params, std::index_sequence<I...>) {
    (common_sparq_add_arg<I>(add_opt, params), ...);
}

// the --sparq* flags, one per row of llama-sparq-settings.def
template <typename AddOpt> void common_sparq_add_args(AddOpt && add_opt, const common_params & params) {
    common_sparq_add_rows(add_opt, params, std::make_index_sequence<sparq_n_settings>{});
}
