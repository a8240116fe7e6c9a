// llama-sparq: SparQ's own transfers between the host and a backend's memory, and its
// synchronisations. Every one goes through these, so that llama_sparq_debug_graph_io counts them
// (a decode step must make none; on a GPU each is a copy or a wait of the host). Process-wide.
#pragma once

#include "ggml-backend.h"
#include "llama.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

extern std::atomic<uint64_t> sparq_n_transfers; // (llama-sparq-debug.cpp)

inline void sparq_tensor_get(const ggml_tensor * t, void * data, size_t off, size_t n) {
    sparq_n_transfers++;
    ggml_backend_tensor_get(t, data, off, n);
}
inline void sparq_tensor_set(ggml_tensor * t, const void * data, size_t off, size_t n) {
    sparq_n_transfers++;
    ggml_backend_tensor_set(t, data, off, n);
}
inline void sparq_tensor_memset(ggml_tensor * t, uint8_t value, size_t off, size_t n) {
    sparq_n_transfers++;
    ggml_backend_tensor_memset(t, value, off, n);
}
inline void sparq_backend_sync(ggml_backend_t backend) {
    sparq_n_transfers++;
    ggml_backend_synchronize(backend);
}
inline void sparq_llama_sync(llama_context * ctx) {
    sparq_n_transfers++;
    llama_synchronize(ctx);
}

// bytes [off, off + n) of a tensor, on the host
inline std::vector<uint8_t> sparq_get_slice(const ggml_tensor * t, size_t off, size_t n) {
    std::vector<uint8_t> buf(n);
    sparq_tensor_get(t, buf.data(), off, n);
    return buf;
}
