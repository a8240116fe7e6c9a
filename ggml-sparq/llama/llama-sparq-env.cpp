// llama-sparq: reads the environment switches (llama-sparq-env.h says what each does).
#include "llama-sparq-env.h"

#include "llama-impl.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

bool sparq_env_flag(const char * name) {
    const char * v = getenv(name);
    if (!v) {
        return false;
    }
    for (const char * off : { "", "0", "false", "off" }) {
        if (strcmp(v, off) == 0) {
            return false;
        }
    }
    for (const char * on : { "1", "true", "on" }) {
        if (strcmp(v, on) == 0) {
            return true;
        }
    }
    // stderr, not the llama log: a caller that silences the log (Python's verbose=False) must
    // still learn that the switch it set was not taken
    fprintf(stderr, "llama_sparq: %s=%s is not a switch value: use 1, true or on (or 0, false, off, empty "
                    "or unset for off); taken as off\n", name, v);
    return false;
}

sparq_env sparq_env_read() {
    sparq_env e;
    e.graph_rebuild = sparq_env_flag("LLAMA_SPARQ_GRAPH_REBUILD");
    e.host_rebuild = sparq_env_flag("LLAMA_SPARQ_HOST_REBUILD");
    e.diffuse_skip = !sparq_env_flag("LLAMA_SPARQ_NO_DIFFUSE_SKIP");
    if (e.graph_rebuild) {
        LLAMA_LOG_INFO("llama_sparq: LLAMA_SPARQ_GRAPH_REBUILD on: stream rebuilds as a ggml graph, host memory too\n");
    }
    if (e.host_rebuild) {
        LLAMA_LOG_INFO("llama_sparq: LLAMA_SPARQ_HOST_REBUILD on: stream rebuilds on the host only\n");
    }
    if (!e.diffuse_skip) {
        LLAMA_LOG_INFO("llama_sparq: LLAMA_SPARQ_NO_DIFFUSE_SKIP on: no dense stretches for diffuse layers\n");
    }
    return e;
}
