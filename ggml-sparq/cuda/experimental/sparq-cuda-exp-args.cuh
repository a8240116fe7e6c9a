// llama-sparq, experimental build only (SPARQ_CUDA_EXPERIMENTAL): what the variants' kernels read
// beside the op's arguments, set per launch by sparq_cu_run (sparq-cuda-exp-launch.cuh) from the
// LLAMA_SPARQ_CUDA_* switches. The default kernels take the sparq_cu_args part.
#pragma once

#include "sparq-cuda-common.cuh"

struct sparq_exp_args : sparq_cu_args {
    int force_radix; // LLAMA_SPARQ_CUDA_SELECT=radix: a list's crossing bin takes radix passes over the
                     // list even where its cells fit in shared memory
    int hist_atomic; // LLAMA_SPARQ_CUDA_SELECT_HIST=atomic: a select tile's histogram by one
                     // shared-memory add per cell, no warp vote first
    int keys_early;  // LLAMA_SPARQ_CUDA_SELECT_LOADS=early: a select tile's key loads issued before
                     // its context's loads and scans
    // LLAMA_SPARQ_CUDA_DIFFUSE: the attend's all-cells units streamed, with 16-byte K and V loads where
    // kv_vec (rows aligned, d and dv multiples of the width); a list's chosen cells then take at most
    // parts_k of the launch's parts, the rest record an empty partial
    int kv_vec;
    int parts_k;
    // LLAMA_SPARQ_CUDA_FUSED: the whole op in one launch (k_sparq_fused, where a.tickets is set): the
    // rows and the window bitmaps are then per unit ([U], [U][W]: each unit's last block describes
    // its own row, since no block waits for another unit's)
    int fused;
};
