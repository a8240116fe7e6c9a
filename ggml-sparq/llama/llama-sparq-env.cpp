// llama-sparq: reads the environment switches (llama-sparq-env.h says what each does).
#include "llama-sparq-env.h"

#include <cstdlib>

sparq_env sparq_env_read() {
    sparq_env e;
    const char * gr = getenv("LLAMA_SPARQ_GRAPH_REBUILD");
    e.graph_rebuild = gr && atoi(gr) != 0;
    e.host_rebuild = getenv("LLAMA_SPARQ_HOST_REBUILD") != nullptr;
    e.diffuse_skip = getenv("LLAMA_SPARQ_NO_DIFFUSE_SKIP") == nullptr;
    return e;
}
