// llama-sparq: GGML_OP_SPARQ_ATTN on ggml's CUDA backend (the kernels are in sparq-cuda.cu).
// Included by ggml-cuda.cu (patch 0010) next to upstream's op headers; compiled into ggml-cuda
// only when the build has CUDA (ggml-sparq/CMakeLists.txt).
#pragma once

#include "common.cuh"

// Runs the op on ctx's stream: no host synchronisation, scratch from ctx's pool, the same
// kernels for every call of a shape (CUDA-graph capture of decode steps works).
void ggml_cuda_sparq_attn(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

// Whether the kernels cover this node; false makes the scheduler run it on the CPU.
bool ggml_cuda_sparq_attn_supported(int device, const ggml_tensor * op);

// The largest k, head size and group size (n_head / n_head_kv) the CUDA kernels take.
#define GGML_CUDA_SPARQ_K_MAX 16384
#define GGML_CUDA_SPARQ_D_MAX 256
#define GGML_CUDA_SPARQ_G_MAX 16
