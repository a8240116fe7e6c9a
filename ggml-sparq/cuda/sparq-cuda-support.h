// llama-sparq: which GGML_OP_SPARQ_ATTN nodes the CUDA kernels run, as host code alone (no CUDA
// headers), so that a test without a GPU checks the same decision ggml-cuda's supports_op makes.
// Included by sparq-cuda.cu and tests/native/sparq-op-test.cpp.
#pragma once

#include "ggml.h"
#include "ggml-sparq.h"
#include "sparq-cuda-limits.h"

#include <cstdint>

// The parts of the op the CUDA kernels honour, besides the selectors' own bits. The rest are refused
// (the scheduler then runs the node on the CPU): the dense flag (on a GPU upstream's flash attention
// is the dense path) and a coverage only measured (the fixed k's guard, which the graph sets only
// where the op runs on the host). The report is honoured: the kernels write it on the device and
// the launch queues its copy into the host's page-locked report. The step's append in the op is
// refused: on a device the graph keeps the append nodes (the write modes' kernels).
static constexpr uint32_t SPARQ_CUDA_HONOURS_PARTS = GGML_SPARQ_FEAT_PER_HEAD | GGML_SPARQ_FEAT_NO_MEAN_V |
                                                     GGML_SPARQ_FEAT_WINDOW | GGML_SPARQ_FEAT_BASIS |
                                                     GGML_SPARQ_FEAT_COVERAGE | GGML_SPARQ_FEAT_COVERAGE_CAP |
                                                     GGML_SPARQ_FEAT_REPORT | GGML_SPARQ_FEAT_TOPK_BUCKETS |
                                                     GGML_SPARQ_FEAT_SOFTCAP | GGML_SPARQ_FEAT_ALIBI |
                                                     GGML_SPARQ_FEAT_SINKS | GGML_SPARQ_FEAT_KQ_BIAS;
static constexpr uint32_t SPARQ_CUDA_REFUSES_PARTS = GGML_SPARQ_FEAT_DENSE | GGML_SPARQ_FEAT_COVERAGE_MEASURE |
                                                     GGML_SPARQ_FEAT_APPEND | GGML_SPARQ_FEAT_COMP_SQ;
static_assert((SPARQ_CUDA_HONOURS_PARTS | SPARQ_CUDA_REFUSES_PARTS | GGML_SPARQ_FEAT_SELECTORS) == GGML_SPARQ_FEAT_ALL &&
              ((SPARQ_CUDA_HONOURS_PARTS | SPARQ_CUDA_REFUSES_PARTS) & GGML_SPARQ_FEAT_SELECTORS) == 0 &&
              (SPARQ_CUDA_HONOURS_PARTS & SPARQ_CUDA_REFUSES_PARTS) == 0,
              "a new part of the op: decide whether the CUDA kernels honour it or refuse it");

// The kernels are the ranking pipeline (steps 1-3 on approximate scores, or exact ones with every
// component): they run the selectors whose row says they rank scores, and none of the others' bits.
static inline uint32_t sparq_cuda_honours() {
    static const uint32_t honours = [] {
        uint32_t h = SPARQ_CUDA_HONOURS_PARTS;
        for (int32_t id = 0; id < GGML_SPARQ_SEL_COUNT; ++id) {
            const ggml_sparq_selector_info * sel = ggml_sparq_selector_row(id);
            h |= sel->ranks ? sel->feature : 0u;
        }
        return h;
    }();
    return honours;
}

static inline bool sparq_cu_type_ok(const ggml_tensor * t) {
    return t->type == GGML_TYPE_F16 || t->type == GGML_TYPE_F32;
}

// an attention node: NULL when the kernels cover its shapes and types, else why not
static inline const char * sparq_cuda_attn_unsupported(const ggml_tensor * op, const ggml_sparq_params & p) {
    const ggml_tensor * q = op->src[0];
    const ggml_tensor * k = op->src[1];
    const ggml_tensor * kt = op->src[2];
    const ggml_tensor * v = op->src[3];
    const ggml_tensor * mk = op->src[6];
    if (q->type != GGML_TYPE_F32 || op->type != GGML_TYPE_F32) {
        return "q and the result must be f32";
    }
    if (!sparq_cu_type_ok(k) || !(sparq_cu_type_ok(kt) || kt->type == GGML_TYPE_I8 || kt->type == GGML_TYPE_Q4_1) ||
        !sparq_cu_type_ok(v)) {
        return "K and V must be f16 or f32, K^T f16, f32, i8 (e5m2) or q4_1 (4-bit)";
    }
    if (mk && mk->type != GGML_TYPE_F16 && mk->type != GGML_TYPE_F32) {
        return "the mask must be f16 or f32";
    }
    if (q->ne[0] > GGML_CUDA_SPARQ_D_MAX || v->ne[0] > GGML_CUDA_SPARQ_D_MAX) {
        return "head sizes above 256";
    }
    const int64_t g = q->ne[2] / k->ne[2];
    if (g > GGML_CUDA_SPARQ_G_MAX) {
        return "more than 16 query heads per KV head";
    }
    const int64_t ph = (p.attn.flags & GGML_SPARQ_FLAG_PER_HEAD) && g > 1 ? g : 1;
    const int64_t U = q->ne[1] * q->ne[3] * k->ne[2];
    if (U > 65535 || U * ph > 65535) {
        return "more than 65535 (query row, KV head) pairs";
    }
    if (k->ne[1] >= (int64_t) 1 << 30) {
        return "2^30 or more KV cells";
    }
    const ggml_tensor * qs = op->src[8];
    const ggml_tensor * cw = op->src[9];
    if ((qs && qs->type != GGML_TYPE_F32) || (cw && cw->type != GGML_TYPE_F32)) {
        return "q_sel and comp_w must be f32";
    }
    const ggml_tensor * win = op->src[7];
    if (win && win->type != GGML_TYPE_I32) {
        return "the window must be i32";
    }
    return nullptr;
}

// NULL when the kernels cover the node (of any mode), else why not
static inline const char * sparq_cuda_why_not(const ggml_tensor * op) {
    if (const char * why = ggml_sparq_params_unsupported(op, sparq_cuda_honours())) {
        return why;
    }
    const ggml_sparq_params p = ggml_sparq_params_get(op);
    switch (p.mode) {
        case GGML_SPARQ_MODE_KT_APPEND: {
            const ggml_tensor * src = op->src[1];
            const ggml_tensor * idx = op->src[2];
            if (op->src[0]->type != GGML_TYPE_I8 || !sparq_cu_type_ok(src) || !ggml_is_contiguous(src) ||
                (idx && idx->type != GGML_TYPE_I64)) {
                return "the K^T append: i8 rows from f32 or f16, i64 indices";
            }
            return nullptr;
        }
        case GGML_SPARQ_MODE_CELL_SCATTER: {
            const ggml_tensor * d = op->src[0];
            if ((d->type != GGML_TYPE_F32 && d->type != GGML_TYPE_F16 && d->type != GGML_TYPE_I8 &&
                 d->type != GGML_TYPE_Q4_1) ||
                !sparq_cu_type_ok(op->src[1]) || !ggml_is_contiguous(op->src[1]) || op->src[2]->type != GGML_TYPE_I64) {
                return "the cell scatter: f32, f16, i8 or q4_1 (4-bit K^T) cells from f32 or f16 values, i64 indices";
            }
            if (op->src[3] && (op->src[3]->type != GGML_TYPE_I32 || !ggml_is_contiguous(op->src[3]) ||
                               op->src[3]->ne[0] > INT32_MAX)) {
                return "the cell scatter's window: contiguous i32";
            }
            return nullptr;
        }
        case GGML_SPARQ_MODE_SUM_APPEND:
            if (p.sum.type != GGML_TYPE_F16 && p.sum.type != GGML_TYPE_F32) {
                return "a sum's append: f16 or f32 caches";
            }
            return nullptr;
        default:
            return sparq_cuda_attn_unsupported(op, p);
    }
}
