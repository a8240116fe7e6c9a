// llama-sparq: the CUDA kernels of GGML_OP_SPARQ_ATTN and their launch sequence (see sparq-cuda.cu
// for the stages). Included by sparq-cuda.cu (nvcc, with ggml's common.cuh) and by
// tests/native/sparq-cuda-emu.cpp, which runs these same kernels on the CPU (one thread per CUDA
// thread) against the CPU op. The includer provides: half, half2, uint2, uint4, float2, float4,
// dim3, make_float2, the warp intrinsics, warp_reduce_sum/max, the atomics, and
//   SPARQ_LAUNCH(kernel, grid, block, stream, args...), SPARQ_MEMSET(ptr, bytes, stream),
//   sparq_stream_t.
// The headers (each includable on its own, after the includer's names):
//   sparq-cuda-common.cuh  limits, structs, loads, mask lookups, block scan and reductions
//   sparq-cuda-score.cuh   stages 1-4: rows, components, approximate scores, group keys
//   sparq-cuda-select.cuh  stages 5-6: radix select, collect into the unit's bitmap
//   sparq-cuda-attend.cuh  stage 7: exact attention and the mean-V mix (every selector)
//   sparq-cuda-launch.cuh  the launch sequence, sparq_cu_run
#pragma once

// in stage order
#include "sparq-cuda-common.cuh"
#include "sparq-cuda-score.cuh"
#include "sparq-cuda-select.cuh"
#include "sparq-cuda-attend.cuh"
#include "sparq-cuda-launch.cuh"
