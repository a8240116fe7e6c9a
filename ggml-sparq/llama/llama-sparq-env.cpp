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
    e.host_window = sparq_env_flag("LLAMA_SPARQ_HOST_WINDOW");
    e.diffuse_skip = !sparq_env_flag("LLAMA_SPARQ_NO_DIFFUSE_SKIP");
    e.short_appends = sparq_env_flag("LLAMA_SPARQ_SHORT_APPENDS");
    // on unless said off (the product's path): a typo keeps it on, with a word
    const char * cr = getenv("LLAMA_SPARQ_CUDA_REPORT");
    if (cr && *cr) {
        e.cuda_report = strcmp(cr, "0") != 0 && strcmp(cr, "false") != 0 && strcmp(cr, "off") != 0;
        if (e.cuda_report && strcmp(cr, "1") != 0 && strcmp(cr, "true") != 0 && strcmp(cr, "on") != 0) {
            fprintf(stderr, "llama_sparq: LLAMA_SPARQ_CUDA_REPORT=%s is not a switch value: use 0, false or off "
                            "(or 1, true, on, empty or unset for on); taken as on\n", cr);
        }
    }
    if (e.graph_rebuild) {
        LLAMA_LOG_INFO("llama_sparq: LLAMA_SPARQ_GRAPH_REBUILD on: stream rebuilds as a ggml graph, host memory too\n");
    }
    if (e.host_rebuild) {
        LLAMA_LOG_INFO("llama_sparq: LLAMA_SPARQ_HOST_REBUILD on: stream rebuilds on the host only\n");
    }
    if (e.host_window) {
        LLAMA_LOG_INFO("llama_sparq: LLAMA_SPARQ_HOST_WINDOW on: the local window uploaded by the host at every step\n");
    }
    if (!e.diffuse_skip) {
        LLAMA_LOG_INFO("llama_sparq: LLAMA_SPARQ_NO_DIFFUSE_SKIP on: no dense stretches for diffuse layers\n");
    }
    if (e.short_appends) {
        LLAMA_LOG_INFO("llama_sparq: LLAMA_SPARQ_SHORT_APPENDS on: the appends run under the dense threshold and in always dense contexts too\n");
    }
    if (!e.cuda_report) {
        LLAMA_LOG_INFO("llama_sparq: LLAMA_SPARQ_CUDA_REPORT off: no report from a GPU's op, no diffuse stretch there\n");
    }
    return e;
}
