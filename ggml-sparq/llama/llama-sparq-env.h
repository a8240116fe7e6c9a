// llama-sparq: the environment switches of libllama's SparQ code, read in one place
// (llama-sparq-env.cpp). They are for tests and comparisons; the defaults are the product's path.
// Every switch is on or off, parsed one way (sparq_env_flag): unset, "", "0", "false" and "off"
// are off; "1", "true" and "on" are on; any other value is said on stderr and taken as off, so a
// typo never turns a comparison path on without a word. LLAMA_SPARQ_CUDA_REPORT, whose comparison
// path is off, is the one switch on by default.
#pragma once

struct sparq_env {
    // LLAMA_SPARQ_GRAPH_REBUILD: a stream rebuild runs as a ggml graph on the backend of the
    // device holding the cache (llama-sparq-rebuild-device.cpp) also when the cache is in host
    // memory (the CPU backend), so that the tests check that path on machines without a GPU.
    // With a GPU the graph rebuild runs anyway.
    bool graph_rebuild = false;
    // LLAMA_SPARQ_HOST_REBUILD: stream rebuilds always take the host path
    // (llama-sparq-rebuild-host.cpp), never the device graph, for comparisons.
    bool host_rebuild = false;
    // LLAMA_SPARQ_HOST_WINDOW: the op's local window is always the graph's input, written by the host
    // at every step, never the device window the decode step's appends keep (for comparisons).
    bool host_window = false;
    // LLAMA_SPARQ_NO_DIFFUSE_SKIP: the calibrated k never runs a diffuse layer's dense stretch
    // (LLAMA_SPARQ_DENSE_DIFFUSE): every step runs the op, which attends densely where it must
    // (for comparisons and tests of the op's own dense rows). Note the inversion: the switch on
    // means diffuse_skip false.
    bool diffuse_skip = true;
    // LLAMA_SPARQ_SHORT_APPENDS: a graph appends to K^T and the sums however far the context is under
    // the dense threshold (sparq_append_floor 0), as a context over it does, and in a context that runs
    // dense at every step (sparq_dense_always), for comparisons: without it a context well under min_kv
    // builds none of SparQ's nodes and is rebuilt once near it, and one always dense builds none.
    bool short_appends = false;
    // LLAMA_SPARQ_CUDA_REPORT: on by default (unset or empty); 0, false or off turns it off. On, a
    // layer whose cache is on a GPU gets its report in page-locked host memory, which the CUDA op
    // copies its report into, so that the calibrated k's diffuse stretches (upstream's flash
    // attention) follow the GPU's choices; off, the GPU op reports nothing and no stretch starts
    // there (a GPU session's A/B without a rebuild). Another value is said on stderr and taken as on.
    bool cuda_report = true;
};

// The switch `name` from the environment: false when unset or "", "0", "false", "off"; true for
// "1", "true", "on" (lower case); any other value: a line on stderr naming the variable, its
// value and the accepted values, then false.
bool sparq_env_flag(const char * name);

// The switches as the environment holds them now. Called once per context, when its SparQ state
// is made (llama-sparq-api.cpp), and kept in llama_sparq_ctx::env: a process may change them
// between contexts (tests/test_cuda.py sets LLAMA_SPARQ_GRAPH_REBUILD for one context and unsets
// it for the next), never under a running one. Each switch that is on is logged (info), so that a
// run's log says when it took a comparison path.
sparq_env sparq_env_read();
