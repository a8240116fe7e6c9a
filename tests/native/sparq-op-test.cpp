// llama-sparq: runs SparQ attention on a case file written by tests/sparq_cases.py
// and writes the output (and, in direct mode, the selected cells) for pytest
// to compare with the NumPy reference.
//
//   sparq-op-test direct CASE OUT [--isa scalar|avx2|avx512|neon] [--threads N]
//       the kernel layer (ggml-sparq/cpu/sparq-cpu.h) on N std::threads
//   sparq-op-test ggml CASE OUT [--threads N]
//       the op through ggml: ggml_sparq_attn in a graph computed by the CPU
//       backend (the ISA comes from GGML_SPARQ_ISA)
//   sparq-op-test isa
//       prints the ISA the kernels select on this machine
//   sparq-op-test isa-threads N
//       the same, chosen by N threads at once (run under ThreadSanitizer)
//   sparq-op-test params-check
//       the op's typed parameters and each backend's support of them (sparq-params-check.h)
//
// Case file: "SPQ2", 19 int32 (d, dv, n_kv, n_rows, n_head, n_head_kv,
// n_stream, r, k, l, kv_type, mask_type, kt_pad, win_n, selector, per_head,
// no_mean_v, has_basis, sel_n), f32 scale, then q f32 [n_stream][n_head][n_rows][d],
// K [n_stream][n_head_kv][n_kv][d], V [n_stream][n_head_kv][n_kv][dv] (kv_type: enum sparq_type, 0 f32,
// 1 f16, or a block type, 2 q8_0 or 4..8 q4_0, q4_1, q5_0, q5_1, iq4_nl: rows of ggml's blocks, K^T then
// f16 of the dequantized keys), mask [n_stream][n_rows][n_kv] (mask_type 0 f32, 1 f16, -1 none), v_sum f32
// [n_stream][n_head_kv][dv], v_count f32 [n_stream]; when win_n > 0 the window cells
// i32 [n_stream][n_rows][win_n] (-1 padded); when has_basis, q_sel f32 like q, the keys
// in that basis like K in K^T's type (K^T is made from them) and comp_w f32 [n_head_kv][d]; with the
// h2o selector (3), its scores f32 [n_stream][n_head_kv][n_kv]; with the index selector (4),
// i32 n_list, i32 n_probe, centroids f32 [n_stream][n_head_kv][n_list][d] and the cells' lists
// f32 [n_stream][n_head_kv][n_kv] (-1: unassigned). Optional trailers: "COV1", f32 p, i32 k_min
// (the calibrated k's coverage target, applied); "KTE5" (K^T in 8 bits: e5m2 of the f32 or f16 keys
// it is made from; in ggml mode written by the op's append mode); "KT41" (K^T in 4 bits: q4_1
// blocks of 32 cells, ggml-sparq-kt4.h, of the same keys; in ggml mode written by the op's cell
// scatter; n_kv and n_kv + kt_pad multiples of 32); "TKB1", i32 buckets (the
// approximate bucketed top-k); "VAR1", f32 softcap, f32 max_bias, i32 has_sinks, then with sinks
// f32 [n_head] (the attention variants); "KQB1", then the KQ bias f32 [n_stream][n_head][n_rows][n_kv];
// "VVK1" (V read through K's rows: the first dv values of each,
// as MLA's cache holds its latent; the file's V must equal them).
// Output file: out f32 [n_stream][n_rows][n_head][dv], then (direct mode)
// sel int32 [n_stream][n_rows][n_head_kv][sel_n], then (h2o) the scores after the call or
// (index) the lists after the call.

#include "ggml-sparq-e5m2.h"
#include "sparq-cpu.h"

#ifdef SPARQ_TEST_WITH_GGML
#include "ggml.h"
#include "ggml-cpu.h"
#include "ggml-sparq.h"
#include "sparq-params-check.h"
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

struct test_case {
    int d, dv, n_kv, n_rows, n_head, n_head_kv, n_stream, r, k, l, kv_type, mask_type, kt_pad, win_n;
    int selector, per_head, no_mean_v, has_basis, sel_n;
    float scale;
    float cov_p = 0.0f; // > 0: the coverage target (trailer COV1)
    int k_min = 0;
    bool kt_e5m2 = false; // trailer KTE5
    bool kt4 = false;     // trailer KT41
    int topk_buckets = 0; // trailer TKB1
    float softcap = 0.0f, max_bias = 0.0f; // trailer VAR1, with the sinks (empty: none)
    std::vector<float> sinks;
    std::vector<float> kq_b; // trailer KQB1 (empty: none)
    bool v_view = false; // trailer VVK1
    std::vector<float> q, v_sum, v_count, q_sel, comp_w, h2o, ivf_cent;
    int ivf_n_list = 0, ivf_n_probe = 0;
    std::vector<char> K, V, mask, K_sel;
    std::vector<int32_t> win;
    sparq_type kv_t() const { return (sparq_type) kv_type; }
    bool kv_blocks() const { return sparq_block_bytes(kv_t()) != 0; }
    // bytes of n K or V rows of `len` values
    size_t kv_bytes(size_t n, int len) const { return n * sparq_row_bytes(kv_t(), len); }
    // the element of the keys K^T is made from: f32 for an f32 cache, else f16
    size_t kt_esz() const { return kv_type == 0 ? 4 : 2; }
    // K^T's element as kept: that, or 1 (e5m2)
    size_t kt_store_esz() const { return kt_e5m2 ? 1 : kt_esz(); }
    // bytes of a K^T row of n cells as kept
    size_t kt_row_bytes(size_t n) const {
        return kt4 ? n / GGML_SPARQ_KT4_CELLS * GGML_SPARQ_KT4_BYTES : n * kt_store_esz();
    }
    size_t mask_esz() const { return mask_type == 1 ? 2 : 4; }
};

[[noreturn]] static void die(const char * msg, const char * what = "") {
    fprintf(stderr, "sparq-op-test: %s%s\n", msg, what);
    exit(2);
}

static void read_exact(FILE * f, void * dst, size_t n, const char * what) {
    if (n && fread(dst, 1, n, f) != n) {
        die("truncated case file while reading ", what);
    }
}

static test_case read_case(const char * path) {
    FILE * f = fopen(path, "rb");
    if (!f) {
        die("cannot open case file ", path);
    }
    char magic[4];
    read_exact(f, magic, 4, "magic");
    if (memcmp(magic, "SPQ2", 4) != 0) {
        die("not a SPQ2 case file: ", path);
    }
    test_case c;
    int32_t h[19];
    read_exact(f, h, sizeof(h), "header");
    c.d = h[0]; c.dv = h[1]; c.n_kv = h[2]; c.n_rows = h[3]; c.n_head = h[4]; c.n_head_kv = h[5];
    c.n_stream = h[6]; c.r = h[7]; c.k = h[8]; c.l = h[9]; c.kv_type = h[10]; c.mask_type = h[11]; c.kt_pad = h[12]; c.win_n = h[13];
    c.selector = h[14]; c.per_head = h[15]; c.no_mean_v = h[16]; c.has_basis = h[17]; c.sel_n = h[18];
    read_exact(f, &c.scale, 4, "scale");
    const size_t nq = (size_t) c.n_stream * c.n_head * c.n_rows * c.d;
    const size_t nk = (size_t) c.n_stream * c.n_head_kv * c.n_kv * c.d;
    const size_t nv = (size_t) c.n_stream * c.n_head_kv * c.n_kv * c.dv;
    c.q.resize(nq);
    read_exact(f, c.q.data(), nq * 4, "q");
    if (c.kv_type < 0 || c.kv_type > SPARQ_IQ4_NL || c.kv_type == SPARQ_E5M2) {
        die("kv_type must be 0 (f32), 1 (f16), 2 (q8_0) or 4..8 (q4_0, q4_1, q5_0, q5_1, iq4_nl)");
    }
    if (c.kv_blocks() && (c.d % SPARQ_QK || c.dv % SPARQ_QK)) {
        die("a quantized case needs head sizes that are multiples of 32");
    }
    c.K.resize(c.kv_bytes(nk / c.d, c.d));
    read_exact(f, c.K.data(), c.K.size(), "K");
    c.V.resize(c.kv_bytes(nv / c.dv, c.dv));
    read_exact(f, c.V.data(), c.V.size(), "V");
    if (c.mask_type >= 0) {
        c.mask.resize((size_t) c.n_stream * c.n_rows * c.n_kv * c.mask_esz());
        read_exact(f, c.mask.data(), c.mask.size(), "mask");
    }
    c.v_sum.resize((size_t) c.n_stream * c.n_head_kv * c.dv);
    read_exact(f, c.v_sum.data(), c.v_sum.size() * 4, "v_sum");
    c.v_count.resize(c.n_stream);
    read_exact(f, c.v_count.data(), c.v_count.size() * 4, "v_count");
    if (c.win_n > 0) {
        c.win.resize((size_t) c.n_stream * c.n_rows * c.win_n);
        read_exact(f, c.win.data(), c.win.size() * 4, "win");
    }
    if (c.has_basis) {
        c.q_sel.resize(nq);
        read_exact(f, c.q_sel.data(), nq * 4, "q_sel");
        c.K_sel.resize(nk * c.kt_esz());
        read_exact(f, c.K_sel.data(), c.K_sel.size(), "K_sel");
        c.comp_w.resize((size_t) c.n_head_kv * c.d);
        read_exact(f, c.comp_w.data(), c.comp_w.size() * 4, "comp_w");
    }
    if (c.selector == 3 || c.selector == 4) {
        // H2O's scores, or the index's lists (written by the op alike)
        if (c.selector == 4) {
            int32_t nl[2];
            read_exact(f, nl, sizeof(nl), "index sizes");
            c.ivf_n_list = nl[0]; c.ivf_n_probe = nl[1];
            c.ivf_cent.resize((size_t) c.n_stream * c.n_head_kv * c.ivf_n_list * c.d);
            read_exact(f, c.ivf_cent.data(), c.ivf_cent.size() * 4, "index centroids");
        }
        c.h2o.resize((size_t) c.n_stream * c.n_head_kv * c.n_kv);
        read_exact(f, c.h2o.data(), c.h2o.size() * 4, c.selector == 3 ? "h2o scores" : "index lists");
    }
    char tmag[4];
    while (fread(tmag, 1, 4, f) == 4) {
        if (memcmp(tmag, "COV1", 4) == 0) {
            read_exact(f, &c.cov_p, 4, "coverage target");
            read_exact(f, &c.k_min, 4, "k_min");
        } else if (memcmp(tmag, "KTE5", 4) == 0) {
            c.kt_e5m2 = true;
        } else if (memcmp(tmag, "KT41", 4) == 0) {
            c.kt4 = true;
        } else if (memcmp(tmag, "TKB1", 4) == 0) {
            read_exact(f, &c.topk_buckets, 4, "topk_buckets");
        } else if (memcmp(tmag, "VAR1", 4) == 0) {
            int32_t has_sinks = 0;
            read_exact(f, &c.softcap, 4, "softcap");
            read_exact(f, &c.max_bias, 4, "max_bias");
            read_exact(f, &has_sinks, 4, "has_sinks");
            if (has_sinks) {
                c.sinks.resize(c.n_head);
                read_exact(f, c.sinks.data(), c.sinks.size() * 4, "sinks");
            }
        } else if (memcmp(tmag, "KQB1", 4) == 0) {
            c.kq_b.resize((size_t) c.n_stream * c.n_head * c.n_rows * c.n_kv);
            read_exact(f, c.kq_b.data(), c.kq_b.size() * 4, "kq_b");
        } else if (memcmp(tmag, "VVK1", 4) == 0) {
            if (c.dv > c.d) {
                die("a V read through K's rows needs dv <= d");
            }
            c.v_view = true;
        } else {
            die("unknown trailer in case file: ", path);
        }
    }
    fclose(f);
    return c;
}

static void write_out(const char * path, const std::vector<float> & out, const std::vector<int32_t> * sel,
                      const float * h2o = nullptr, size_t n_h2o = 0) {
    FILE * f = fopen(path, "wb");
    if (!f) {
        die("cannot write ", path);
    }
    fwrite(out.data(), 4, out.size(), f);
    if (sel) {
        fwrite(sel->data(), 4, sel->size(), f);
    }
    if (h2o) {
        fwrite(h2o, 4, n_h2o, f);
    }
    fclose(f);
}

// the keys of a quantized case dequantized and rounded to f16, as the graph appends them to K^T
static std::vector<char> dequant_keys_f16(const test_case & c) {
    const size_t rb = sparq_row_bytes(c.kv_t(), c.d), n = c.K.size() / rb;
    std::vector<char> out(n * c.d * 2);
    std::vector<float> row(c.d);
    uint16_t * o = (uint16_t *) out.data();
    for (size_t i = 0; i < n; ++i) {
        sparq_row_to_f32(&sparq_isa_scalar, c.kv_t(), c.K.data() + i * rb, row.data(), c.d);
        for (int j = 0; j < c.d; ++j) {
            o[i * c.d + j] = sparq_fp32_to_fp16(row[j]);
        }
    }
    return out;
}

// one key element (f32 or f16) as e5m2 (an f32 rounded to f16 first)
static char e5m2_of(const char * x, size_t esz) {
    uint16_t h;
    if (esz == 4) {
        float f;
        memcpy(&f, x, 4);
        h = sparq_fp32_to_fp16(f);
    } else {
        memcpy(&h, x, 2);
    }
    return (char) ggml_sparq_f16_to_e5m2(h);
}

// K^T with rows of n_kv + kt_pad cells (a view into a larger cache, as in llama.cpp),
// from the keys in the selection basis when the case has one (a quantized cache: f16 of its dequantized keys);
// e5m2 when the case says so and `stored`, else in the keys' own type
static std::vector<char> make_kt(const test_case & c, bool stored = true) {
    const std::vector<char> K = c.has_basis ? c.K_sel : c.kv_blocks() ? dequant_keys_f16(c) : c.K;
    const size_t esz = c.kt_esz(), row = (size_t) c.n_kv + c.kt_pad;
    const bool e5m2 = stored && c.kt_e5m2;
    const size_t oesz = e5m2 ? 1 : esz;
    if (stored && c.kt4) {
        // the 4-bit K^T: each key element through f16 into its block, cell by cell
        const size_t rb = c.kt_row_bytes(row);
        std::vector<char> kt((size_t) c.n_stream * c.n_head_kv * c.d * rb, 0);
        for (int st = 0; st < c.n_stream; ++st) {
            for (int h = 0; h < c.n_head_kv; ++h) {
                for (int i = 0; i < c.n_kv; ++i) {
                    for (int j = 0; j < c.d; ++j) {
                        const char * x = &K[((((size_t) st * c.n_head_kv + h) * c.n_kv + i) * c.d + j) * esz];
                        uint16_t hv;
                        if (esz == 4) {
                            float f;
                            memcpy(&f, x, 4);
                            hv = sparq_fp32_to_fp16(f);
                        } else {
                            memcpy(&hv, x, 2);
                        }
                        uint8_t * r0 = (uint8_t *) kt.data() + (((size_t) st * c.n_head_kv + h) * c.d + j) * rb;
                        ggml_sparq_kt4_put(r0, i, hv);
                    }
                }
            }
        }
        return kt;
    }
    std::vector<char> kt((size_t) c.n_stream * c.n_head_kv * c.d * row * oesz, 0);
    for (int st = 0; st < c.n_stream; ++st) {
        for (int h = 0; h < c.n_head_kv; ++h) {
            for (int i = 0; i < c.n_kv; ++i) {
                for (int j = 0; j < c.d; ++j) {
                    const size_t src = ((((size_t) st * c.n_head_kv + h) * c.n_kv + i) * c.d + j) * esz;
                    const size_t dst = ((((size_t) st * c.n_head_kv + h) * c.d + j) * row + i) * oesz;
                    if (e5m2) {
                        kt[dst] = e5m2_of(&K[src], esz);
                    } else {
                        memcpy(&kt[dst], &K[src], esz);
                    }
                }
            }
        }
    }
    return kt;
}

// ---------------------------------------------------------------------------
// direct mode
// ---------------------------------------------------------------------------

struct thread_barrier {
    std::mutex mu;
    std::condition_variable cv;
    int n, waiting = 0;
    long phase = 0;
    explicit thread_barrier(int n) : n(n) {}
    static void wait(void * p) {
        thread_barrier * b = (thread_barrier *) p;
        std::unique_lock<std::mutex> lock(b->mu);
        const long ph = b->phase;
        if (++b->waiting == b->n) {
            b->waiting = 0;
            b->phase++;
            b->cv.notify_all();
        } else {
            b->cv.wait(lock, [&] { return b->phase != ph; });
        }
    }
};

static int run_direct(const test_case & c, const char * out_path, const char * isa_name, int nth) {
    const struct sparq_isa * isa = isa_name ? sparq_isa_by_name(isa_name) : sparq_isa_select();
    if (!isa) {
        die("ISA not available on this CPU/build: ", isa_name);
    }
    const std::vector<char> kt = make_kt(c);
    const size_t ktrow = (size_t) c.n_kv + c.kt_pad;
    std::vector<float> out((size_t) c.n_stream * c.n_rows * c.n_head * c.dv, NAN);
    std::vector<int32_t> sel((size_t) c.n_stream * c.n_rows * c.n_head_kv * c.sel_n, -2);

    sparq_args a;
    memset(&a, 0, sizeof(a));
    a.d = c.d; a.dv = c.dv; a.n_kv = c.n_kv; a.n_rows = c.n_rows; a.n_head = c.n_head; a.n_head_kv = c.n_head_kv;
    a.n_stream = c.n_stream; a.r = c.r; a.k = c.k; a.l = c.l; a.scale = c.scale;
    a.selector = c.selector; a.per_head = c.per_head; a.no_mean_v = c.no_mean_v;
    a.cov_p = c.cov_p; a.cov_apply = c.cov_p > 0.0f; a.k_min = c.k_min;
    a.topk_buckets = c.topk_buckets;
    a.softcap = c.softcap; a.max_bias = c.max_bias; a.sinks = c.sinks.empty() ? nullptr : c.sinks.data();
    if (!c.kq_b.empty()) {
        a.kq_b = c.kq_b.data(); a.kq_b_nb1 = (size_t) c.n_kv * 4; a.kq_b_nb2 = a.kq_b_nb1 * c.n_rows;
        a.kq_b_nb3 = a.kq_b_nb2 * c.n_head; a.kq_b_ne3 = c.n_stream;
    }
    a.q = c.q.data(); a.q_nb1 = (size_t) c.d * 4; a.q_nb2 = a.q_nb1 * c.n_rows; a.q_nb3 = a.q_nb2 * c.n_head;
    const sparq_type t = c.kv_t();
    a.K = c.K.data(); a.K_type = t; a.K_nb1 = c.kv_bytes(1, c.d); a.K_nb2 = a.K_nb1 * c.n_kv; a.K_nb3 = a.K_nb2 * c.n_head_kv;
    a.V = c.V.data(); a.V_type = t; a.V_nb1 = c.kv_bytes(1, c.dv); a.V_nb2 = a.V_nb1 * c.n_kv; a.V_nb3 = a.V_nb2 * c.n_head_kv;
    if (c.v_view) {
        a.V = c.K.data(); a.V_nb1 = a.K_nb1; a.V_nb2 = a.K_nb2; a.V_nb3 = a.K_nb3;
    }
    a.KT = kt.data(); a.KT_type = c.kt_e5m2 ? SPARQ_E5M2 : c.kt4 ? SPARQ_KT4 : c.kv_type == 0 ? SPARQ_F32 : SPARQ_F16;
    a.KT_nb1 = c.kt_row_bytes(ktrow); a.KT_nb2 = a.KT_nb1 * c.d; a.KT_nb3 = a.KT_nb2 * c.n_head_kv;
    a.v_sum = c.v_sum.data(); a.v_sum_nb1 = (size_t) c.dv * 4; a.v_sum_nb2 = a.v_sum_nb1 * c.n_head_kv;
    a.v_count = c.v_count.data();
    if (c.mask_type >= 0) {
        a.mask = c.mask.data(); a.mask_type = c.mask_type == 1 ? SPARQ_F16 : SPARQ_F32;
        a.mask_nb1 = (size_t) c.n_kv * c.mask_esz(); a.mask_nb3 = a.mask_nb1 * c.n_rows; a.mask_ne3 = c.n_stream;
    }
    a.out = out.data(); a.out_nb1 = (size_t) c.dv * 4; a.out_nb2 = a.out_nb1 * c.n_head; a.out_nb3 = a.out_nb2 * c.n_rows;
    a.sel_out = sel.data(); a.sel_n = c.sel_n;
    if (sparq_sel_max(&a) != c.sel_n) {
        die("sel_n of the case differs from sparq_sel_max");
    }
    if (c.win_n > 0) {
        a.win = c.win.data(); a.win_n = c.win_n; a.win_nb1 = (size_t) c.win_n * 4; a.win_nb2 = a.win_nb1 * c.n_rows;
    }
    if (c.has_basis) {
        a.q_sel = c.q_sel.data(); a.q_sel_nb1 = a.q_nb1; a.q_sel_nb2 = a.q_nb2; a.q_sel_nb3 = a.q_nb3;
        a.comp_w = c.comp_w.data(); a.comp_w_nb1 = (size_t) c.d * 4;
    }
    std::vector<float> h2o = c.h2o;
    // the selector's inputs as the glue passes them (ggml-sparq.h's sel[]): h2o its scores; index its
    // centroids, then each cell's list
    const sparq_sel_input per_cell = { h2o.data(), (size_t) c.n_kv * 4, (size_t) c.n_kv * 4 * c.n_head_kv, 0, c.n_head_kv };
    if (c.selector == 3) {
        a.sel_in[0] = per_cell;
    }
    if (c.selector == 4) {
        const size_t cnb1 = (size_t) c.d * 4, cnb2 = cnb1 * c.ivf_n_list;
        a.sel_in[0] = { const_cast<float *>(c.ivf_cent.data()), cnb1, cnb2, cnb2 * c.n_head_kv, c.ivf_n_list };
        a.sel_in[1] = per_cell;
        a.n_probe = c.ivf_n_probe;
    }

    const size_t wsize = sparq_cpu_work_size(&a, nth);
    // the scratch poisoned (every float NaN) as ggml's work buffer may hold anything: the op must
    // write what it reads
    std::vector<char> work(wsize, (char) 0xff);
    thread_barrier bar(nth);
    std::vector<std::thread> threads;
    for (int ith = 1; ith < nth; ++ith) {
        threads.emplace_back([&, ith] { sparq_cpu_compute(&a, isa, work.data(), wsize, ith, nth, thread_barrier::wait, &bar); });
    }
    sparq_cpu_compute(&a, isa, work.data(), wsize, 0, nth, thread_barrier::wait, &bar);
    for (auto & th : threads) {
        th.join();
    }
    write_out(out_path, out, &sel, c.selector == 3 || c.selector == 4 ? h2o.data() : nullptr, h2o.size());
    return 0;
}

// ---------------------------------------------------------------------------
// ggml mode
// ---------------------------------------------------------------------------

#ifdef SPARQ_TEST_WITH_GGML
// dst (i8 [row, ...]) written by ggml_sparq_kt_append from a new tensor of like's type holding its rows
// in reverse order, through reversed indices; the source is the result's src[1], filled by the caller
// (kt_fill_reversed); returns the node (a view of dst)
static struct ggml_tensor * kt_appended(struct ggml_context * ctx, struct ggml_tensor * dst, struct ggml_tensor * like) {
    const int64_t ne0 = dst->ne[0], n = ggml_nrows(dst);
    struct ggml_tensor * src = ggml_new_tensor_2d(ctx, like->type, ne0, n);
    struct ggml_tensor * idx = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, n);
    for (int64_t i = 0; i < n; ++i) {
        ((int64_t *) idx->data)[i] = n - 1 - i;
    }
    return ggml_sparq_kt_append(ctx, ggml_reshape_2d(ctx, dst, ne0, n), src, idx);
}

// the appended node's source: row i = row n - 1 - i of kt
static void kt_fill_reversed(struct ggml_tensor * node, const std::vector<char> & kt) {
    struct ggml_tensor * src = node->src[1];
    const size_t rb = src->nb[1];
    const int64_t n = src->ne[1];
    for (int64_t i = 0; i < n; ++i) {
        memcpy((char *) src->data + (size_t) i * rb, kt.data() + (size_t) (n - 1 - i) * rb, rb);
    }
}

// a 4-bit K^T written by the op's cell scatter, as the graph's appends write it: the keys as tokens
// (src [d * n_head_kv, n_kv * n_stream] of the keys' type), the cells in reverse order (a block's
// bytes must not depend on the order of its writes; kt4_fill_tokens fills src); returns the node
static struct ggml_tensor * kt4_scattered(struct ggml_context * ctx, struct ggml_tensor * dst, struct ggml_tensor * like,
                                          const test_case & c) {
    const int64_t n = (int64_t) c.n_kv * c.n_stream, row = c.n_kv + c.kt_pad;
    struct ggml_tensor * src = ggml_new_tensor_2d(ctx, like->type, (int64_t) c.d * c.n_head_kv, n);
    struct ggml_tensor * idx = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, n);
    for (int64_t t = 0; t < n; ++t) {
        const int64_t u = n - 1 - t; // stream u / n_kv, cell u % n_kv
        ((int64_t *) idx->data)[t] = u / c.n_kv * row + u % c.n_kv;
    }
    return ggml_sparq_cell_scatter(ctx, dst, src, idx);
}

// the scatter's tokens from kt (make_kt's unstored K^T: [stream][head][component][row] elements)
static void kt4_fill_tokens(struct ggml_tensor * node, const std::vector<char> & kt, const test_case & c) {
    struct ggml_tensor * src = node->src[1];
    const size_t esz = ggml_type_size(src->type), row = (size_t) c.n_kv + c.kt_pad;
    const int64_t n = src->ne[1];
    for (int64_t t = 0; t < n; ++t) {
        const int64_t u = n - 1 - t, st = u / c.n_kv, cell = u % c.n_kv;
        for (int h = 0; h < c.n_head_kv; ++h) {
            for (int j = 0; j < c.d; ++j) {
                memcpy((char *) src->data + (size_t) t * src->nb[1] + ((size_t) h * c.d + j) * esz,
                       kt.data() + ((((size_t) st * c.n_head_kv + h) * c.d + j) * row + cell) * esz, esz);
            }
        }
    }
}

static int run_ggml(const test_case & c, const char * out_path, int nth) {
    // an 8-bit K^T is written by the op's append mode from the keys' own type, as the graph does
    const std::vector<char> kt = make_kt(c, false);
    static const enum ggml_type types[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_COUNT, GGML_TYPE_Q4_0,
                                            GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_IQ4_NL };
    const enum ggml_type t = types[c.kv_type];
    const enum ggml_type tkt = c.kv_type == 0 ? GGML_TYPE_F32 : GGML_TYPE_F16;
    const size_t need = c.kq_b.size() * 4 + c.h2o.size() * 4 + c.ivf_cent.size() * 4 + c.win.size() * 4 + c.q_sel.size() * 4 + c.comp_w.size() * 4 + c.q.size() * 4 + c.K.size() + c.V.size() + 4 * kt.size() + c.mask.size() +
                        c.v_sum.size() * 4 + c.v_count.size() * 4 +
                        (size_t) c.n_stream * c.n_rows * c.n_head * c.dv * 4 + 64 * ggml_tensor_overhead() +
                        ggml_graph_overhead() + (1 << 20);
    struct ggml_init_params ip = { need, nullptr, false };
    struct ggml_context * ctx = ggml_init(ip);

    struct ggml_tensor * q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, c.d, c.n_rows, c.n_head, c.n_stream);
    struct ggml_tensor * K = ggml_new_tensor_4d(ctx, t, c.d, c.n_kv, c.n_head_kv, c.n_stream);
    struct ggml_tensor * V = c.v_view ? ggml_view_4d(ctx, K, c.dv, c.n_kv, c.n_head_kv, c.n_stream, K->nb[1], K->nb[2], K->nb[3], 0)
                                      : ggml_new_tensor_4d(ctx, t, c.dv, c.n_kv, c.n_head_kv, c.n_stream);
    struct ggml_tensor * KTfull = ggml_new_tensor_4d(ctx, tkt, c.n_kv + c.kt_pad, c.d, c.n_head_kv, c.n_stream);
    struct ggml_tensor * KTsrc = KTfull;
    if (c.kt_e5m2) {
        KTfull = ggml_new_tensor_4d(ctx, GGML_TYPE_I8, c.n_kv + c.kt_pad, c.d, c.n_head_kv, c.n_stream);
        KTsrc = kt_appended(ctx, KTfull, KTsrc);
    } else if (c.kt4) {
        KTfull = ggml_new_tensor_4d(ctx, GGML_TYPE_Q4_1, c.n_kv + c.kt_pad, c.d, c.n_head_kv, c.n_stream);
        memset(KTfull->data, 0, ggml_nbytes(KTfull));
        KTsrc = kt4_scattered(ctx, KTfull, KTsrc, c);
    }
    struct ggml_tensor * KT = ggml_view_4d(ctx, KTsrc, c.n_kv, c.d, c.n_head_kv, c.n_stream,
                                           KTfull->nb[1], KTfull->nb[2], KTfull->nb[3], 0);
    struct ggml_tensor * vs = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c.dv, c.n_head_kv, c.n_stream);
    struct ggml_tensor * vc = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, c.n_stream);
    struct ggml_tensor * mask = nullptr;
    if (c.mask_type >= 0) {
        mask = ggml_new_tensor_4d(ctx, c.mask_type == 1 ? GGML_TYPE_F16 : GGML_TYPE_F32, c.n_kv, c.n_rows, 1, c.n_stream);
        memcpy(mask->data, c.mask.data(), c.mask.size());
    }
    memcpy(q->data, c.q.data(), c.q.size() * 4);
    memcpy(K->data, c.K.data(), c.K.size());
    if (!c.v_view) {
        memcpy(V->data, c.V.data(), c.V.size());
    }
    if (c.kt_e5m2) {
        kt_fill_reversed(KTsrc, kt);
    } else if (c.kt4) {
        kt4_fill_tokens(KTsrc, kt, c);
    } else {
        memcpy(KTfull->data, kt.data(), kt.size());
    }
    memcpy(vs->data, c.v_sum.data(), c.v_sum.size() * 4);
    memcpy(vc->data, c.v_count.data(), c.v_count.size() * 4);

    struct ggml_sparq_attn_srcs src = {};
    src.q = q; src.k = K; src.kt = KT; src.v = V; src.v_sum = vs; src.v_count = vc; src.mask = mask;
    struct ggml_sparq_attn_params p = ggml_sparq_attn_params_default(c.r, c.k, c.l, c.scale);
    p.selector = c.selector;
    p.flags = (c.per_head ? GGML_SPARQ_FLAG_PER_HEAD : 0) | (c.no_mean_v ? GGML_SPARQ_FLAG_NO_MEAN_V : 0);
    if (c.cov_p > 0.0f) {
        p.cov_p = c.cov_p;
        p.k_min = c.k_min;
        p.cov_apply = true;
    }
    p.topk_buckets = c.topk_buckets;
    p.softcap = c.softcap;
    p.max_bias = c.max_bias;
    if (!c.sinks.empty()) {
        src.sinks = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, c.n_head);
        memcpy(src.sinks->data, c.sinks.data(), c.sinks.size() * 4);
    }
    if (!c.kq_b.empty()) {
        src.kq_b = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, c.n_kv, c.n_rows, c.n_head, c.n_stream);
        memcpy(src.kq_b->data, c.kq_b.data(), c.kq_b.size() * 4);
    }
    if (c.win_n > 0) {
        src.win = ggml_new_tensor_3d(ctx, GGML_TYPE_I32, c.win_n, c.n_rows, c.n_stream);
        memcpy(src.win->data, c.win.data(), c.win.size() * 4);
    }
    if (c.has_basis) {
        src.sel[0] = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, c.d, c.n_rows, c.n_head, c.n_stream);
        src.sel[1] = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.d, c.n_head_kv);
        memcpy(src.sel[0]->data, c.q_sel.data(), c.q_sel.size() * 4);
        memcpy(src.sel[1]->data, c.comp_w.data(), c.comp_w.size() * 4);
    }
    struct ggml_tensor * h2o = nullptr;
    if (c.selector == GGML_SPARQ_SEL_H2O || c.selector == GGML_SPARQ_SEL_INDEX) {
        // the selector's per-cell state: H2O's scores, or the index's list ids (written by the op)
        h2o = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c.n_kv, c.n_head_kv, c.n_stream);
        memcpy(h2o->data, c.h2o.data(), c.h2o.size() * 4);
        if (c.selector == GGML_SPARQ_SEL_H2O) {
            src.sel[0] = h2o;
        } else {
            src.sel[0] = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, c.d, c.ivf_n_list, c.n_head_kv, c.n_stream);
            memcpy(src.sel[0]->data, c.ivf_cent.data(), c.ivf_cent.size() * 4);
            src.sel[1] = h2o;
            p.n_probe = c.ivf_n_probe;
        }
    }
    struct ggml_tensor * res = ggml_sparq_attn_ext(ctx, &src, &p);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, res);
    // the work buffer as ggml's plan sizes it (the op's scratch grows with the shape)
    struct ggml_cplan cp = ggml_graph_plan(gf, nth, nullptr);
    std::vector<uint8_t> work(cp.work_size);
    cp.work_data = work.data();
    if (ggml_graph_compute(gf, &cp) != GGML_STATUS_SUCCESS) {
        die("ggml_graph_compute failed");
    }
    std::vector<float> out(ggml_nelements(res));
    memcpy(out.data(), res->data, out.size() * 4);
    write_out(out_path, out, nullptr, h2o ? (const float *) h2o->data : nullptr, h2o ? (size_t) ggml_nelements(h2o) : 0);
    ggml_free(ctx);
    return 0;
}
#endif

// N threads released together, each choosing the ISA first thing (as the op's worker
// threads do on the first SparQ step); under ThreadSanitizer a racy choice is reported
static int run_isa_threads(int nth) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<const sparq_isa *> got(nth, nullptr);
    std::vector<std::thread> threads;
    for (int i = 0; i < nth; ++i) {
        threads.emplace_back([&, i] {
            ready++;
            while (!go.load()) {
            }
            got[i] = sparq_isa_select();
        });
    }
    while (ready.load() < nth) {
    }
    go = true;
    for (auto & th : threads) {
        th.join();
    }
    for (int i = 1; i < nth; ++i) {
        if (got[i] != got[0]) {
            die("threads chose different ISAs");
        }
    }
    printf("%s\n", got[0]->name);
    return 0;
}

// The index's gather primitive of one ISA against the reference loop (sparq-cpu.h), walked as the
// op walks it (after a stop the cell is skipped): lengths around the vector widths, list counts,
// flag densities, and ids out of range (-1: in no list yet; n_list, huge, NaN) at random places.
static int run_gather_check(const char * name) {
    const sparq_isa * isa = sparq_isa_by_name(name);
    if (!isa) {
        die("no such ISA on this CPU/build: ", name);
    }
    std::mt19937 rng(7);
    int cases = 0;
    for (int n : { 0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 100, 1000 }) {
        for (int nl : { 1, 3, 16, 256 }) {
            for (int trial = 0; trial < 24; ++trial) {
                std::vector<float> ids(n);
                std::vector<int32_t> flag(nl);
                const unsigned dens = 1 + trial % 4, bad = trial % 3 == 0 ? 0 : 1 + trial % 5; // in 8, in 64
                for (int32_t & f : flag) {
                    f = rng() % 8 < dens ? (int32_t) (1 + rng() % 3) : 0;
                }
                for (float & x : ids) {
                    x = (float) (rng() % nl);
                    if (rng() % 64 < bad) {
                        const float odd[4] = { -1.0f, (float) nl, 3.0e9f, NAN };
                        x = odd[rng() % 4];
                    }
                }
                const int base = (int) (rng() % 1000);
                std::vector<int32_t> a(n + 16, -7), b(n + 16, -7);
                for (int pos = 0; pos <= n;) {
                    int sa = -1, sb = -1;
                    const int ma = isa->list_gather(ids.data() + pos, n - pos, flag.data(), nl, base + pos, a.data(), &sa);
                    const int mb = sparq_list_gather_ref(ids.data() + pos, n - pos, flag.data(), nl, base + pos, b.data(), &sb);
                    if (ma != mb || sa != sb || !std::equal(a.begin(), a.begin() + ma, b.begin())) {
                        fprintf(stderr, "list_gather %s differs: n %d, n_list %d, trial %d, from %d: %d hits stop %d, want %d stop %d\n",
                                name, n, nl, trial, pos, ma, sa, mb, sb);
                        return 1;
                    }
                    pos += sa + 1;
                }
                cases++;
            }
        }
    }
    printf("list_gather %s: %d cases equal to the reference\n", name, cases);
    return 0;
}

// The approximate scores of one ISA (approx_f32, _f16, _e5m2, _kt4) against the scalar ISA's: equal
// bit for bit (sparq-cpu.h: per output the same fused operations in the same order), over head
// counts around the head passes, row counts, lengths around the vector widths and the register
// tiles, and first cells inside a 4-bit block; and expsum_store: expsum's sum, exp_acc's values.
static int run_scores_check(const char * name) {
    const sparq_isa * isa = sparq_isa_by_name(name);
    const sparq_isa * ref = sparq_isa_by_name("scalar");
    if (!isa || !ref) {
        die("no such ISA on this CPU/build: ", name);
    }
    std::mt19937 rng(13);
    std::uniform_real_distribution<float> U(-2.0f, 2.0f);
    int cases = 0;
    for (int g : { 1, 2, 3, 4, 5, 8, 9 }) {
        for (int r : { 1, 2, 3, 8, 20, 41 }) {
            for (int n : { 0, 1, 7, 15, 16, 17, 33, 100, 257 }) {
                for (int c0 : { 0, 5, 31, 64 }) {
                    const int len = c0 + n;
                    const int nblk = (len + GGML_SPARQ_KT4_CELLS - 1) / GGML_SPARQ_KT4_CELLS;
                    std::vector<float> f32((size_t) r * len);
                    std::vector<uint16_t> f16(f32.size());
                    std::vector<uint8_t> e5m2(f32.size()), kt4((size_t) r * nblk * GGML_SPARQ_KT4_BYTES);
                    for (size_t i = 0; i < f32.size(); ++i) {
                        f32[i] = U(rng) * (rng() % 8 == 0 ? 100.0f : 1.0f);
                        f16[i] = sparq_fp32_to_fp16(f32[i]);
                        e5m2[i] = ggml_sparq_f16_to_e5m2(f16[i]);
                    }
                    for (int j = 0; j < r; ++j) {
                        for (int b = 0; b < nblk; ++b) {
                            uint16_t h[GGML_SPARQ_KT4_CELLS];
                            for (int t = 0; t < GGML_SPARQ_KT4_CELLS; ++t) {
                                const int c = b * GGML_SPARQ_KT4_CELLS + t;
                                h[t] = c < len ? f16[(size_t) j * len + c] : 0;
                            }
                            ggml_sparq_kt4_block(kt4.data() + ((size_t) j * nblk + b) * GGML_SPARQ_KT4_BYTES, h);
                        }
                    }
                    std::vector<const float *> r32(r);
                    std::vector<const uint16_t *> r16(r);
                    std::vector<const uint8_t *> r8(r), r4(r);
                    for (int j = 0; j < r; ++j) {
                        r32[j] = f32.data() + (size_t) j * len + c0; // rows from c0: unaligned starts
                        r16[j] = f16.data() + (size_t) j * len + c0;
                        r8[j] = e5m2.data() + (size_t) j * len + c0;
                        r4[j] = kt4.data() + (size_t) j * nblk * GGML_SPARQ_KT4_BYTES; // from cell 0
                    }
                    std::vector<float> qs((size_t) g * r);
                    for (float & x : qs) {
                        x = U(rng);
                    }
                    std::vector<float> a((size_t) g * n + 1), b((size_t) g * n + 1);
                    const char * what[4] = { "f32", "f16", "e5m2", "kt4" };
                    for (int t = 0; t < 4; ++t) {
                        std::fill(a.begin(), a.end(), -7.0f);
                        std::fill(b.begin(), b.end(), -7.0f);
                        for (int k = 0; k < 2; ++k) {
                            const sparq_isa * x = k == 0 ? isa : ref;
                            float * o = k == 0 ? a.data() : b.data();
                            switch (t) {
                                case 0: x->approx_f32(r32.data(), r, qs.data(), g, n, o); break;
                                case 1: x->approx_f16(r16.data(), r, qs.data(), g, n, o); break;
                                case 2: x->approx_e5m2(r8.data(), r, qs.data(), g, n, o); break;
                                default: x->approx_kt4(r4.data(), c0, r, qs.data(), g, n, o); break;
                            }
                        }
                        if (memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0) {
                            fprintf(stderr, "approx_%s %s differs from scalar: g %d r %d n %d c0 %d\n", what[t], name, g, r, n, c0);
                            return 1;
                        }
                    }
                    cases++;
                }
            }
        }
    }
    for (int n : { 0, 1, 7, 15, 16, 17, 33, 100, 1000 }) {
        std::vector<float> x(n), y(n, -7.0f), z(n, 0.0f);
        float m = -INFINITY;
        for (float & v : x) {
            v = rng() % 16 == 0 ? -INFINITY : U(rng) * 20.0f;
            m = std::max(m, v);
        }
        const float s1 = isa->expsum(x.data(), n, m), s2 = isa->expsum_store(x.data(), n, m, y.data());
        isa->exp_acc(x.data(), n, m, 1.0f, z.data());
        if (memcmp(&s1, &s2, sizeof(float)) != 0 || memcmp(y.data(), z.data(), n * sizeof(float)) != 0) {
            fprintf(stderr, "expsum_store %s differs from expsum / exp_acc: n %d\n", name, n);
            return 1;
        }
        cases++;
    }
    printf("approx, expsum_store %s: %d cases equal to the scalar ISA's\n", name, cases);
    return 0;
}

// The g-head gathers of one ISA (gather_dot_g, gather_axpy_g) against the one-head gathers run per
// head: equal bit for bit (sparq-cpu.h promises the same operations in the same order), over head
// counts around the passes of 4, row lengths around the vector widths and the register tiles, f16
// and f32 rows, and selections in any order with repeats.
static int run_heads_check(const char * name) {
    const sparq_isa * isa = sparq_isa_by_name(name);
    if (!isa) {
        die("no such ISA on this CPU/build: ", name);
    }
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> U(-2.0f, 2.0f);
    int cases = 0;
    for (int f16 : { 1, 0 }) {
        for (int g : { 1, 2, 3, 4, 5, 8, 9 }) {
            for (int d : { 1, 7, 16, 31, 64, 80, 96, 128, 200, 256 }) {
                for (int n : { 0, 1, 5, 33, 128 }) {
                    const int rows = 300;
                    const size_t esz = f16 ? 2 : 4, stride = (size_t) (d + 3) * esz; // rows padded apart
                    std::vector<char> base(rows * stride);
                    for (int i = 0; i < rows; ++i) {
                        for (int j = 0; j < d; ++j) {
                            const float x = U(rng);
                            if (f16) {
                                ((uint16_t *) (base.data() + i * stride))[j] = sparq_fp32_to_fp16(x);
                            } else {
                                ((float *) (base.data() + i * stride))[j] = x;
                            }
                        }
                    }
                    std::vector<int32_t> idx(n);
                    for (int32_t & i : idx) {
                        i = (int32_t) (rng() % rows);
                    }
                    std::vector<float> qv((size_t) g * d), p((size_t) g * (n + 2)), y0((size_t) g * d), y1;
                    std::vector<const float *> q(g);
                    for (float & x : qv) {
                        x = U(rng);
                    }
                    for (float & x : p) {
                        x = U(rng);
                    }
                    for (float & x : y0) {
                        x = U(rng);
                    }
                    y1 = y0;
                    for (int h = 0; h < g; ++h) {
                        q[h] = qv.data() + (size_t) h * d;
                    }
                    const size_t os = n + 1, ps = n + 2;
                    std::vector<float> og((size_t) g * os, 0.0f), o1(n);
                    (f16 ? isa->gather_dot_g_f16 : isa->gather_dot_g_f32)(q.data(), g, base.data(), stride, idx.data(), n, d,
                                                                          og.data(), os);
                    (f16 ? isa->gather_axpy_g_f16 : isa->gather_axpy_g_f32)(y0.data(), d, g, base.data(), stride, idx.data(),
                                                                            p.data(), ps, n, d);
                    for (int h = 0; h < g; ++h) {
                        (f16 ? isa->gather_dot_f16 : isa->gather_dot_f32)(q[h], base.data(), stride, idx.data(), n, d, o1.data());
                        (f16 ? isa->gather_axpy_f16 : isa->gather_axpy_f32)(y1.data() + (size_t) h * d, base.data(), stride,
                                                                            idx.data(), p.data() + (size_t) h * ps, n, d);
                        if (memcmp(o1.data(), og.data() + (size_t) h * os, (size_t) n * sizeof(float)) != 0) {
                            fprintf(stderr, "gather_dot_g %s differs: %s g %d d %d n %d head %d\n", name, f16 ? "f16" : "f32", g, d, n, h);
                            return 1;
                        }
                    }
                    if (memcmp(y0.data(), y1.data(), y0.size() * sizeof(float)) != 0) {
                        fprintf(stderr, "gather_axpy_g %s differs: %s g %d d %d n %d\n", name, f16 ? "f16" : "f32", g, d, n);
                        return 1;
                    }
                    cases++;
                }
            }
        }
    }
    printf("gather_dot_g, gather_axpy_g %s: %d cases equal to one head at a time\n", name, cases);
    return 0;
}

int main(int argc, char ** argv) {
    if (argc >= 3 && strcmp(argv[1], "heads-check") == 0) {
        return run_heads_check(argv[2]);
    }
    if (argc >= 3 && strcmp(argv[1], "gather-check") == 0) {
        return run_gather_check(argv[2]);
    }
    if (argc >= 3 && strcmp(argv[1], "scores-check") == 0) {
        return run_scores_check(argv[2]);
    }
#ifdef SPARQ_TEST_WITH_GGML
    if (argc >= 2 && strcmp(argv[1], "params-check") == 0) {
        return run_params_check();
    }
#endif
    if (argc >= 2 && strcmp(argv[1], "isa") == 0) {
        printf("%s\n", sparq_isa_select()->name);
        return 0;
    }
    if (argc >= 3 && strcmp(argv[1], "isa-threads") == 0) {
        return run_isa_threads(std::max(1, std::min(256, atoi(argv[2]))));
    }
    if (argc < 4) {
        fprintf(stderr, "usage: %s direct|ggml CASE OUT [--isa NAME] [--threads N]\n       %s isa\n       %s isa-threads N\n",
                argv[0], argv[0], argv[0]);
        return 2;
    }
    const std::string mode = argv[1];
    const char * isa = nullptr;
    int nth = 1;
    for (int i = 4; i < argc; ++i) {
        if (strcmp(argv[i], "--isa") == 0 && i + 1 < argc) {
            isa = argv[++i];
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            nth = atoi(argv[++i]);
            if (nth < 1 || nth > 256) {
                die("--threads must be in [1, 256]");
            }
        } else {
            die("unknown argument ", argv[i]);
        }
    }
    const test_case c = read_case(argv[2]);
    if (mode == "direct") {
        return run_direct(c, argv[3], isa, nth);
    }
#ifdef SPARQ_TEST_WITH_GGML
    if (mode == "ggml") {
        if (isa) {
            die("--isa is for direct mode; set GGML_SPARQ_ISA for ggml mode");
        }
        return run_ggml(c, argv[3], nth);
    }
#endif
    die("unknown mode ", mode.c_str());
}
