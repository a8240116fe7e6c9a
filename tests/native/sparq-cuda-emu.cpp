// llama-sparq: the CUDA kernels of GGML_OP_SPARQ_ATTN (ggml-sparq/cuda/sparq-cuda-kernels.cuh) run
// on the CPU, one OS thread per CUDA thread of a block (blocks one after another, in a shuffled
// order so that no kernel may rely on which block runs first or last; __syncthreads and the warp
// shuffles are barriers), against the CPU op (sparq_cpu_compute, scalar ISA) on the same inputs. No
// GPU needed: it checks the kernels' indexing, selection (histograms, ranking, radix passes, ties,
// window, bitmap, the calibrated k's cut), attention and mean-V logic, the report (per stream and
// KV head, against the CPU op's), and counts the launches; not the GPU's memory model, timing or
// compiler. SPARQ_EMU_REPORT=1 prints both reports. Built twice: sparq-cuda-emu runs the default
// pipeline, sparq-cuda-emu-exp the experimental build's (SPARQ_CUDA_EXPERIMENTAL: the variants and
// the LLAMA_SPARQ_CUDA_* switches that choose them).
//
//   sparq-cuda-emu d S n_head n_head_kv n_rows n_stream r k l f16 mask sel flags variant
//                  [scalar [cov_p k_min k_frac]]
//
// f16: 0 f32 K, V and K^T; 1 f16; 2 f16 K and V with an 8-bit K^T (e5m2); 3 with a 4-bit K^T (S a
// multiple of 32);
// variant: 0 plain, 1 window list, 2 basis (q_sel, comp_w), 3 stream 0 dense (v_count < 0),
// 4 stream 0 sees 40 cells in the middle (a dense row that skips empty chunks);
// scalar: 1 forces the one-cell K^T loads; cov_p > 0: the calibrated k (coverage target cov_p, at
// least k_min cells, each row's cap from k_frac of its valid cells when k_frac > 0).
// SPARQ_EMU_ORDER=seq runs the blocks in order; SPARQ_EMU_TIES, SPARQ_EMU_PEAK and SPARQ_EMU_HOLE
// shape the inputs (below); SPARQ_EMU_BUCKETS=B (a fixed k) ranks by the bucketed top-k with B
// buckets (topk_buckets) on both sides; SPARQ_EMU_VARIANTS="softcap max_bias sinks [kq_b]" the attention
// variants on both sides (max_bias > 0: each valid cell's mask minus its distance to the end, mod 16;
// sinks 1: a random sink per query head; kq_b 1: a bias per (stream, head, row, cell), small integers
// as ALiBi's distances); SPARQ_EMU_DV=dv V's head size (default d), SPARQ_EMU_V_IN_K=1
// V read through K's rows (its first dv values, as MLA's cache holds its latent). Prints "OK nmse=... select_blocks=B launches=N pdl_launches=P
// report_differ=0 report_reach=M" (B: the second launch's blocks; M: the entries that measured the
// cells reaching the target) or "FAIL ..."
// and exits 0 / 1. The inputs are tie-proof (tests/native/sparq-tie-proof.h: query large on r
// components, keys level * sign there, levels i / 1024), so the selections must be equal.

#include "ggml-sparq-e5m2.h"
#include "sparq-cpu.h"
#include "sparq-tie-proof.h"

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

// the op's selector value with exact scores (enum ggml_sparq_selector, ggml-sparq.h): r = d
static constexpr int EMU_SEL_ORACLE = 1;

// ---------------------------------------------------------------------------
// the CUDA shim
// ---------------------------------------------------------------------------

struct half { uint16_t x; };
struct half2 { half x, y; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct uint2 { unsigned int x, y; };
struct uint4 { unsigned int x, y, z, w; };
struct dim3 {
    unsigned int x, y, z;
    dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
static inline float2 make_float2(float a, float b) { return { a, b }; }
static inline uint2 make_uint2(unsigned int a, unsigned int b) { return { a, b }; }
static inline float __half2float(half h) { return sparq_fp16_to_fp32(h.x); }
static inline half __ushort_as_half(unsigned short x) { return half{ x }; }
static inline float2 __half22float2(half2 h) { return { __half2float(h.x), __half2float(h.y) }; }
static inline unsigned int __float_as_uint(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
template <typename T> static inline T __ldcg(const T * p) { return *p; }
// blocks run one after another: what one block wrote is there for the next
static inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
static inline float sparq_emu_expf(float x) { return expf(x); }
#define __expf sparq_emu_expf // glibc declares a __expf of its own
static inline int __popc(unsigned int x) { return __builtin_popcount(x); }
static inline int __ffs(unsigned int x) { return __builtin_ffs((int) x); }
using std::max;
using std::min;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static   // blocks run one at a time: a function's statics are its block's shared memory

static thread_local dim3 threadIdx, blockIdx, gridDim;

struct emu_warp {
    std::barrier<> bar{ 32 };
    uint64_t buf[32];
};
static thread_local emu_warp * t_warp = nullptr;
static thread_local std::barrier<> * t_block = nullptr;

static inline void __syncthreads() { t_block->arrive_and_wait(); }

template <typename T> static T emu_xchg(T v, int src) {
    static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
    const int lane = threadIdx.x % 32;
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    t_warp->buf[lane] = b;
    t_warp->bar.arrive_and_wait();
    T r;
    memcpy(&r, &t_warp->buf[src], sizeof(T));
    t_warp->bar.arrive_and_wait();
    return r;
}
template <typename T> static T __shfl_sync(unsigned int, T v, int src) { return emu_xchg(v, src & 31); }
template <typename T> static T __shfl_up_sync(unsigned int, T v, unsigned int o) {
    const int l = threadIdx.x % 32;
    return emu_xchg(v, l >= (int) o ? l - (int) o : l);
}
template <typename T> static T __shfl_down_sync(unsigned int, T v, unsigned int o) {
    const int l = threadIdx.x % 32;
    return emu_xchg(v, l + (int) o < 32 ? l + (int) o : l);
}
template <typename T> static T __shfl_xor_sync(unsigned int, T v, int o, int = 32) {
    return emu_xchg(v, (int) (threadIdx.x % 32) ^ o);
}
static unsigned int __ballot_sync(unsigned int, int pred) {
    unsigned int bits = 0;
    for (int l = 0; l < 32; ++l) {
        bits |= (emu_xchg<int>(pred ? 1 : 0, l) ? 1u : 0u) << l;
    }
    return bits;
}
static unsigned int __match_any_sync(unsigned int, unsigned int v) {
    unsigned int bits = 0;
    for (int l = 0; l < 32; ++l) {
        bits |= (emu_xchg<unsigned int>(v, l) == v ? 1u : 0u) << l;
    }
    return bits;
}
// the warp reductions in one exchange (one barrier pair instead of five): every lane sums the 32
// values in lane order, so all lanes agree, as after the butterfly on a GPU
static inline float emu_warp_all(float x, bool is_max) {
    const int lane = threadIdx.x % 32;
    uint64_t b = 0;
    memcpy(&b, &x, sizeof(float));
    t_warp->buf[lane] = b;
    t_warp->bar.arrive_and_wait();
    float r = is_max ? -INFINITY : 0.0f;
    for (int l = 0; l < 32; ++l) {
        float v;
        memcpy(&v, &t_warp->buf[l], sizeof(float));
        r = is_max ? fmaxf(r, v) : r + v;
    }
    t_warp->bar.arrive_and_wait();
    return r;
}
static inline float warp_reduce_sum(float x) { return emu_warp_all(x, false); }
static inline float warp_reduce_max(float x) { return emu_warp_all(x, true); }
static inline int atomicAdd(int * p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned int atomicAdd(unsigned int * p, unsigned int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned int atomicOr(unsigned int * p, unsigned int v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned int atomicInc(unsigned int * p, unsigned int wrap) {
    unsigned int old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (!__atomic_compare_exchange_n(p, &old, old >= wrap ? 0u : old + 1u, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return old;
}
static inline int atomicMax(int * p, int v) {
    int old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (v > old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return old;
}
static inline unsigned long long atomicMax(unsigned long long * p, unsigned long long v) {
    unsigned long long old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (v > old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return old;
}
static inline int atomicMin(int * p, int v) {
    int old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (v < old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return old;
}
template <typename T> static inline T emu_atomic_add_fp(T * p, T v) {
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    const T old = *p;
    *p = old + v;
    return old;
}
static inline float atomicAdd(float * p, float v) { return emu_atomic_add_fp(p, v); }
static inline double atomicAdd(double * p, double v) { return emu_atomic_add_fp(p, v); }

// a persistent team of 256 threads runs each block
struct emu_team {
    static constexpr int N = 256;
    std::barrier<> start{ N + 1 }, done{ N + 1 };
    std::function<void(int)> job;
    int nt = 0;
    bool quit = false;
    std::vector<std::thread> th;
    emu_team() {
        for (int t = 0; t < N; ++t) {
            th.emplace_back([this, t] {
                for (;;) {
                    start.arrive_and_wait();
                    if (quit) {
                        return;
                    }
                    if (t < nt) {
                        job(t);
                    }
                    done.arrive_and_wait();
                }
            });
        }
    }
    ~emu_team() {
        quit = true;
        start.arrive_and_wait();
        for (auto & x : th) {
            x.join();
        }
    }
    void run(int n, std::function<void(int)> f) {
        nt = n;
        job = std::move(f);
        start.arrive_and_wait();
        done.arrive_and_wait();
    }
};
static emu_team * g_team = nullptr;

static int g_launches = 0;
static std::vector<long> g_launch_blocks; // each launch's blocks, in launch order
static std::mt19937 g_order_rng(99);

template <typename... P, typename... A>
static void emu_launch(void (*kernel)(P...), dim3 grid, dim3 block, A... args) {
    const int nt = (int) block.x;
    ++g_launches;
    g_launch_blocks.push_back((long) grid.x * grid.y * grid.z);
    std::vector<dim3> order;
    for (unsigned int z = 0; z < grid.z; ++z) {
        for (unsigned int y = 0; y < grid.y; ++y) {
            for (unsigned int x = 0; x < grid.x; ++x) {
                order.emplace_back(x, y, z);
            }
        }
    }
    const char * seq = getenv("SPARQ_EMU_ORDER");
    if (!seq || strcmp(seq, "seq") != 0) {
        std::shuffle(order.begin(), order.end(), g_order_rng);
    }
    for (const dim3 & b : order) {
        std::barrier<> bb(nt);
        std::unique_ptr<emu_warp[]> warps(new emu_warp[(nt + 31) / 32]);
        g_team->run(nt, [&](int t) {
            threadIdx = dim3(t);
            blockIdx = b;
            gridDim = grid;
            t_block = &bb;
            t_warp = &warps[t / 32];
            kernel(args...);
        });
    }
}

// A programmatic dependent launch: here blocks run after the predecessor's anyway, so the wait and
// the go-ahead do nothing; what is checked is that every thread of every block of such a launch
// waits once (a block that skipped it could read the predecessor's scratch early on a GPU, and a
// grid that never waits could end before its predecessor)
static std::atomic<long> g_pdl_waits{ 0 };
static int g_pdl_launches = 0, g_pdl_bad = 0;
static inline void ggml_cuda_pdl_sync() { ++g_pdl_waits; }
static inline void ggml_cuda_pdl_lc() {}

template <typename... P, typename... A>
static void emu_launch_pdl(void (*kernel)(P...), dim3 grid, dim3 block, A... args) {
    const long before = g_pdl_waits.load();
    emu_launch(kernel, grid, block, args...);
    ++g_pdl_launches;
    g_pdl_bad += g_pdl_waits.load() - before != (long) grid.x * grid.y * grid.z * block.x;
}

typedef int sparq_stream_t;
#define SPARQ_LAUNCH(kernel, grid, block, stream, ...) (emu_launch(kernel, dim3(grid), dim3(block), __VA_ARGS__), (void) (stream))
#define SPARQ_LAUNCH_PDL(kernel, grid, block, stream, ...) \
    (emu_launch_pdl(kernel, dim3(grid), dim3(block), __VA_ARGS__), (void) (stream))

#include "sparq-cuda-kernels.cuh"

// ---------------------------------------------------------------------------
// the driver
// ---------------------------------------------------------------------------

static void noop_barrier(void *) {}

int main(int argc, char ** argv) {
    if (argc < 15) {
        fprintf(stderr, "usage: %s d S n_head n_head_kv n_rows n_stream r k l f16 mask sel flags variant "
                        "[scalar [cov_p k_min k_frac]]\n", argv[0]);
        return 2;
    }
    const int d = atoi(argv[1]), S = atoi(argv[2]), nh = atoi(argv[3]), nhkv = atoi(argv[4]), nr = atoi(argv[5]);
    const int ns = atoi(argv[6]), r = atoi(argv[7]), k = atoi(argv[8]), l = atoi(argv[9]);
    const bool f16 = atoi(argv[10]) != 0, use_mask = atoi(argv[11]) != 0;
    const bool e5m2 = atoi(argv[10]) == 2; // K^T in 8 bits
    const bool kt4 = atoi(argv[10]) == 3;  // K^T in 4 bits (ggml-sparq-kt4.h)
    if (kt4 && S % GGML_SPARQ_KT4_CELLS != 0) {
        fprintf(stderr, "a 4-bit K^T needs S a multiple of %d\n", GGML_SPARQ_KT4_CELLS);
        return 2;
    }
    const int sel = atoi(argv[12]), flags = atoi(argv[13]), variant = atoi(argv[14]);
    const bool force_scalar = argc > 15 && atoi(argv[15]) != 0;
    const float cov_p = argc > 18 ? (float) atof(argv[16]) : 0.0f;
    const int cov_k_min = argc > 18 ? atoi(argv[17]) : 0;
    const float cov_k_frac = argc > 18 ? (float) atof(argv[18]) : 0.0f;
    const int g = nh / nhkv;
    const int rr = sel == EMU_SEL_ORACLE ? d : r;
    const int dv = getenv("SPARQ_EMU_DV") ? atoi(getenv("SPARQ_EMU_DV")) : d;
    const bool v_in_k = getenv("SPARQ_EMU_V_IN_K") && atoi(getenv("SPARQ_EMU_V_IN_K")) != 0;
    if (dv < 1 || (v_in_k && dv > d)) {
        fprintf(stderr, "SPARQ_EMU_DV must be >= 1 (at most d with SPARQ_EMU_V_IN_K), got %d\n", dv);
        return 2;
    }
    const size_t esz = f16 ? 2 : 4;

    std::mt19937 gen(1234 + d + S + nh + r + k + l + variant);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f), wd(0.5f, 2.0f);
    const sparq_tie_proof tp(d, rr, gen);
    const size_t nq = (size_t) d * nr * nh * ns, nkv = (size_t) d * S * nhkv * ns;
    std::vector<float> q(nq), qsel(nq), cw((size_t) d * nhkv * ns);
    if (variant == 2) {
        for (auto & x : q) {
            x = uni(gen);
        }
        tp.query(qsel, gen);
        for (auto & x : cw) {
            x = wd(gen);
        }
    } else {
        tp.query(q, gen);
    }
    const size_t nv = (size_t) dv * S * nhkv * ns;
    std::vector<float> Kf(nkv), Vf(nv);
    tp.keys(Kf, gen);
    // SPARQ_EMU_PEAK=f: the query times f and the cells [p0, p0 + 256) (p0: the score tile of 2048
    // cells at S / 2) on the top levels (3/4 to 1), every other cell at most 1/2: one tile holds
    // almost all of the softmax (levels still on the grid i / 1024; its own generator, so that the
    // other inputs stay as without it)
    if (const char * pe = getenv("SPARQ_EMU_PEAK")) {
        const float f = (float) atof(pe);
        for (auto & x : variant == 2 ? qsel : q) {
            x *= f;
        }
        std::mt19937 pg(777);
        const int p0 = (S / 2) & ~2047;
        for (size_t c = 0; c < Kf.size() / (size_t) d; ++c) {
            const int cell = (int) (c % (size_t) S);
            const int i = cell >= p0 && cell < p0 + 256 ? 768 + (int) (pg() % 257) : (int) (pg() % 1537) - 1024;
            for (int j = 0; j < d; ++j) {
                if (tp.in_j[j]) {
                    Kf[c * d + j] = (float) i / 1024.0f * tp.sgn[j];
                }
            }
        }
    }
    // SPARQ_EMU_TIES=n: every cell's key row a copy of the first of its group of n cells, so that
    // groups of n exactly equal keys meet the k-th key (the select ranks ties to the lower cell, as
    // the CPU op does)
    const char * ties_env = getenv("SPARQ_EMU_TIES");
    const int ties = ties_env ? atoi(ties_env) : 0;
    if (ties > 1) {
        for (int b = 0; b < ns * nhkv; ++b) {
            for (int c = 0; c < S; ++c) {
                const int c0 = c - c % ties;
                for (int j = 0; j < d; ++j) {
                    Kf[((size_t) b * S + c) * d + j] = Kf[((size_t) b * S + c0) * d + j];
                }
            }
        }
    }
    for (auto & x : Vf) {
        x = uni(gen);
    }
    // caches in their type; K^T the keys again, cell-contiguous
    const size_t tsz = e5m2 ? 1 : esz;
    // a 4-bit K^T's rows: S / 32 blocks of 20 bytes each (tb1 below)
    std::vector<uint8_t> K(nkv * esz), KT(kt4 ? nkv / GGML_SPARQ_KT4_CELLS * GGML_SPARQ_KT4_BYTES : nkv * tsz), V(nv * esz);
    auto put = [&](std::vector<uint8_t> & dst, size_t i, float x) {
        if (f16) {
            const uint16_t h = sparq_fp32_to_fp16(x);
            memcpy(&dst[i * 2], &h, 2);
        } else {
            memcpy(&dst[i * 4], &x, 4);
        }
    };
    for (int b = 0; b < ns * nhkv; ++b) {
        for (int c = 0; c < S; ++c) {
            for (int j = 0; j < d; ++j) {
                const size_t ik = ((size_t) b * S + c) * d + j;
                put(K, ik, Kf[ik]);
                const size_t it = ((size_t) b * d + j) * S + c;
                if (e5m2) {
                    KT[it] = ggml_sparq_f16_to_e5m2(sparq_fp32_to_fp16(Kf[ik]));
                } else if (kt4) {
                    const size_t rb = (size_t) S / GGML_SPARQ_KT4_CELLS * GGML_SPARQ_KT4_BYTES;
                    ggml_sparq_kt4_put(KT.data() + ((size_t) b * d + j) * rb, c, sparq_fp32_to_fp16(Kf[ik]));
                } else {
                    put(KT, it, Kf[ik]);
                }
            }
        }
    }
    for (size_t b = 0; b < (size_t) ns * nhkv * S; ++b) {
        for (int j = 0; j < dv; ++j) {
            put(V, b * dv + j, Vf[b * dv + j]);
        }
    }
    std::vector<float> vsum((size_t) dv * nhkv * ns), vcount(ns, (float) S);
    for (auto & x : vsum) {
        x = uni(gen) * 10.0f;
    }
    if (variant == 3) {
        vcount[0] = -(float) S;
    }
    float emu_softcap = 0.0f, emu_max_bias = 0.0f;
    int emu_sinks = 0, emu_kq_b = 0;
    if (const char * ve = getenv("SPARQ_EMU_VARIANTS")) {
        const int nv = sscanf(ve, "%f %f %d %d", &emu_softcap, &emu_max_bias, &emu_sinks, &emu_kq_b);
        if (nv != 3 && nv != 4) {
            fprintf(stderr, "SPARQ_EMU_VARIANTS must be \"softcap max_bias sinks [kq_b]\", got %s\n", ve);
            return 2;
        }
    }
    // the KQ bias [ns][nh][nr][S] (ggml's [S, nr, nh, ns]): integers 0..15, exact in f32
    std::vector<float> kq_b(emu_kq_b ? (size_t) S * nr * nh * ns : 0);
    for (size_t i = 0; i < kq_b.size(); ++i) {
        kq_b[i] = (float) (gen() % 16);
    }
    const size_t kbb1 = (size_t) S * 4, kbb2 = kbb1 * nr, kbb3 = kbb2 * nh;
    std::vector<float> sinks(nh);
    for (auto & x : sinks) {
        x = 2.0f * uni(gen);
    }
    std::vector<uint16_t> mask((size_t) S * nr * ns);
    // SPARQ_EMU_HOLE=1: the cells [S / 4, S / 2) masked in every row (whole score tiles without a
    // valid cell, and tiles cut by the hole)
    const bool hole = getenv("SPARQ_EMU_HOLE") && atoi(getenv("SPARQ_EMU_HOLE")) != 0;
    for (int st = 0; st < ns; ++st) {
        std::vector<char> blk((S + 31) / 32);
        for (auto & b : blk) {
            b = (gen() % 5) == 0;
        }
        for (int i = 0; i < nr; ++i) {
            for (int c = 0; c < S; ++c) {
                bool valid = c < S - (nr - 1 - i) && !blk[c / 32] && !(hole && c >= S / 4 && c < S / 2);
                if (variant == 4 && st == 0) {
                    valid = c >= S / 2 && c < S / 2 + 40; // a short sequence in a long cache: a dense row
                }
                const float bias = emu_max_bias > 0.0f ? -(float) ((S - 1 - c) % 16) : 0.0f; // ALiBi's distances
                mask[((size_t) st * nr + i) * S + c] = sparq_fp32_to_fp16(valid ? bias : -INFINITY);
            }
        }
    }
    const int wn = std::max(l, 1);
    std::vector<int32_t> win((size_t) wn * nr * ns);
    for (size_t i = 0; i < win.size(); ++i) {
        const uint32_t x = gen();
        win[i] = (x % 11) == 0 ? -1 : ((x % 7) == 0 && i > 0) ? win[i - 1] : (int32_t) (x % S);
    }
    const size_t nout = (size_t) dv * nh * nr * ns;
    std::vector<float> out_cpu(nout, NAN), out_gpu(nout, NAN);

    // the CPU op
    sparq_args c;
    memset(&c, 0, sizeof(c));
    c.d = d; c.dv = dv; c.n_kv = S; c.n_rows = nr; c.n_head = nh; c.n_head_kv = nhkv; c.n_stream = ns;
    c.r = r; c.k = k; c.l = l; c.scale = 1.0f / sqrtf((float) d); c.selector = sel;
    c.per_head = (flags & 1) != 0; c.no_mean_v = (flags & 2) != 0;
    const size_t qb1 = d * 4, qb2 = qb1 * nr, qb3 = qb2 * nh;
    c.q = q.data(); c.q_nb1 = qb1; c.q_nb2 = qb2; c.q_nb3 = qb3;
    const size_t kb1 = d * esz, kb2 = kb1 * S, kb3 = kb2 * nhkv;
    const size_t tb1 = kt4 ? (size_t) S / GGML_SPARQ_KT4_CELLS * GGML_SPARQ_KT4_BYTES : S * tsz, tb2 = tb1 * d, tb3 = tb2 * nhkv;
    const sparq_type ct = f16 ? SPARQ_F16 : SPARQ_F32;
    c.K = K.data(); c.K_type = ct; c.K_nb1 = kb1; c.K_nb2 = kb2; c.K_nb3 = kb3;
    c.KT = KT.data(); c.KT_type = e5m2 ? SPARQ_E5M2 : kt4 ? SPARQ_KT4 : ct; c.KT_nb1 = tb1; c.KT_nb2 = tb2; c.KT_nb3 = tb3;
    const size_t vb1 = v_in_k ? kb1 : dv * esz, vb2 = v_in_k ? kb2 : vb1 * S, vb3 = v_in_k ? kb3 : vb2 * nhkv;
    const uint8_t * vdata = v_in_k ? K.data() : V.data();
    c.V = vdata; c.V_type = ct; c.V_nb1 = vb1; c.V_nb2 = vb2; c.V_nb3 = vb3;
    c.v_sum = vsum.data(); c.v_sum_nb1 = dv * 4; c.v_sum_nb2 = (size_t) dv * 4 * nhkv;
    c.v_count = vcount.data();
    const size_t mb1 = S * 2, mb3 = mb1 * nr;
    if (use_mask) {
        c.mask = mask.data(); c.mask_type = SPARQ_F16; c.mask_nb1 = mb1; c.mask_nb3 = mb3; c.mask_ne3 = ns;
    }
    const size_t ob1 = dv * 4, ob2 = ob1 * nh, ob3 = ob2 * nr;
    c.out = out_cpu.data(); c.out_nb1 = ob1; c.out_nb2 = ob2; c.out_nb3 = ob3;
    if (variant == 1) {
        c.win = win.data(); c.win_nb1 = wn * 4; c.win_nb2 = (size_t) wn * 4 * nr; c.win_n = wn;
    }
    if (variant == 2) {
        c.q_sel = qsel.data(); c.q_sel_nb1 = qb1; c.q_sel_nb2 = qb2; c.q_sel_nb3 = qb3;
        c.comp_w = cw.data(); c.comp_w_nb1 = d * 4; c.comp_w_nb2 = (size_t) d * 4 * nhkv;
    }
    if (cov_p > 0.0f) {
        c.cov_p = cov_p; c.cov_apply = 1; c.k_min = cov_k_min; c.k_scan = 0; c.k_frac = cov_k_frac;
    }
    const char * buckets_env = getenv("SPARQ_EMU_BUCKETS");
    const int buckets = buckets_env && cov_p <= 0.0f ? atoi(buckets_env) : 0;
    c.topk_buckets = buckets;
    c.softcap = emu_softcap; c.max_bias = emu_max_bias; c.sinks = emu_sinks ? sinks.data() : nullptr;
    if (emu_kq_b) {
        c.kq_b = kq_b.data(); c.kq_b_nb1 = kbb1; c.kq_b_nb2 = kbb2; c.kq_b_nb3 = kbb3; c.kq_b_ne3 = ns;
    }
    c.sel_n = sparq_sel_max(&c);
    // the report (per stream and KV head, 4 floats): the CPU op's against the kernels'
    std::vector<float> rep_cpu((size_t) ns * nhkv * 4, -2.0f), rep_gpu((size_t) ns * nhkv * 4, -2.0f);
    c.report = rep_cpu.data();
    std::vector<int32_t> sel_cpu((size_t) c.sel_n * nhkv * nr * ns);
    c.sel_out = sel_cpu.data();
    std::vector<uint8_t> work(sparq_cpu_work_size(&c, 1));
    sparq_cpu_compute(&c, &sparq_isa_scalar, work.data(), work.size(), 0, 1, noop_barrier, nullptr);

    // the CUDA kernels, emulated
    sparq_cu_args a = {};
    a.d = d; a.dv = dv; a.n_kv = S; a.n_rows = nr; a.n_head = nh; a.n_head_kv = nhkv; a.n_stream = ns; a.g = g;
    a.ph = (flags & 1) && g > 1 ? g : 1;
    a.no_mean_v = (flags & 2) != 0;
    a.r = sel == EMU_SEL_ORACLE ? d : r; a.k = k; a.l = l; a.scale = c.scale;
    a.cov_p = cov_p; a.k_min = cov_k_min; a.k_frac = cov_p > 0.0f ? cov_k_frac : 0.0f;
    a.buckets = buckets > 0 ? std::max(1, std::min(buckets, S)) : 0; // (as sparq_cuda_args_of)
    a.softcap = emu_softcap; a.max_bias = emu_max_bias; a.sinks = emu_sinks ? sinks.data() : nullptr;
    if (emu_kq_b) {
        a.kq_b = (const char *) kq_b.data(); a.kb_nb1 = kbb1; a.kb_nb2 = kbb2; a.kb_nb3 = kbb3; a.kb_ne3 = ns;
    }
    a.R = ns * nr; a.U = a.R * nhkv; a.L = a.U * a.ph;
    a.W = std::max(1, (S + 31) / 32);
    const int gm = sparq_gmax(g);
    const int cpt = !force_scalar && S % sparq_vec_cpt(gm) == 0 ? sparq_vec_cpt(gm) : 1;
    a.tl_a = SPARQ_NT * cpt;
    a.nt_a = std::max(1, (S + a.tl_a - 1) / a.tl_a);
    a.nt_s = std::max(1, (S + SPARQ_TS - 1) / SPARQ_TS);
    a.sel_max = a.ph * k;
    a.q = (const char *) q.data(); a.q_nb1 = qb1; a.q_nb2 = qb2; a.q_nb3 = qb3;
    const std::vector<float> & qq = variant == 2 ? qsel : q;
    a.qs = (const char *) qq.data(); a.qs_nb1 = qb1; a.qs_nb2 = qb2; a.qs_nb3 = qb3;
    if (variant == 2) {
        a.cw = (const char *) cw.data(); a.cw_nb1 = d * 4; a.cw_nb2 = (size_t) d * 4 * nhkv;
    }
    a.K = (const char *) K.data(); a.K_nb1 = kb1; a.K_nb2 = kb2; a.K_nb3 = kb3;
    a.KT = (const char *) KT.data(); a.KT_nb1 = tb1; a.KT_nb2 = tb2; a.KT_nb3 = tb3;
    a.V = (const char *) vdata; a.V_nb1 = vb1; a.V_nb2 = vb2; a.V_nb3 = vb3;
    a.v_sum = (const char *) vsum.data(); a.vs_nb1 = dv * 4; a.vs_nb2 = (size_t) dv * 4 * nhkv;
    a.v_count = vcount.data();
    if (use_mask) {
        a.mask = (const char *) mask.data(); a.mask_f16 = 1; a.m_nb1 = mb1; a.m_nb3 = mb3; a.m_ne3 = ns;
    }
    if (variant == 1) {
        a.win = (const char *) win.data(); a.win_nb1 = wn * 4; a.win_nb2 = (size_t) wn * 4 * nr; a.win_n = wn;
    }
    a.out = (char *) out_gpu.data(); a.o_nb1 = ob1; a.o_nb2 = ob2; a.o_nb3 = ob3;
    // the layer's persistent tickets, zeroed once (as the llama glue's), kept in a where the one launch
    // applies (the experimental build's); SPARQ_EMU_NO_TICKETS=1: none (a graph without the glue, as
    // test-backend-ops'), so the op takes three launches
    std::vector<unsigned int> tickets(GGML_CUDA_SPARQ_TICKETS, 0u);
    const int kt = e5m2 ? SPARQ_CU_KT_E5M2 : kt4 ? SPARQ_CU_KT_KT4 : f16 ? SPARQ_CU_KT_F16 : SPARQ_CU_KT_F32;
#ifdef SPARQ_CUDA_EXPERIMENTAL
    const char * no_tickets = getenv("SPARQ_EMU_NO_TICKETS");
    a.tickets = no_tickets && atoi(no_tickets) != 0 ? nullptr : tickets.data();
    if (!sparq_fused_applies(a, kt, f16, f16)) {
        a.tickets = nullptr;
    }
#endif
    const bool fused = a.tickets != nullptr;
    const sparq_cu_scratch z = sparq_cu_scratch_sizes(a);
    // the scratch starts dirty, as the pool's does: the kernels must clear what they accumulate into
    auto dirty = [](auto & v) { memset(v.data(), 0xa5, v.size() * sizeof(v[0])); };
    std::vector<sparq_cu_row> rows(z.rows);
    std::vector<unsigned int> wbits(z.wbits), hist(z.hist), ldone(z.ldone), udone(z.udone), selbits(z.selbits);
    std::vector<int> tcnt(z.tcnt), selv(z.sel);
    std::vector<float> logits(z.logits), keys(z.keys), pstat(z.pstat), py(z.py);
    std::vector<double> hmass(z.hmass);
    std::vector<float2> tstat(z.tstat);
    std::vector<uint2> cand(z.cand);
    std::vector<unsigned int> ncand(z.ncand);
    std::vector<unsigned long long> bk(z.bk);
    dirty(cand); dirty(ncand); dirty(bk);
    a.cand = cand.data(); a.ncand = ncand.data(); a.bk = bk.data();
    dirty(rows); dirty(wbits); dirty(hist); dirty(ldone); dirty(udone); dirty(selbits); dirty(tcnt);
    dirty(selv); dirty(logits); dirty(keys); dirty(pstat); dirty(py); dirty(hmass); dirty(tstat);
    a.rows = rows.data(); a.wbits = wbits.data(); a.logits = logits.data(); a.tstat = tstat.data(); a.tcnt = tcnt.data();
    a.keys = keys.data(); a.hist = hist.data(); a.hmass = hmass.data(); a.ldone = ldone.data(); a.udone = udone.data();
    a.selbits = selbits.data(); a.sel = selv.data(); a.pstat = pstat.data(); a.py = py.data();
    std::vector<int> lrep(z.lrep);
    dirty(lrep);
    a.report = rep_gpu.data();
    a.lrep = cov_p > 0.0f ? lrep.data() : nullptr;
    emu_team team;
    g_team = &team;
    sparq_cu_run(a, cpt, kt, f16, f16, 0);

    // outputs
    double num = 0.0, den = 0.0, maxd = 0.0;
    for (size_t i = 0; i < nout; ++i) {
        const double e = (double) out_gpu[i] - out_cpu[i];
        num += e * e;
        den += (double) out_cpu[i] * out_cpu[i];
        maxd = std::max(maxd, std::fabs(e));
        if (!std::isfinite(out_gpu[i]) || !std::isfinite(out_cpu[i])) {
            printf("FAIL non-finite output at %zu: gpu %g cpu %g\n", i, out_gpu[i], out_cpu[i]);
            return 1;
        }
    }
    const double nmse = den > 0 ? num / den : num;
    // selections of the SparQ rows: the unit's bitmap against the CPU's list; a unit is diffuse (the
    // calibrated k: some list short of the target within the cap, which keeps the cap's best cells)
    // by the GPU's list reports, the CPU's reports of the last rows compared below
    int n_sparse = 0, n_diff = 0, n_diffuse = 0;
    long n_cells = 0;
    for (int u = 0; u < a.U; ++u) {
        if (rows[fused ? u : u / nhkv].mode != 0) { // (fused: a row description per unit)
            continue;
        }
        ++n_sparse;
        if (a.lrep) {
            bool diffuse = false;
            for (int h = 0; h < a.ph; ++h) {
                const int * lr = &lrep[2 * ((size_t) u * a.ph + h)];
                diffuse |= lr[0] >= 0 && lr[1] == 0;
            }
            n_diffuse += diffuse;
        }
        std::set<int> gs, cs;
        for (int c0 = 0; c0 < S; ++c0) {
            if ((selbits[(size_t) u * a.W + c0 / 32] >> (c0 % 32)) & 1u) {
                gs.insert(c0);
            }
        }
        for (int t = 0; t < c.sel_n; ++t) {
            const int32_t x = sel_cpu[(size_t) u * c.sel_n + t];
            if (x >= 0) {
                cs.insert(x);
            }
        }
        n_cells += (long) gs.size();
        if (gs != cs) {
            if (n_diff++ == 0) {
                printf("unit %d: %zu cells on the GPU, %zu on the CPU\n", u, gs.size(), cs.size());
            }
        }
    }
    // the report entries: the cells attended and whether the target was reached equal; the coverage
    // (alpha) to rounding; the cells reaching the target equal where it was reached, else (a diffuse
    // unit: the GPU ranks no further than the cap) both at least the row's cap
    int rep_differ = 0, rep_reach = 0;
    for (int st = 0; st < ns; ++st) {
        const sparq_cu_row & ri = rows[((size_t) st * nr + nr - 1) * (fused ? nhkv : 1)];
        for (int h = 0; h < nhkv; ++h) {
            const float * ec = &rep_cpu[((size_t) st * nhkv + h) * 4];
            const float * eg = &rep_gpu[((size_t) st * nhkv + h) * 4];
            bool same = ec[0] == eg[0] && ec[3] == eg[3] && std::fabs(ec[1] - eg[1]) <= 1e-4f * std::max(1.0f, std::fabs(ec[1]));
            if (ec[3] > 0.0f || ec[2] < 0.0f) {
                same &= ec[2] == eg[2];
            } else {
                const int rk = cov_k_frac > 0.0f ? std::max(cov_k_min, (int) std::ceil((double) cov_k_frac * ri.n_valid)) : k;
                const float cap = (float) std::min(k, rk);
                same &= eg[2] >= cap && ec[2] >= cap;
            }
            rep_reach += eg[2] >= 0.0f;
            if (getenv("SPARQ_EMU_REPORT")) {
                printf("report %d %d: GPU {%g %g %g %g} CPU {%g %g %g %g}\n", st, h, eg[0], eg[1], eg[2], eg[3], ec[0], ec[1],
                       ec[2], ec[3]);
            }
            if (!same && rep_differ++ == 0) {
                printf("report of stream %d, KV head %d: GPU {%g %g %g %g}, CPU {%g %g %g %g}\n", st, h, eg[0], eg[1], eg[2],
                       eg[3], ec[0], ec[1], ec[2], ec[3]);
            }
        }
    }
    // every launch leaves the tickets zero for the next (a captured graph replays it as it is)
    const bool tickets_zero = std::all_of(tickets.begin(), tickets.end(), [](unsigned int x) { return x == 0u; });
    if (!tickets_zero) {
        printf("the tickets are not zero after the launch\n");
    }
    if (g_pdl_bad) {
        printf("%d programmatic dependent launches had a block or thread that did not wait once\n", g_pdl_bad);
    }
    const bool ok = nmse <= 1e-9 && n_diff == 0 && rep_differ == 0 && g_pdl_bad == 0 && tickets_zero;
    // what the launch chose (the switches of the experimental build, read once per process)
#ifdef SPARQ_CUDA_EXPERIMENTAL
    const bool radix = sparq_select_radix_way() == 2, atomic = sparq_select_hist_way() == 2, early = sparq_select_loads_way() == 2;
    const int score_hist = sparq_score_hist_applies(a), calib_hist = sparq_calib_hist_applies(a);
    const int streamed = sparq_attend_stream_applies(a), kv_vec = streamed && sparq_attend_kv_vec(a, f16, f16);
    const int parts = fused ? 1 : sparq_exp_attend_parts(a);
#else
    const bool radix = false, atomic = false, early = false;
    const int score_hist = 0, calib_hist = 0, streamed = 0, kv_vec = 0, parts = sparq_attend_parts(a);
#endif
    printf("%s nmse=%.3g max_abs=%.3g sparq_units=%d diffuse_units=%d mean_cells=%.1f sel_differ=%d cpt=%d select=%s "
           "hist=%s loads=%s score_hist=%d calib_hist=%d select_blocks=%ld stream=%d kv_vec=%d attend_parts=%d fused=%d "
           "launches=%d pdl_launches=%d report_differ=%d report_reach=%d buckets=%d\n",
           ok ? "OK" : "FAIL", nmse, maxd, n_sparse, n_diffuse, n_sparse > 0 ? (double) n_cells / n_sparse : 0.0, n_diff,
           cpt, radix ? "radix" : "rank", atomic ? "atomic" : "match", early ? "early" : "late", score_hist, calib_hist,
           g_launch_blocks.size() > 1 ? g_launch_blocks[1] : 0L, streamed, kv_vec, parts, (int) fused, g_launches,
           g_pdl_launches, rep_differ, rep_reach, a.buckets);
    return ok ? 0 : 1;
}
