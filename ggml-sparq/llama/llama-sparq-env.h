// llama-sparq: the environment switches of libllama's SparQ code, read in one place
// (llama-sparq-env.cpp). They are for tests and comparisons; the defaults are the product's path.
#pragma once

struct sparq_env {
    // LLAMA_SPARQ_GRAPH_REBUILD: a stream rebuild runs as a ggml graph on the backend of the
    // device holding the cache (llama-sparq-rebuild-device.cpp) also when the cache is in host
    // memory (the CPU backend), so that the tests check that path on machines without a GPU.
    // On when the value parses (atoi) to an integer other than 0: "1", "2", "-1", "1abc";
    // off when unset or "0", "", "abc". With a GPU the graph rebuild runs anyway.
    bool graph_rebuild = false;
    // LLAMA_SPARQ_HOST_REBUILD: stream rebuilds always take the host path
    // (llama-sparq-rebuild-host.cpp), never the device graph, for comparisons.
    // On when the variable is set at all, whatever its value ("1", "0" and "" alike); off when unset.
    bool host_rebuild = false;
    // LLAMA_SPARQ_NO_DIFFUSE_SKIP: the calibrated k never runs a diffuse layer's dense stretch
    // (LLAMA_SPARQ_DENSE_DIFFUSE): every step runs the op, which attends densely where it must
    // (for comparisons and tests of the op's own dense rows). On when set at all; off when unset.
    bool diffuse_skip = true;
};

// The switches as the environment holds them now. Called once per context, when its SparQ state
// is made (llama-sparq-api.cpp), and kept in llama_sparq_ctx::env: a process may change them
// between contexts (tests/test_cuda.py sets LLAMA_SPARQ_GRAPH_REBUILD for one context and unsets
// it for the next), never under a running one.
sparq_env sparq_env_read();
