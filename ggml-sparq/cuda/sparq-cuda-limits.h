// llama-sparq: the shapes the CUDA kernels of GGML_OP_SPARQ_ATTN take, shared by the kernels
// (sparq-cuda-common.cuh) and the host's support check (sparq-cuda-support.h).
#pragma once

// The largest head size and group size (n_head / n_head_kv) the CUDA kernels take (any k the op
// takes: the chosen cells live in a bitmap and a list in global scratch).
#define GGML_CUDA_SPARQ_D_MAX 256
#define GGML_CUDA_SPARQ_G_MAX 16
// The per-unit counters of the experimental one-launch path (k_sparq_fused): a persistent device
// buffer of this many zeroed unsigned ints per layer, which the glue keeps (sparq-cuda.cu); more
// units take three launches.
#define GGML_CUDA_SPARQ_TICKETS 4096
