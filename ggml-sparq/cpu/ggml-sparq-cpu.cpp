// llama-sparq: GGML_OP_SPARQ_ATTN on ggml's CPU backend: tensors -> sparq_args,
// ggml's work buffer as scratch, ggml's barrier between the kernel's phases.

#include "ggml-sparq-cpu.h"
#include "ggml-cpu-impl.h"
#include "ggml-cpu.h"
#include "sparq-cpu.h"
#include "ggml-sparq.h"

#include <algorithm>
#include <cstring>

// rows: K and V, which may also be in blocks (a quantized cache: ggml_sparq_cache_type_ok); kt: K^T,
// which may also be e5m2 (i8); the mask is f16 or f32
static enum sparq_type sparq_block_type_of(enum ggml_type t) {
    switch (t) {
        case GGML_TYPE_Q8_0:   return SPARQ_Q8_0;
        case GGML_TYPE_Q4_0:   return SPARQ_Q4_0;
        case GGML_TYPE_Q4_1:   return SPARQ_Q4_1;
        case GGML_TYPE_Q5_0:   return SPARQ_Q5_0;
        case GGML_TYPE_Q5_1:   return SPARQ_Q5_1;
        case GGML_TYPE_IQ4_NL: return SPARQ_IQ4_NL;
        default:               return SPARQ_F32; // (not a block type)
    }
}

static enum sparq_type sparq_type_of(const struct ggml_tensor * t, bool rows = false, bool kt = false) {
    switch (t->type) {
        case GGML_TYPE_F32: return SPARQ_F32;
        case GGML_TYPE_F16: return SPARQ_F16;
        case GGML_TYPE_I8:
            if (kt) {
                return SPARQ_E5M2;
            }
            GGML_ABORT("sparq_attn: tensor %s has type i8; only K^T may be i8 (e5m2)", t->name);
        default: {
            if (kt && t->type == GGML_TYPE_Q4_1) {
                return SPARQ_KT4; // a 4-bit K^T: q4_1 blocks along its rows (ggml-sparq-kt4.h)
            }
            const enum sparq_type b = sparq_block_type_of(t->type);
            if (rows && b != SPARQ_F32) {
                // the kernels' block layouts are ggml's (sparq-cpu.h, sparq-cpu-blocks.cpp)
                GGML_ASSERT(sparq_block_bytes(b) == ggml_type_size(t->type) && ggml_blck_size(t->type) == SPARQ_QK);
                return b;
            }
            GGML_ABORT("sparq_attn: tensor %s has type %s; %s expected", t->name, ggml_type_name(t->type),
                       rows ? "f16, f32, q8_0, q4_0, q4_1, q5_0, q5_1 or iq4_nl" : "f16 or f32");
        }
    }
}

// The parts of the op the CPU honours: all of them. A part added to ggml-sparq-params.h fails this
// until the CPU op is taught it (or refuses it here).
static constexpr uint32_t SPARQ_CPU_HONOURS = GGML_SPARQ_FEAT_ALL;
static_assert(GGML_SPARQ_FEAT_ALL == 0x1fffffu, "a new part of the op: make the CPU op honour it, then list it here");

// The CPU driver's selectors are the op's, in its order: checked once, by name, before the first node
static bool sparq_cpu_selectors_match() {
    static const bool match = [] {
        bool ok = sparq_cpu_selector_count() == GGML_SPARQ_SEL_COUNT;
        for (int32_t id = 0; ok && id < GGML_SPARQ_SEL_COUNT; ++id) {
            ok = strcmp(sparq_cpu_selector_name(id), ggml_sparq_selector_row(id)->name) == 0;
        }
        return ok;
    }();
    return match;
}

bool ggml_sparq_cpu_supports_op(const struct ggml_tensor * op) {
    return ggml_sparq_params_unsupported(op, SPARQ_CPU_HONOURS) == nullptr;
}

// the node's parameters; a node the CPU op cannot run aborts with the reason (the scheduler
// places no such node here: ggml_sparq_cpu_supports_op)
static struct ggml_sparq_params sparq_cpu_params(const struct ggml_tensor * dst) {
    GGML_ASSERT(sparq_cpu_selectors_match() && "sparq_attn: the CPU driver's selectors are not the op's, in its order");
    if (const char * why = ggml_sparq_params_unsupported(dst, SPARQ_CPU_HONOURS)) {
        GGML_ABORT("sparq_attn: the CPU op does not run %s: %s", dst->name, why);
    }
    return ggml_sparq_params_get(dst);
}

static struct sparq_args sparq_args_of(const struct ggml_tensor * dst) {
    sparq_cpu_params(dst); // (a node the CPU op cannot run aborts with the reason)
    struct ggml_sparq_attn_view w;
    GGML_ASSERT(ggml_sparq_attn_view_of(const_cast<struct ggml_tensor *>(dst), &w));
    const struct ggml_sparq_attn_params & P = w.p;
    struct sparq_args a;
    memset(&a, 0, sizeof(a));
    a.d = w.d;
    a.dv = w.dv;
    a.n_kv = w.n_kv;
    a.n_rows = w.n_rows;
    a.n_head = w.n_head;
    a.n_head_kv = w.n_head_kv;
    a.n_stream = w.n_stream;
    a.r = P.r;
    a.k = P.k;
    a.l = P.l;
    a.scale = P.scale;
    a.selector = P.selector;
    a.per_head = (P.flags & GGML_SPARQ_FLAG_PER_HEAD) != 0;
    a.no_mean_v = (P.flags & GGML_SPARQ_FLAG_NO_MEAN_V) != 0;
    a.all_dense = (P.flags & GGML_SPARQ_FLAG_DENSE) != 0;

    const struct ggml_tensor * q = w.q, * k = w.k, * kt = w.kt, * v = w.v, * vs = w.v_sum, * mk = w.mask;
    a.q = (const float *) q->data; a.q_nb1 = q->nb[1]; a.q_nb2 = q->nb[2]; a.q_nb3 = q->nb[3];
    a.K = k->data;   a.K_type = sparq_type_of(k, true);   a.K_nb1 = k->nb[1];   a.K_nb2 = k->nb[2];   a.K_nb3 = k->nb[3];
    a.KT = kt->data; a.KT_type = sparq_type_of(kt, false, true); a.KT_nb1 = kt->nb[1]; a.KT_nb2 = kt->nb[2]; a.KT_nb3 = kt->nb[3];
    a.V = v->data;   a.V_type = sparq_type_of(v, true);   a.V_nb1 = v->nb[1];   a.V_nb2 = v->nb[2];   a.V_nb3 = v->nb[3];
    a.v_sum = (const float *) vs->data; a.v_sum_nb1 = vs->nb[1]; a.v_sum_nb2 = vs->nb[2];
    a.v_count = (const float *) w.v_count->data;
    if (mk) {
        a.mask = mk->data; a.mask_type = sparq_type_of(mk); a.mask_nb1 = mk->nb[1]; a.mask_nb3 = mk->nb[3];
        a.mask_ne3 = (int) mk->ne[3];
    }
    a.out = (float *) w.out->data; a.out_nb1 = w.out->nb[1]; a.out_nb2 = w.out->nb[2]; a.out_nb3 = w.out->nb[3];
    if (const struct ggml_tensor * win = w.win) {
        a.win = (const int32_t *) win->data; a.win_nb1 = win->nb[1]; a.win_nb2 = win->nb[2]; a.win_n = (int) win->ne[0];
    }
    // a selector's own inputs and parameters, for its file to read (its row in the op says what it takes)
    for (int i = 0; i < 2; ++i) {
        if (const struct ggml_tensor * t = w.sel[i]) {
            a.sel_in[i] = { (float *) t->data, t->nb[1], t->nb[2], t->nb[3], (int) t->ne[1] };
        }
    }
    a.n_probe = P.n_probe;
    a.sel_reads = P.index_reads ? 1 : 0;
    if (const struct ggml_tensor * qs = w.q_sel) {
        a.q_sel = (const float *) qs->data; a.q_sel_nb1 = qs->nb[1]; a.q_sel_nb2 = qs->nb[2]; a.q_sel_nb3 = qs->nb[3];
    }
    if (const struct ggml_tensor * cw = w.comp_w) {
        a.comp_w = (const float *) cw->data; a.comp_w_nb1 = cw->nb[1]; a.comp_w_nb2 = cw->ne[2] > 1 ? cw->nb[2] : 0;
        a.comp_w_sq = w.comp_sq ? 1 : 0;
    }
    if (w.selector->ranks) {
        a.cov_p = P.cov_p;
        a.k_min = P.k_min;
        a.k_scan = P.k_scan;
        a.cov_apply = P.cov_apply ? 1 : 0;
        a.k_frac = P.cov_apply ? P.k_frac : 0.0f;
        a.topk_buckets = P.topk_buckets;
    }
    if (const struct ggml_tensor * c = w.cells) {
        // the step's append, in the driver's first phase (the cells checked here, where ggml names them)
        a.cells = (const int64_t *) c->data;
        a.kv_size = (int64_t) (kt->nb[1] / kt->nb[0]) * ggml_blck_size(kt->type); // (a 4-bit K^T: blocks of cells)
        for (int s = 0; s < a.n_stream; ++s) {
            GGML_ASSERT(a.cells[s] >= 0 && a.cells[s] % a.kv_size < a.n_kv &&
                        "sparq_attn: a stream's new cell outside the cache's view");
        }
        a.k_sq = (float *) w.k_sq->data; a.k_sq_nb1 = w.k_sq->nb[1]; a.k_sq_nb2 = w.k_sq->nb[2];
        a.v_comp = (float *) w.v_comp->data; a.v_comp_nb1 = w.v_comp->nb[1]; a.v_comp_nb2 = w.v_comp->nb[2];
    }
    a.report = w.report ? (float *) w.report->data : nullptr;
    a.softcap = P.softcap;
    a.max_bias = P.max_bias;
    a.sinks = w.sinks ? (const float *) w.sinks->data : nullptr;
    if (const struct ggml_tensor * b = w.kq_b) {
        a.kq_b = (const float *) b->data; a.kq_b_nb1 = b->nb[1]; a.kq_b_nb2 = b->nb[2]; a.kq_b_nb3 = b->nb[3];
        a.kq_b_ne3 = (int) b->ne[3];
    }
    a.sel_out = nullptr;
    return a;
}

size_t ggml_sparq_attn_work_size(const struct ggml_tensor * node, int n_tasks) {
    if (sparq_cpu_params(node).mode != GGML_SPARQ_MODE_ATTN) {
        return 0;
    }
    const struct sparq_args a = sparq_args_of(node);
    return sparq_cpu_work_size(&a, n_tasks);
}

static void sparq_ggml_barrier(void * ctx) {
    ggml_barrier((struct ggml_threadpool *) ctx);
}

// value i of an f32 or f16 row as e5m2 (an f32 rounded to f16 first: ggml-sparq.h)
static inline uint8_t sparq_e5m2_of(const void * row, bool f16, int64_t i) {
    const uint16_t h = f16 ? ((const uint16_t *) row)[i] : sparq_fp32_to_fp16(((const float *) row)[i]);
    return ggml_sparq_f16_to_e5m2(h);
}

// value i of an f32 or f16 row as f16 bits (an f32 rounded to nearest even, as for e5m2)
static inline uint16_t sparq_f16_of(const void * row, bool f16, int64_t i) {
    return f16 ? ((const uint16_t *) row)[i] : sparq_fp32_to_fp16(((const float *) row)[i]);
}

// the 8-bit K^T's writes (ggml_sparq_kt_append): the source rows split over the threads
static void sparq_kt_append(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const struct ggml_tensor * src = dst->src[1];
    const struct ggml_tensor * idx = dst->src[2];
    const int64_t ne0 = src->ne[0], n = src->ne[1];
    const int64_t per = (n + params->nth - 1) / params->nth;
    const int64_t i0 = per * params->ith, i1 = std::min<int64_t>(n, i0 + per);
    const bool f16 = src->type == GGML_TYPE_F16;
    for (int64_t i = i0; i < i1; ++i) {
        const int64_t row = idx ? ((const int64_t *) idx->data)[i] : i;
        const char * s = (const char *) src->data + (size_t) i * src->nb[1];
        uint8_t * d = (uint8_t *) dst->data + (size_t) row * dst->nb[1];
        for (int64_t j = 0; j < ne0; ++j) {
            d[j] = sparq_e5m2_of(s, f16, j);
        }
    }
}

// a ubatch's keys into a 4-bit K^T (ggml_sparq_cell_scatter): the K^T rows split over the threads,
// each row's cells written token by token (a block has one writer: ggml_sparq_kt4_put)
static void sparq_cell_scatter_kt4(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const struct ggml_tensor * src = dst->src[1];
    const int64_t * idx = (const int64_t *) dst->src[2]->data;
    const int64_t E = src->ne[0], n = src->ne[1], kv_size = dst->ne[0];
    const int64_t per = (E + params->nth - 1) / params->nth;
    const int64_t j0 = per * params->ith, j1 = std::min<int64_t>(E, j0 + per);
    const bool f16 = src->type == GGML_TYPE_F16;
    const size_t row_bytes = ggml_row_size(dst->type, kv_size);
    for (int64_t j = j0; j < j1; ++j) {
        for (int64_t i = 0; i < n; ++i) {
            const int64_t strm = idx[i] / kv_size, c = idx[i] % kv_size;
            uint8_t * row = (uint8_t *) dst->data + (size_t) (strm * E + j) * row_bytes;
            ggml_sparq_kt4_put(row, c, sparq_f16_of((const char *) src->data + (size_t) i * src->nb[1], f16, j));
        }
    }
}

// a ubatch's per-cell values at its cells (ggml_sparq_cell_scatter): the tokens split over the
// threads; each token's E values converted at once by the CPU's own conversion of dst's type (the
// one ggml_set_rows uses, so the bits equal a set_rows'), then written E cells apart
static void sparq_cell_scatter(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const struct ggml_tensor * src = dst->src[1];
    const int64_t * idx = (const int64_t *) dst->src[2]->data;
    const int64_t E = src->ne[0], n = src->ne[1], kv_size = dst->ne[0];
    const int64_t per = (n + params->nth - 1) / params->nth;
    const int64_t i0 = per * params->ith, i1 = std::min<int64_t>(n, i0 + per);
    const size_t esz = ggml_type_size(dst->type);
    const bool f16 = src->type == GGML_TYPE_F16;
    float buf[256];
    ggml_fp16_t hbuf[256];
    if (const struct ggml_tensor * win = dst->src[3]; win && params->ith == 0) {
        // the windows' pushes, token by token in order (one thread: a stream may come twice)
        const int64_t w = win->ne[0];
        for (int64_t i = 0; i < n; ++i) {
            GGML_ASSERT(idx[i] >= 0 && idx[i] / kv_size < win->ne[1] &&
                        "sparq_cell_scatter: a token's stream outside the window");
            int32_t * row = (int32_t *) ((char *) win->data + (size_t) (idx[i] / kv_size) * win->nb[1]);
            memmove(row + 1, row, (size_t) (w - 1) * sizeof(int32_t));
            row[0] = (int32_t) (idx[i] % kv_size);
        }
    }
    if (dst->type == GGML_TYPE_Q4_1) {
        sparq_cell_scatter_kt4(params, dst);
        return;
    }
    for (int64_t i = i0; i < i1; ++i) {
        const int64_t strm = idx[i] / kv_size, c = idx[i] % kv_size;
        const char * s = (const char *) src->data + (size_t) i * src->nb[1];
        char * d = (char *) dst->data + ((size_t) strm * E * kv_size + c) * esz;
        for (int64_t j0 = 0; j0 < E; j0 += 256) {
            const int64_t m = std::min<int64_t>(256, E - j0);
            if (dst->type == GGML_TYPE_I8) {
                for (int64_t j = 0; j < m; ++j) {
                    d[(j0 + j) * kv_size] = (char) sparq_e5m2_of(s, f16, j0 + j);
                }
                continue;
            }
            const float * x = (const float *) s + j0;
            if (f16) {
                ggml_cpu_fp16_to_fp32((const ggml_fp16_t *) s + j0, buf, m);
                x = buf;
            }
            if (dst->type == GGML_TYPE_F32) {
                for (int64_t j = 0; j < m; ++j) {
                    ((float *) d)[(j0 + j) * kv_size] = x[j];
                }
            } else {
                if (f16) {
                    memcpy(hbuf, (const ggml_fp16_t *) s + j0, (size_t) m * sizeof(ggml_fp16_t));
                } else {
                    ggml_get_type_traits_cpu(GGML_TYPE_F16)->from_float(x, hbuf, m);
                }
                for (int64_t j = 0; j < m; ++j) {
                    ((ggml_fp16_t *) d)[(j0 + j) * kv_size] = hbuf[j];
                }
            }
        }
    }
}

// x as a cache of type t holds it (f16: rounded to f16 and back)
static inline float sparq_value_as_cached(float x, enum ggml_type t) {
    return t == GGML_TYPE_F16 ? sparq_fp16_to_fp32(sparq_fp32_to_fp16(x)) : x;
}

// a sum's append of a decode step (ggml_sparq_sum_append): the elements split over the threads
static void sparq_sum_append(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const struct ggml_tensor * sum = dst->src[0];
    const float * xn = (const float *) dst->src[1]->data;
    const struct ggml_tensor * comp = dst->src[2];
    const struct ggml_sparq_sum_params prm = sparq_cpu_params(dst).sum;
    const enum ggml_type type = (enum ggml_type) prm.type;
    const bool squares = prm.squares;
    const int64_t ne0 = sum->ne[0], n = ne0 * sum->ne[1];
    const int64_t per = (n + params->nth - 1) / params->nth;
    const int64_t i0 = per * params->ith, i1 = std::min<int64_t>(n, i0 + per);
    if (dst->src[3] && params->ith == 0) {
        float * cnt = (float *) dst->src[3]->data;
        for (int64_t s = 0; s < sum->ne[1]; ++s) {
            cnt[s] += 1.0f; // one new cell per stream
        }
    }
    for (int64_t i = i0; i < i1; ++i) {
        const int64_t s = i / ne0, j = i % ne0;
        float * sp = (float *) ((char *) sum->data + (size_t) s * sum->nb[1]) + j;
        volatile float x = sparq_value_as_cached(xn[i], type); // each product and sum rounded on its own
        if (squares) {
            x = x * x;
        }
        if (comp) {
            float * cp = (float *) ((char *) comp->data + (size_t) s * comp->nb[1]) + j;
            const float y = x - *cp;
            const float t = *sp + y;
            *cp = (t - *sp) - y;
            *sp = t;
        } else {
            *sp += x;
        }
    }
}

void ggml_compute_forward_sparq_attn(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    switch (sparq_cpu_params(dst).mode) {
        case GGML_SPARQ_MODE_KT_APPEND:  sparq_kt_append(params, dst); return;
        case GGML_SPARQ_MODE_SUM_APPEND: sparq_sum_append(params, dst); return;
        case GGML_SPARQ_MODE_CELL_SCATTER: sparq_cell_scatter(params, dst); return;
        default: break;
    }
    const struct sparq_args a = sparq_args_of(dst);
    // ggml's reference mode runs the scalar kernels
    const struct sparq_isa * isa = params->use_ref ? &sparq_isa_scalar : sparq_isa_select();
    sparq_cpu_compute(&a, isa, params->wdata, params->wsize, params->ith, params->nth,
                      sparq_ggml_barrier, params->threadpool);
}
