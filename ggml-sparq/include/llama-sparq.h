// llama-sparq: the fork's C API beyond upstream llama.h.
#pragma once

#include "llama.h"

#ifdef __cplusplus
extern "C" {
#endif

// Bumped whenever a struct or function of this header changes incompatibly.
// The Python package refuses a library whose ABI differs from its own.
#define LLAMA_SPARQ_ABI_VERSION 1

// "llama-sparq <version> abi <n> llama.cpp <commit>" (declared in llama.h by patch 0001)
// LLAMA_API const char * llama_sparq_version(void);

// The ABI number alone.
LLAMA_API int llama_sparq_abi_version(void);

#ifdef __cplusplus
}
#endif
