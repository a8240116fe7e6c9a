// llama-sparq: the messages every part of libllama's SparQ code writes: an error into the caller's
// buffer, and the names and phrases of the reasons a call runs dense (the C API's names, the log).
#pragma once

#include "llama-sparq.h"

#include <cstdarg>
#include <cstddef>
#include <cstdio>

// printf into err (up to n bytes; nothing when err is NULL or n is 0)
inline void sparq_err(char * err, size_t n, const char * fmt, ...) {
    if (!err || n == 0) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
}

// llama_sparq_dense_reason_name's names, by LLAMA_SPARQ_DENSE_* value
inline constexpr const char * sparq_reason_names[LLAMA_SPARQ_DENSE_COUNT] = {
    "prefill", "short", "swa", "cache_type", "v_trans", "shared_stream", "attn_variant", "no_cache",
};

// for the log: why a call ran dense
inline constexpr const char * sparq_reason_text[LLAMA_SPARQ_DENSE_COUNT] = {
    "several query rows per sequence (prompt processing)",
    "fewer KV cells than the dense threshold",
    "sliding-window layer",
    "K or V cache of a type SparQ does not read (it reads f16, f32, q8_0, q4_0, q4_1, q5_0, q5_1 and iq4_nl)",
    "V cache is transposed (make the context with flash attention on or auto)",
    "several sequences share one KV stream (unified KV cache; use one stream per sequence)",
    "an attention variant the op does not compute (a bad soft-cap, Grok scale, ALiBi, sinks or KQ bias value)",
    "attention without the KV cache",
};
