// llama-sparq: times GGML_OP_SPARQ_ATTN against upstream's ggml_flash_attn_ext on
// the same f16 K and V, on ggml's CPU backend (driven by bench/op.py bench).
//
//   sparq-op-bench --S N --batch B --heads H --head-kv HKV --d D --r R --k K --l L
//                  --threads T --reps N [--warmup N] [--ops dense,sparq,sparq_all] [--kt-bits 16|8|4]
//
// Ops: dense (upstream's flash attention), sparq (the op), sparq_all (the op with every stream
// marked dense: each row attends over every valid cell, as in a diffuse layer's dense stretch).
// Prints one JSON object per op: {"op": ..., "S": ..., ..., "times_us": [...]}.
// The cache is filled with random f16 values; each sequence has S valid cells.

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-sparq-e5m2.h"
#include "ggml-sparq-kt4.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

struct opts {
    int S = 4096, batch = 1, heads = 32, head_kv = 32, d = 128, r = 32, k = 128, l = 32, threads = 2, reps = 10,
        warmup = 2, kt_bits = 16;
    std::string ops = "dense,sparq";
};

[[noreturn]] static void usage(const char * msg) {
    fprintf(stderr, "sparq-op-bench: %s\n", msg);
    exit(2);
}

static opts parse(int argc, char ** argv) {
    opts o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (i + 1 >= argc) {
            usage(("missing value for " + a).c_str());
        }
        const char * v = argv[++i];
        if (a == "--S") o.S = atoi(v);
        else if (a == "--batch") o.batch = atoi(v);
        else if (a == "--heads") o.heads = atoi(v);
        else if (a == "--head-kv") o.head_kv = atoi(v);
        else if (a == "--d") o.d = atoi(v);
        else if (a == "--r") o.r = atoi(v);
        else if (a == "--k") o.k = atoi(v);
        else if (a == "--l") o.l = atoi(v);
        else if (a == "--threads") o.threads = atoi(v);
        else if (a == "--reps") o.reps = atoi(v);
        else if (a == "--warmup") o.warmup = atoi(v);
        else if (a == "--ops") o.ops = v;
        else if (a == "--kt-bits") o.kt_bits = atoi(v);
        else usage(("unknown argument " + a).c_str());
    }
    if (o.S < 1 || o.batch < 1 || o.heads < 1 || o.head_kv < 1 || o.heads % o.head_kv || o.d < 1 || o.r < 1 ||
        o.r > o.d || o.k < 1 || o.l < 0 || o.l > o.k || o.threads < 1 || o.reps < 1 ||
        (o.kt_bits != 16 && o.kt_bits != 8 && o.kt_bits != 4) || (o.kt_bits == 4 && o.S % GGML_SPARQ_KT4_CELLS != 0)) {
        usage("invalid parameters (need S, batch, heads, d, k, threads, reps >= 1; heads % head-kv == 0; "
              "1 <= r <= d; 0 <= l <= k; kt-bits 16, 8 or 4, with 4 a context of a multiple of 32)");
    }
    for (size_t b = 0, e; b <= o.ops.size(); b = e + 1) {
        e = std::min(o.ops.find(',', b), o.ops.size());
        const std::string op = o.ops.substr(b, e - b);
        if (op != "dense" && op != "sparq" && op != "sparq_all") {
            usage(("unknown op '" + op + "' in --ops (allowed: dense, sparq, sparq_all)").c_str());
        }
    }
    return o;
}

static void fill_f16(ggml_tensor * t, std::mt19937 & rng, float sd) {
    std::normal_distribution<float> nd(0.0f, sd);
    std::vector<ggml_fp16_t> buf(ggml_nelements(t));
    for (auto & x : buf) {
        x = ggml_fp32_to_fp16(nd(rng));
    }
    memcpy(t->data, buf.data(), ggml_nbytes(t));
}

int main(int argc, char ** argv) {
    const opts o = parse(argc, argv);
    ggml_backend_t be = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(be, o.threads);

    const int B = o.batch, S = o.S, H = o.heads, HKV = o.head_kv, d = o.d;
    struct ggml_init_params ip = { 32 * ggml_tensor_overhead() + 4 * ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(ip);

    // decode: one query row per sequence, one stream per sequence (as llama.cpp's multi-stream KV)
    ggml_tensor * q    = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, d, 1, H, B);
    ggml_tensor * K    = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, d, S, HKV, B);
    ggml_tensor * V    = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, d, S, HKV, B);
    // K^T in f16, in e5m2 bytes (an i8 tensor) for the 8-bit K^T, in q4_1 blocks for the 4-bit one
    const ggml_type ktt = o.kt_bits == 8 ? GGML_TYPE_I8 : o.kt_bits == 4 ? GGML_TYPE_Q4_1 : GGML_TYPE_F16;
    ggml_tensor * KT   = ggml_new_tensor_4d(ctx, ktt, S, d, HKV, B);
    ggml_tensor * mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, S, 1, 1, B);
    ggml_tensor * vs   = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, d, HKV, B);
    ggml_tensor * vc   = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, B);
    ggml_tensor * vcd  = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, B); // negative counts: every stream dense
    const float scale = 1.0f / sqrtf((float) d);

    ggml_tensor * dense = ggml_flash_attn_ext(ctx, q, K, V, mask, scale, 0.0f, 0.0f);
    ggml_prec_set_acc(dense, GGML_PREC_F32);
    ggml_tensor * sparq = ggml_sparq_attn(ctx, q, K, KT, V, vs, vc, mask, o.r, o.k, o.l, scale);
    ggml_tensor * sparq_all = ggml_sparq_attn(ctx, q, K, KT, V, vs, vcd, mask, o.r, o.k, o.l, scale);

    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
    if (!buf) {
        usage("cannot allocate the tensors (out of memory?)");
    }

    std::mt19937 rng(1234);
    {
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> qv(ggml_nelements(q));
        for (auto & x : qv) {
            x = nd(rng) * (1.0f + 3.0f * (nd(rng) > 1.5f)); // a few heavy components
        }
        memcpy(q->data, qv.data(), ggml_nbytes(q));
    }
    fill_f16(K, rng, 1.0f);
    fill_f16(V, rng, 1.0f);
    // K^T from K (a 4-bit K^T's blocks start unwritten: zero bytes)
    memset(KT->data, 0, ggml_nbytes(KT));
    {
        const ggml_fp16_t * k = (const ggml_fp16_t *) K->data;
        for (int b = 0; b < B; ++b) {
            for (int h = 0; h < HKV; ++h) {
                const size_t o0 = ((size_t) b * HKV + h) * S * d;
                const ggml_fp16_t * kb = k + o0;
                for (int i = 0; i < S; ++i) {
                    for (int j = 0; j < d; ++j) {
                        const ggml_fp16_t x = kb[(size_t) i * d + j];
                        if (o.kt_bits == 8) {
                            ((uint8_t *) KT->data)[o0 + (size_t) j * S + i] = ggml_sparq_f16_to_e5m2(x);
                        } else if (o.kt_bits == 4) {
                            uint8_t * row = (uint8_t *) KT->data + ((((size_t) b * HKV + h) * d + j) * KT->nb[1]);
                            ggml_sparq_kt4_put(row, i, x);
                        } else {
                            ((ggml_fp16_t *) KT->data)[o0 + (size_t) j * S + i] = x;
                        }
                    }
                }
            }
        }
    }
    memset(mask->data, 0, ggml_nbytes(mask));
    {
        std::vector<float> s((size_t) d * HKV * B, 0.0f);
        memcpy(vs->data, s.data(), ggml_nbytes(vs));
        std::vector<float> c(B, (float) S);
        memcpy(vc->data, c.data(), ggml_nbytes(vc));
        std::vector<float> cd(B, -(float) S);
        memcpy(vcd->data, cd.data(), ggml_nbytes(vcd));
    }

    for (const char * name : { "dense", "sparq", "sparq_all" }) {
        if (("," + o.ops + ",").find("," + std::string(name) + ",") == std::string::npos) {
            continue;
        }
        ggml_tensor * out = strcmp(name, "dense") == 0 ? dense : strcmp(name, "sparq") == 0 ? sparq : sparq_all;
        ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, out);
        std::vector<double> times;
        for (int it = 0; it < o.warmup + o.reps; ++it) {
            const auto t0 = std::chrono::steady_clock::now();
            if (ggml_backend_graph_compute(be, gf) != GGML_STATUS_SUCCESS) {
                usage("graph compute failed");
            }
            const auto t1 = std::chrono::steady_clock::now();
            if (it >= o.warmup) {
                times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
            }
        }
        printf("{\"op\": \"%s\", \"S\": %d, \"batch\": %d, \"heads\": %d, \"head_kv\": %d, \"d\": %d, \"r\": %d, "
               "\"k\": %d, \"l\": %d, \"threads\": %d, \"kt_bits\": %d, \"times_us\": [",
               name, S, B, H, HKV, d, o.r, o.k, o.l, o.threads, o.kt_bits);
        for (size_t i = 0; i < times.size(); ++i) {
            printf("%s%.2f", i ? ", " : "", times[i]);
        }
        printf("]}\n");
        fflush(stdout);
    }

    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    ggml_backend_free(be);
    return 0;
}
