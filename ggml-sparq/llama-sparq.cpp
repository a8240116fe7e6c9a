// llama-sparq: the fork's additions to libllama.

#include "llama-sparq.h"
#include "llama-sparq-version.h"

const char * llama_sparq_version(void) {
    return "llama-sparq " LLAMA_SPARQ_VERSION_STR " abi " LLAMA_SPARQ_ABI_STR " llama.cpp " LLAMA_SPARQ_UPSTREAM_COMMIT_STR;
}

int llama_sparq_abi_version(void) {
    static_assert(LLAMA_SPARQ_ABI_VERSION == LLAMA_SPARQ_ABI_NUM, "llama-sparq.h and CMakeLists.txt disagree on the ABI");
    return LLAMA_SPARQ_ABI_VERSION;
}
