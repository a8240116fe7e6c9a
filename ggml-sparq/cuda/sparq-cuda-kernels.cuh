// llama-sparq: the CUDA kernels of GGML_OP_SPARQ_ATTN and their launch sequence (see sparq-cuda.cu
// for the kernels). Included by sparq-cuda.cu (nvcc, with ggml's common.cuh) and by
// tests/native/sparq-cuda-emu.cpp, which runs these same kernels on the CPU (one thread per CUDA
// thread) against the CPU op. The includer provides: half, half2, uint2, uint4, float2, float4,
// dim3, make_float2, the warp intrinsics (shuffles, ballot, match_any), warp_reduce_sum/max, the
// atomics, __threadfence, __ldcg, __uint_as_float, ggml_cuda_pdl_sync / ggml_cuda_pdl_lc (a
// programmatic dependent launch's wait for its predecessor and its go-ahead to its successor; no-ops
// elsewhere), and
//   SPARQ_LAUNCH(kernel, grid, block, stream, args...), SPARQ_LAUNCH_PDL (the same as a programmatic
//   dependent launch where the device has them, else an ordinary one; the experimental build's),
//   sparq_stream_t.
// The headers (each includable on its own, after the includer's names):
//   sparq-cuda-common.cuh       limits, structs, loads, mask lookups, block scans and reductions
//   sparq-cuda-topk.cuh         the exact k-selection primitive: a histogram's crossing of a target
//   sparq-cuda-score.cuh        kernel 1: components, valid cells, approximate scores
//   sparq-cuda-select.cuh       kernel 2's list side: a list's context, its passes, the ranking
//   sparq-cuda-select-list.cuh  kernel 2's list side: each list's choice into the unit's bitmap
//   sparq-cuda-select-tile.cuh  kernel 2: the tiles' keys, histograms and candidates, the hand-over
//   sparq-cuda-attend-items.cuh kernel 3: exact attention over a unit's items
//   sparq-cuda-attend.cuh       kernel 3: the mean-V mix and the output, the kernels
//   sparq-cuda-launch.cuh       the launch sequence of the default pipeline, sparq_pipeline_run
//   experimental/               the variants no GPU has timed yet (only with SPARQ_CUDA_EXPERIMENTAL)
// The op's entry points: sparq_cu_scratch_sizes(a) and sparq_cu_run(a, cpt, kt, k_f16, v_f16, stream).
#pragma once

// in kernel order
#include "sparq-cuda-common.cuh"
#include "sparq-cuda-topk.cuh"
#include "sparq-cuda-score.cuh"
#include "sparq-cuda-select.cuh"
#include "sparq-cuda-select-list.cuh"
#include "sparq-cuda-select-tile.cuh"
#include "sparq-cuda-attend-items.cuh"
#include "sparq-cuda-attend.cuh"
#include "sparq-cuda-launch.cuh"

#ifdef SPARQ_CUDA_EXPERIMENTAL
// the variants and their switches, over the default pipeline (defines the entry points)
#include "experimental/sparq-cuda-exp-launch.cuh"
#else
static sparq_cu_scratch sparq_cu_scratch_sizes(const sparq_cu_args & a) {
    return sparq_pipeline_sizes(a, sparq_attend_parts(a));
}

static void sparq_cu_run(const sparq_cu_args & a, int cpt, int kt, bool k_f16, bool v_f16, sparq_stream_t stream) {
    sparq_pipeline_run(a, cpt, kt, k_f16, v_f16, stream);
}
#endif
