// llama-sparq: the settings' table (include/llama-sparq-settings.def) for the tools: one
// descriptor per row (its field, kind, help and front ends), the spellings every front end
// derives from a field's name, and a setting's value read, written, parsed and printed, so that
// the common flags, llama-bench and llama-server loop over the rows instead of naming them.
#pragma once

#include "llama-sparq.h"
#include "sparq-names.h"

#include <cctype>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

// the front ends of a row's `shown` column
enum sparq_shown : unsigned {
    SPARQ_IN_FLAGS        = 1u << 0, // the common flags (llama-cli, llama-completion, llama-server, ...)
    SPARQ_IN_BENCH        = 1u << 1, // a llama-bench list and column
    SPARQ_IN_PROPS        = 1u << 2, // llama-server's /props
    SPARQ_IN_METRICS      = 1u << 3, // llama-server's /metrics
    SPARQ_IN_PYTHON       = 1u << 4, // Llama's keyword and the Python server (read by bindings/settings.py)
    SPARQ_IN_ALL          = (1u << 5) - 1,
    SPARQ_BENCH_MD_ALWAYS = 1u << 5, // a column of llama-bench's markdown table whenever SparQ is swept
};

enum sparq_kind { SPARQ_KIND_BOOL, SPARQ_KIND_INT, SPARQ_KIND_FLOAT, SPARQ_KIND_ENUM };

struct sparq_setting {
    const char *  name;             // the field of struct llama_sparq_params
    sparq_kind    kind;
    size_t        offset;
    const char * (*names)(int32_t); // an enum's names (the C API's function), else nullptr
    const char *  help;
    unsigned      shown;            // sparq_shown
};

template <typename T> constexpr sparq_kind sparq_kind_of(const char * (*names)(int32_t)) {
    static_assert(std::is_same<T, bool>::value || std::is_same<T, int32_t>::value || std::is_same<T, float>::value,
                  "a setting is bool, int32_t or float (llama-sparq-settings.def)");
    return names ? SPARQ_KIND_ENUM :
           std::is_same<T, bool>::value ? SPARQ_KIND_BOOL :
           std::is_same<T, float>::value ? SPARQ_KIND_FLOAT : SPARQ_KIND_INT;
}

// the rows (the ranges are the library's to check: only an enum's names are kept here)
#define SPARQ_ANY                    nullptr
#define SPARQ_INTS(lo, hi)           nullptr
#define SPARQ_INTS_TO(lo, bound, hi) nullptr
#define SPARQ_SHARE                  nullptr
#define SPARQ_VALUES(...)            nullptr
#define SPARQ_NAMES(names)           names
#define LLAMA_SPARQ_SETTING(type, name, dflt, range, alt, help, shown)                                \
    { #name, sparq_kind_of<type>(range), offsetof(llama_sparq_params, name), range, help, shown },
static constexpr sparq_setting sparq_settings[] = {
#include "llama-sparq-settings.def"
};

static constexpr size_t sparq_n_settings = sizeof(sparq_settings) / sizeof(sparq_settings[0]);

// a row's names in the front ends: key "sparq_k" (Python's keyword, llama-bench's column), flag
// "--sparq-k" and "--no-sparq-k" (bools), environment LLAMA_ARG_SPARQ_K; `enabled` is plain sparq
struct sparq_spelling {
    std::string key, flag, no_flag, env;
};

// the spellings of row i, made once (the common flags keep pointers to them)
inline const sparq_spelling & sparq_spelling_of(size_t i) {
    static const auto all = [] {
        static sparq_spelling s[sparq_n_settings];
        for (size_t j = 0; j < sparq_n_settings; ++j) {
            const std::string name = sparq_settings[j].name;
            s[j].key = name == "enabled" ? std::string("sparq") : "sparq_" + name;
            s[j].flag = "--" + s[j].key;
            for (char & c : s[j].flag) {
                c = c == '_' ? '-' : c;
            }
            s[j].no_flag = "--no-" + s[j].flag.substr(2);
            s[j].env = "LLAMA_ARG_" + s[j].key;
            for (char & c : s[j].env) {
                c = (char) toupper((unsigned char) c);
            }
        }
        return s;
    }();
    return all[i];
}

// the row whose flag is `flag`, or -1
inline int sparq_setting_by_flag(const std::string & flag) {
    for (size_t i = 0; i < sparq_n_settings; ++i) {
        if (sparq_spelling_of(i).flag == flag) {
            return (int) i;
        }
    }
    return -1;
}

inline size_t sparq_enabled_row() {
    for (size_t i = 0; i < sparq_n_settings; ++i) {
        if (sparq_settings[i].offset == offsetof(llama_sparq_params, enabled)) {
            return i;
        }
    }
    return sparq_n_settings;
}

inline double sparq_setting_get(const llama_sparq_params & p, const sparq_setting & s) {
    const char * at = (const char *) &p + s.offset;
    switch (s.kind) {
        case SPARQ_KIND_BOOL:  { bool v;    memcpy(&v, at, sizeof(v)); return v ? 1.0 : 0.0; }
        case SPARQ_KIND_FLOAT: { float v;   memcpy(&v, at, sizeof(v)); return v; }
        default:               { int32_t v; memcpy(&v, at, sizeof(v)); return v; }
    }
}

inline void sparq_setting_set(llama_sparq_params & p, const sparq_setting & s, double value) {
    char * at = (char *) &p + s.offset;
    switch (s.kind) {
        case SPARQ_KIND_BOOL:  { const bool v = value != 0.0;     memcpy(at, &v, sizeof(v)); break; }
        case SPARQ_KIND_FLOAT: { const float v = (float) value;   memcpy(at, &v, sizeof(v)); break; }
        default:               { const int32_t v = (int32_t) value; memcpy(at, &v, sizeof(v)); break; }
    }
}

// a value as the front ends print it: an enum by name, a bool as 0 / 1 (bool_words: off / on)
inline std::string sparq_setting_text(const llama_sparq_params & p, const sparq_setting & s, bool bool_words = false) {
    const double v = sparq_setting_get(p, s);
    switch (s.kind) {
        case SPARQ_KIND_BOOL: return bool_words ? (v != 0.0 ? "on" : "off") : (v != 0.0 ? "1" : "0");
        case SPARQ_KIND_ENUM: {
            const char * n = s.names((int32_t) v);
            return n ? n : std::to_string((int32_t) v);
        }
        case SPARQ_KIND_FLOAT: {
            char buf[32];
            snprintf(buf, sizeof(buf), "%g", v);
            return buf;
        }
        default: return std::to_string((int32_t) v);
    }
}

// one value of row s from text: an enum's name, an integer that fits int32_t, a number, a bool as
// 0 or 1. False with what is allowed in `allowed` (the ranges are the library's to check)
inline bool sparq_setting_parse(const sparq_setting & s, const std::string & text, double & out, std::string & allowed) {
    if (s.kind == SPARQ_KIND_ENUM) {
        const int32_t i = sparq_enum_from_name(text, s.names, allowed);
        out = i;
        return i >= 0;
    }
    char * end = nullptr;
    errno = 0;
    const double v = s.kind == SPARQ_KIND_FLOAT ? strtod(text.c_str(), &end) : (double) strtoll(text.c_str(), &end, 10);
    const bool whole = !text.empty() && end && *end == '\0' && errno == 0;
    switch (s.kind) {
        case SPARQ_KIND_BOOL:  allowed = "0 or 1";   break;
        case SPARQ_KIND_FLOAT: allowed = "numbers";  break;
        default:               allowed = "integers"; break;
    }
    if (!whole || (s.kind == SPARQ_KIND_BOOL && v != 0.0 && v != 1.0) ||
        (s.kind == SPARQ_KIND_INT && (v < INT32_MIN || v > INT32_MAX))) {
        return false;
    }
    out = v;
    return true;
}
