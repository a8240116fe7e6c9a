// llama-sparq: GGML_OP_SPARQ_ATTN on ggml's CUDA backend (the glue is sparq-cuda.cu, the kernels sparq-cuda-kernels.cuh).
// Included by ggml-cuda.cu (patch 0010) next to upstream's op headers; compiled into ggml-cuda
// only when the build has CUDA (ggml-sparq/CMakeLists.txt).
#pragma once

#include "common.cuh"

// Runs the op on ctx's stream: no host synchronisation, scratch from ctx's pool, the same
// kernels for every call of a shape (CUDA-graph capture of decode steps works).
void ggml_cuda_sparq_attn(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

// Whether the kernels cover this node; false makes the scheduler run it on the CPU.
bool ggml_cuda_sparq_attn_supported(int device, const ggml_tensor * op);

