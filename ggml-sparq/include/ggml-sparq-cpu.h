// llama-sparq: the CPU backend's entry points for GGML_OP_SPARQ_ATTN.
// Included by ggml-cpu.c (patch 0002); defined in ggml-sparq/cpu/ggml-sparq-cpu.cpp.
#pragma once

#include "ggml.h"

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_compute_params;

// Whether the CPU op runs this node: every part of the op but those of another build's layout
// (ggml-sparq-params.h). ggml-cpu.cpp's supports_op asks it (patch 0002).
bool ggml_sparq_cpu_supports_op(const struct ggml_tensor * op);

// Bytes of ggml's work buffer the op needs with n_tasks threads.
size_t ggml_sparq_attn_work_size(const struct ggml_tensor * node, int n_tasks);

void ggml_compute_forward_sparq_attn(const struct ggml_compute_params * params, struct ggml_tensor * dst);

#ifdef __cplusplus
}
#endif
