// llama-sparq: the host rebuild of a stream's K^T and sums from K, V and the cells (multi-threaded
// over layers and cell ranges), also the check of the kept data against that recomputation; data
// on a device is rebuilt there (llama-sparq-rebuild-device.cpp).
#include "llama-sparq-rebuild.h"

#include "llama-sparq-elems.h"
#include "llama-sparq-parallel.h"
#include "llama-sparq-selector.h"
#include "llama-sparq-state.h"
#include "llama-sparq-transfers.h"
#include "llama-sparq-upstream.h"

#include "ggml-backend.h"

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

// f16 -> f32 for every bit pattern (built once; thread-safe initialisation)
static const float * sparq_f16_table() {
    static const std::vector<float> tab = [] {
        std::vector<float> t(65536);
        for (uint32_t i = 0; i < 65536; ++i) {
            t[i] = ggml_fp16_to_fp32((ggml_fp16_t) i);
        }
        return t;
    }();
    return tab.data();
}

// a view of rows [c0, c1) of one stream of a [E, kv_size, n_stream] cache tensor (K or V):
// the tensor's memory when it is in host memory, else a copy
struct sparq_rows {
    const uint8_t * p = nullptr;
    std::vector<uint8_t> copy;
    sparq_rows(const ggml_tensor * t, uint32_t strm, uint32_t c0, uint32_t c1) {
        const size_t off = strm * t->nb[2] + (size_t) c0 * t->nb[1], n = (size_t) (c1 - c0) * t->nb[1];
        if (ggml_backend_buffer_is_host(t->buffer)) {
            p = (const uint8_t *) t->data + off;
        } else {
            copy.resize(n);
            sparq_tensor_get(t, copy.data(), off, n);
            p = copy.data();
        }
    }
};

// a rebuild of one stream: its used cells [u0, u1), those left out of the V sums, and the jobs
// (layer, cell range): ranges of >= 256 cells, about 4 jobs per thread in all
struct sparq_rebuild_plan {
    uint32_t strm = 0;
    const llama_kv_cells * cells = nullptr;
    uint32_t kv_size = 0, u0 = 0, u1 = 0, nu = 0;
    std::vector<uint8_t> out; // over [u0, u1): 1 where the cell is left out of the sums (the ubatch writes it)
    int nth = 1;              // threads
    std::vector<size_t> lay;  // the layers with K^T
    uint32_t chunk = 0, n_chunks = 0;
    bool check = false;
    bool kt4 = false;         // a 4-bit K^T: [u0, u1) and the chunks cover whole blocks of 32 cells
};

// what one job leaves: its range's partial sums of V and of k^2, and with check its largest K^T difference
struct sparq_rebuild_part {
    std::vector<double> vs, ks;
    double diff = 0.0;
};

static sparq_rebuild_plan sparq_rebuild_plan_make(const llama_sparq_ctx & S, uint32_t strm, const std::vector<uint32_t> & skip,
                                                  bool check) {
    sparq_rebuild_plan P;
    P.strm = strm;
    P.check = check;
    P.cells = &upstream::cells(S.kv, strm);
    P.kv_size = upstream::kv_size(S.kv);
    P.u0 = P.cells->used_min();
    P.u1 = P.cells->used_max_p1();
    for (const sparq_layer & L : S.layers) {
        P.kt4 = P.kt4 || (L.data.kt && L.data.kt->type == GGML_TYPE_Q4_1);
    }
    if (P.kt4 && P.u1 > P.u0) {
        P.u0 -= P.u0 % GGML_SPARQ_KT4_CELLS;
        P.u1 = std::min(P.kv_size, (P.u1 + GGML_SPARQ_KT4_CELLS - 1) / GGML_SPARQ_KT4_CELLS * GGML_SPARQ_KT4_CELLS);
    }
    P.nu = P.u1 > P.u0 ? P.u1 - P.u0 : 0;

    // what to leave out of the V sums, over [u0, u1)
    P.out.assign(P.nu, 0);
    for (uint32_t c : skip) {
        if (c >= P.u0 && c < P.u1) {
            P.out[c - P.u0] = 1;
        }
    }

    // jobs: (layer, cell range); ranges of >= 256 cells, about 4 jobs per thread in all
    P.nth = std::max(1, S.lctx ? (int) upstream::cparams(S.lctx).n_threads : (int) std::thread::hardware_concurrency());
    for (size_t ikv = 0; ikv < S.layers.size(); ++ikv) {
        if (S.layers[ikv].data.kt) {
            P.lay.push_back(ikv);
        }
    }
    const size_t want = std::max<size_t>(1, (4 * (size_t) P.nth + P.lay.size() - 1) / std::max<size_t>(1, P.lay.size()));
    P.chunk = std::max<uint32_t>(256, (uint32_t) ((P.nu + want - 1) / want));
    P.chunk += P.kt4 ? (GGML_SPARQ_KT4_CELLS - P.chunk % GGML_SPARQ_KT4_CELLS) % GGML_SPARQ_KT4_CELLS : 0;
    P.n_chunks = P.nu ? (P.nu + P.chunk - 1) / P.chunk : 1;
    return P;
}

// x[0..E) with each block of n values rotated back from upstream's Hadamard rotation (a quantized K
// cache) the way ggml's CPU backend computes that product in the graph's appends (a fast Walsh-Hadamard
// transform: scaled first, then the butterflies in this order; upstream's ggml_compute_forward_fwht), so
// that a rebuild gives K^T and the sums of k^2 the appends' bits
static void sparq_unrotate_row(float * x, size_t E, int64_t n) {
    const float scale = 1.0f / sqrtf((float) n);
    for (size_t b0 = 0; b0 + n <= E; b0 += n) {
        float * y = x + b0;
        for (int64_t j = 0; j < n; ++j) {
            y[j] *= scale;
        }
        for (int64_t len = 1; len < n; len <<= 1) {
            for (int64_t i = 0; i < n; i += 2 * len) {
                for (int64_t j = 0; j < len; ++j) {
                    const float u = y[i + j], v = y[i + len + j];
                    y[i + j] = u + v;
                    y[i + len + j] = u - v;
                }
            }
        }
    }
}

// Sums over the used cells of [a, b) but those left out (V, or with squares the squares of K for the
// scaled basis's weights) of the n-element rows p (row c - a at p + (c - a) * nb1): f32 partial sums
// over blocks of 256 cells (vectorised; f16 through a table; quantized rows dequantized first, the
// values as the cache holds them, and with unrot > 0 rotated back: sparq_unrotate_row), accumulated in
// f64 into acc.
// A kernel loop: kept whole for its vectorisation.
static void sparq_sum_rows(const sparq_rebuild_plan & P, uint32_t a, uint32_t b, const uint8_t * p, size_t nb1,
                           ggml_type type, size_t n, bool squares, double * acc, int64_t unrot = 0) {
    const float * f16 = sparq_f16_table();
    const llama_kv_cells & cells = *P.cells;
    std::vector<float> blk(n), deq(ggml_is_quantized(type) ? n : 0);
    for (uint32_t c0 = a; c0 < b; c0 += 256) {
        const uint32_t c1 = std::min(b, c0 + 256);
        std::fill(blk.begin(), blk.end(), 0.0f);
        float * __restrict bs = blk.data();
        for (uint32_t c = c0; c < c1; ++c) {
            if (cells.is_empty(c) || P.out[c - P.u0]) {
                continue;
            }
            const uint8_t * row = p + (size_t) (c - a) * nb1;
            if (!deq.empty()) {
                sparq_row_f32(row, type, (int64_t) n, deq.data());
                if (unrot > 0) {
                    sparq_unrotate_row(deq.data(), n, unrot);
                }
                const float * __restrict x = deq.data();
                for (size_t j = 0; j < n; ++j) {
                    bs[j] += squares ? x[j] * x[j] : x[j];
                }
            } else if (type == GGML_TYPE_F16) {
                const uint16_t * __restrict x = (const uint16_t *) row;
                for (size_t j = 0; j < n; ++j) {
                    const float f = f16[x[j]];
                    bs[j] += squares ? f * f : f;
                }
            } else {
                const float * __restrict x = (const float *) row;
                for (size_t j = 0; j < n; ++j) {
                    bs[j] += squares ? x[j] * x[j] : x[j];
                }
            }
        }
        for (size_t j = 0; j < n; ++j) {
            acc[j] += bs[j];
        }
    }
}

// The n rows of E components of src (row stride rs, element size esz: 2 or 4 bytes) transposed into
// dst (component j's n cells at dst + j * ld elements), in tiles of 256 cells x 64 components: the
// tile's source rows stay in cache, and each destination row gets 512 contiguous bytes (f16) per tile
static void sparq_transpose_keys(const uint8_t * src, size_t rs, size_t esz, size_t E, uint32_t n, uint8_t * dst, size_t ld) {
    for (uint32_t c0 = 0; c0 < n; c0 += 256) {
        const uint32_t c1 = std::min(n, c0 + 256);
        for (size_t j0 = 0; j0 < E; j0 += 64) {
            const size_t j1 = std::min(E, j0 + 64);
            if (esz == 2) {
                for (size_t j = j0; j < j1; ++j) {
                    uint16_t * d = (uint16_t *) dst + j * ld;
                    const uint8_t * sp = src + j * 2;
                    for (uint32_t c = c0; c < c1; ++c) {
                        d[c] = *(const uint16_t *) (sp + (size_t) c * rs);
                    }
                }
            } else {
                for (size_t j = j0; j < j1; ++j) {
                    uint32_t * d = (uint32_t *) dst + j * ld;
                    const uint8_t * sp = src + j * 4;
                    for (uint32_t c = c0; c < c1; ++c) {
                        d[c] = *(const uint32_t *) (sp + (size_t) c * rs);
                    }
                }
            }
        }
    }
}

// The n rows of E components of K of another type than K^T's kt_type (a quantized K, or an 8-bit K^T)
// (row stride rs) as f32 (and with unrot > 0 rotated back: sparq_unrotate_row) and transposed into K^T
// dst (component j's n cells at element j * ld), 256 cells at a time: their rows in f32, then each
// destination row's 256 cells written contiguously, rounded as sparq_kt_put does
static void sparq_transpose_dequant(const uint8_t * src, size_t rs, ggml_type type, size_t E, uint32_t n,
                                    uint8_t * dst, ggml_type kt_type, size_t ld, int64_t unrot) {
    const size_t esz = ggml_type_size(kt_type);
    std::vector<float> tile((size_t) 256 * E);
    for (uint32_t c0 = 0; c0 < n; c0 += 256) {
        const uint32_t c1 = std::min(n, c0 + 256);
        for (uint32_t c = c0; c < c1; ++c) {
            float * x = tile.data() + (size_t) (c - c0) * E;
            sparq_row_f32(src + (size_t) c * rs, type, (int64_t) E, x);
            if (unrot > 0) {
                sparq_unrotate_row(x, E, unrot);
            }
        }
        for (size_t j = 0; j < E; ++j) {
            uint8_t * d = dst + j * ld * esz;
            for (uint32_t c = c0; c < c1; ++c) {
                sparq_kt_put(d, kt_type, c, tile[(size_t) (c - c0) * E + j]);
            }
        }
    }
}

// K^T in the PCA basis: the n keys of src (row stride rs, K's type) rotated, k' = P^T k per KV head,
// into dst (as sparq_transpose_keys lays it out), rounded to K^T's type kt_type
static void sparq_rotate_keys(const sparq_layer & L, const uint8_t * src, size_t rs, ggml_type type, ggml_type kt_type,
                              size_t E, uint32_t n, uint8_t * dst, size_t ld) {
    const size_t d = L.basis.rot->ne[0];
    std::vector<float> x(E);
    for (uint32_t c = 0; c < n; ++c) {
        sparq_row_f32(src + (size_t) c * rs, type, (int64_t) E, x.data());
        for (size_t h = 0; h < E / d; ++h) {
            for (size_t mm = 0; mm < d; ++mm) {
                const float * pm = L.basis.rot_host.data() + (h * d + mm) * d;
                double acc = 0.0;
                for (size_t j = 0; j < d; ++j) {
                    acc += (double) pm[j] * x[h * d + j];
                }
                sparq_kt_put(dst, kt_type, (h * d + mm) * ld + c, (float) acc);
            }
        }
    }
}

// whether two K^T elements of a 16- or 8-bit type (f16, e5m2 in i8) are neighbours: the same sign
// and codes one apart. The PCA basis's rotation of a key is a dot product the graph's appends sum in
// f32 in ggml's order and a rebuild in f64, so the two may round to neighbouring codes of K^T's type
static bool sparq_kt_neighbours(const uint8_t * x, const uint8_t * y, size_t esz) {
    const int32_t a = esz == 2 ? (int32_t) *(const uint16_t *) x : (int32_t) *x;
    const int32_t b = esz == 2 ? (int32_t) *(const uint16_t *) y : (int32_t) *y;
    const int32_t sign = esz == 2 ? 0x8000 : 0x80;
    return (a & sign) == (b & sign) && std::abs(a - b) <= 1;
}

// the largest difference between the kept K^T rows [a, b) of the used cells and the recomputed tr
// ([E][b - a], K^T's type); unused cells are masked, their K^T entries do not matter. In the PCA
// basis a 16- or 8-bit K^T's neighbouring codes count as equal (sparq_kt_neighbours); any other
// difference is a stale or wrong row
static double sparq_check_kt(const sparq_layer & L, const sparq_rebuild_plan & P, uint32_t a, uint32_t b, size_t E,
                             const std::vector<uint8_t> & tr) {
    const ggml_type type = L.data.kt->type;
    const size_t esz = ggml_type_size(type);
    const bool rotated = !L.basis.rot_host.empty() && (type == GGML_TYPE_F16 || type == GGML_TYPE_I8);
    const uint32_t n = b - a;
    const size_t kt_off = P.strm * L.data.kt->nb[3];
    const bool kt_host = ggml_backend_buffer_is_host(L.data.kt->buffer);
    double diff = 0.0;
    // the kept rows, as they are
    std::vector<uint8_t> cur((size_t) n * esz);
    for (size_t j = 0; j < E; ++j) {
        const size_t off = kt_off + ((size_t) j * P.kv_size + a) * esz;
        if (kt_host) {
            memcpy(cur.data(), (const uint8_t *) L.data.kt->data + off, cur.size());
        } else {
            sparq_tensor_get(L.data.kt, cur.data(), off, cur.size());
        }
        for (uint32_t c = a; c < b; ++c) {
            if (P.cells->is_empty(c)) {
                continue; // unused cells are masked: their K^T entries do not matter
            }
            const size_t o = (size_t) (c - a) * esz;
            if (rotated && sparq_kt_neighbours(&cur[o], &tr[j * n * esz + o], esz)) {
                continue;
            }
            diff = std::max(diff, (double) fabsf(sparq_elem_f32(&cur[o], type) - sparq_elem_f32(&tr[j * n * esz + o], type)));
        }
    }
    return diff;
}

// A 4-bit K^T's rows over the cells [a, b) (whole blocks) from the keys kp (row stride rs, K's type):
// the keys in f16 (rotated into the PCA basis, or rotated back, as for an f16 K^T), the empty cells'
// and the ubatch's as 0, then each block written whole (ggml_sparq_kt4_block: the bytes the appends'
// puts leave), or with check compared. K^T so depends on the used cells' keys only: a put into a cell
// the rebuild left 0 gives the recomputation's bytes.
// The check: every used cell's kept bin is the recomputed value's bin at the kept block's scale, which
// may be larger than the recomputation's (a block whose largest value a later append overwrote keeps
// its scale until a rebuild); in the PCA basis bins one apart count as equal (sparq_kt_neighbours).
static void sparq_rebuild_kt4(const sparq_layer & L, const sparq_rebuild_plan & P, uint32_t a, uint32_t b,
                              const uint8_t * kp, size_t rs, ggml_type type, size_t E, int64_t unrot,
                              sparq_rebuild_part & R) {
    const uint32_t n = b - a;
    std::vector<uint8_t> h((size_t) E * n * 2); // [E][n] f16
    if (!L.basis.rot_host.empty()) {
        sparq_rotate_keys(L, kp, rs, type, GGML_TYPE_F16, E, n, h.data(), n);
    } else if (type != GGML_TYPE_F16) {
        sparq_transpose_dequant(kp, rs, type, E, n, h.data(), GGML_TYPE_F16, n, unrot);
    } else {
        sparq_transpose_keys(kp, rs, 2, E, n, h.data(), n);
    }
    uint16_t * hv = (uint16_t *) h.data();
    for (uint32_t c = a; c < b; ++c) {
        if (P.cells->is_empty(c) || P.out[c - P.u0]) {
            for (size_t j = 0; j < E; ++j) {
                hv[j * n + (c - a)] = 0;
            }
        }
    }
    const size_t rb = ggml_row_size(L.data.kt->type, P.kv_size), off = (size_t) a / GGML_SPARQ_KT4_CELLS * GGML_SPARQ_KT4_BYTES;
    const size_t nbytes = (size_t) n / GGML_SPARQ_KT4_CELLS * GGML_SPARQ_KT4_BYTES, kt_off = P.strm * L.data.kt->nb[3];
    const bool kt_host = ggml_backend_buffer_is_host(L.data.kt->buffer);
    std::vector<uint8_t> row(nbytes);
    for (size_t j = 0; j < E; ++j) {
        uint8_t * dst = kt_host && !P.check ? (uint8_t *) L.data.kt->data + kt_off + j * rb + off : row.data();
        if (P.check) {
            if (kt_host) {
                memcpy(row.data(), (const uint8_t *) L.data.kt->data + kt_off + j * rb + off, nbytes);
            } else {
                sparq_tensor_get(L.data.kt, row.data(), kt_off + j * rb + off, nbytes);
            }
            for (uint32_t c = a; c < b; ++c) {
                if (P.cells->is_empty(c)) {
                    continue; // unused cells are masked: their K^T entries do not matter
                }
                uint16_t d, m;
                const int q = ggml_sparq_kt4_q(row.data(), c - a, &d, &m);
                const uint16_t x = hv[j * n + (c - a)];
                const int e = d ? ggml_sparq_kt4_exp_of_d(d) : GGML_SPARQ_KT4_E_MIN - 1;
                const int dq = e < ggml_sparq_kt4_exp(x) ? 16 : std::abs(q - 8 - ggml_sparq_kt4_bin(x, e));
                if (dq > (L.basis.rot_host.empty() ? 0 : 1)) {
                    const float kept = (float) q * ggml_fp16_to_fp32(d) + ggml_fp16_to_fp32(m);
                    R.diff = std::max(R.diff, (double) std::max(1e-3f, fabsf(kept - ggml_fp16_to_fp32(x))));
                }
            }
            continue;
        }
        for (uint32_t c = 0; c < n; c += GGML_SPARQ_KT4_CELLS) {
            ggml_sparq_kt4_block(dst + (size_t) c / GGML_SPARQ_KT4_CELLS * GGML_SPARQ_KT4_BYTES, hv + j * n + c);
        }
        if (!kt_host) {
            sparq_tensor_set(L.data.kt, row.data(), kt_off + j * rb + off, nbytes);
        }
    }
}

// A 4-bit K^T's blocks outside the rebuilt cells [u0, u1) of the stream zeroed (blocks no put has
// reached: the puts into them start from bins of 0, as a recomputation gives for empty cells)
static void sparq_rebuild_kt4_clear(const llama_sparq_ctx & S, const sparq_rebuild_plan & P) {
    for (size_t ikv : P.lay) {
        const ggml_tensor * kt = S.layers[ikv].data.kt;
        const size_t rb = ggml_row_size(kt->type, P.kv_size), E = (size_t) kt->ne[1] * kt->ne[2];
        const size_t b0 = ggml_row_size(kt->type, P.nu ? P.u0 : 0), b1 = ggml_row_size(kt->type, P.nu ? P.u1 : 0);
        const size_t base = P.strm * kt->nb[3];
        // between row j's rebuilt bytes [b0, b1) and row j + 1's: contiguous
        for (size_t j = 0; j <= E; ++j) {
            const size_t from = j == 0 ? 0 : (j - 1) * rb + b1, to = j == E ? E * rb : j * rb + b0;
            if (to > from) {
                sparq_tensor_memset((ggml_tensor *) kt, 0, base + from, to - from);
            }
        }
    }
}

// job jid: layer P.lay[jid / n_chunks], cells [a, b) of its chunk jid % n_chunks: the partial sums,
// and the K^T rows written (in host memory in place; else through a copy) or, with check, compared
static void sparq_rebuild_range(llama_sparq_ctx & S, const sparq_rebuild_plan & P, size_t jid, sparq_rebuild_part & R) {
    const size_t ikv = P.lay[jid / P.n_chunks];
    const uint32_t a = P.u0 + (uint32_t) (jid % P.n_chunks) * P.chunk, b = std::min(P.u1, a + P.chunk);
    sparq_layer & L = S.layers[ikv];
    const ggml_tensor * k = upstream::layer_k(S.kv, ikv);
    const ggml_tensor * v = L.data.v;
    const size_t E = k->ne[0], Ev = v->ne[0];
    const size_t esz = ggml_type_size(L.data.kt->type); // K^T's element (f16 for a quantized K, 1 for e5m2)
    R.vs.assign(Ev, 0.0);
    R.ks.assign(E, 0.0);
    if (b <= a) {
        return;
    }
    // the keys rotated back from upstream's Hadamard rotation (a quantized K cache) outside the PCA basis
    const int64_t unrot = sparq_unrotates(S, L) ? S.hadamard.n : 0;
    const sparq_rows kr(k, P.strm, a, b), vr(v, P.strm, a, b);
    sparq_sum_rows(P, a, b, vr.p, v->nb[1], v->type, Ev, false, R.vs.data());
    sparq_sum_rows(P, a, b, kr.p, k->nb[1], k->type, E, true, R.ks.data(), unrot);
    if (L.data.kt->type == GGML_TYPE_Q4_1) {
        sparq_rebuild_kt4(L, P, a, b, kr.p, k->nb[1], k->type, E, unrot, R);
        return;
    }

    // K^T rows [a, b): element (cell c, component j) at (j * kv_size + c) of the stream
    const uint32_t n = b - a;
    const size_t kt_off = P.strm * L.data.kt->nb[3];
    const bool kt_host = ggml_backend_buffer_is_host(L.data.kt->buffer);
    std::vector<uint8_t> tr; // [E][n] when K^T is not in host memory, or for a check
    uint8_t * dst = nullptr;
    size_t ld = P.kv_size;   // leading dimension of dst, in elements
    if (kt_host && !P.check) {
        dst = (uint8_t *) L.data.kt->data + kt_off + (size_t) a * esz;
    } else {
        tr.resize((size_t) E * n * esz);
        dst = tr.data();
        ld = n;
    }
    if (!L.basis.rot_host.empty()) {
        sparq_rotate_keys(L, kr.p, k->nb[1], k->type, L.data.kt->type, E, n, dst, ld);
    } else if (k->type != L.data.kt->type) {
        sparq_transpose_dequant(kr.p, k->nb[1], k->type, E, n, dst, L.data.kt->type, ld, unrot);
    } else {
        sparq_transpose_keys(kr.p, k->nb[1], esz, E, n, dst, ld);
    }
    if (P.check) {
        R.diff = std::max(R.diff, sparq_check_kt(L, P, a, b, E, tr));
    } else if (!kt_host) {
        for (size_t j = 0; j < E; ++j) {
            sparq_tensor_set(L.data.kt, tr.data() + j * n * esz, kt_off + ((size_t) j * P.kv_size + a) * esz, (size_t) n * esz);
        }
    }
}

// the V sums and the sums of k^2: the ranges' partial sums in order (the same result for any thread
// count), written (the f64 sum rounded to f32, and the rounding as the appends' starting
// compensation) or, with check, compared; returns the largest difference (K^T's included)
static double sparq_rebuild_merge(llama_sparq_ctx & S, const sparq_rebuild_plan & P, const std::vector<sparq_rebuild_part> & res) {
    const uint32_t strm = P.strm;
    double max_diff = 0.0;
    for (size_t li = 0; li < P.lay.size(); ++li) {
        sparq_layer & L = S.layers[P.lay[li]];
        const size_t Ev = L.data.v->ne[0];
        const size_t Ek = upstream::layer_k(S.kv, P.lay[li])->ne[0];
        std::vector<double> vs(Ev, 0.0), ks(Ek, 0.0);
        for (uint32_t ch = 0; ch < P.n_chunks; ++ch) {
            const sparq_rebuild_part & R = res[li * P.n_chunks + ch];
            max_diff = std::max(max_diff, R.diff);
            for (size_t j = 0; j < Ev; ++j) {
                vs[j] += R.vs[j];
            }
            for (size_t j = 0; j < Ek && j < R.ks.size(); ++j) {
                ks[j] += R.ks[j];
            }
        }
        // the sum rounded to f32, and the rounding as the appends' starting compensation
        std::vector<float> vsf(vs.begin(), vs.end()), ksf(ks.begin(), ks.end()), vcf(Ev);
        for (size_t j = 0; j < Ev; ++j) {
            vcf[j] = (float) ((double) vsf[j] - vs[j]);
        }
        if (P.check) {
            std::vector<float> cur(Ev), curk(Ek);
            sparq_tensor_get(L.data.vsum, cur.data(), strm * L.data.vsum->nb[2], Ev * sizeof(float));
            sparq_tensor_get(L.data.ksq, curk.data(), strm * L.data.ksq->nb[2], Ek * sizeof(float));
            for (size_t j = 0; j < Ev; ++j) {
                max_diff = std::max(max_diff, (double) fabsf(cur[j] - vsf[j]));
            }
            for (size_t j = 0; j < Ek; ++j) {
                // relative: a sum of squares grows with the cells (f32 appends)
                max_diff = std::max(max_diff, (double) fabsf(curk[j] - ksf[j]) / std::max(1.0f, ksf[j]));
            }
        } else {
            sparq_tensor_set(L.data.vsum, vsf.data(), strm * L.data.vsum->nb[2], Ev * sizeof(float));
            sparq_tensor_set(L.data.ksq, ksf.data(), strm * L.data.ksq->nb[2], Ek * sizeof(float));
            sparq_tensor_set(L.data.vcomp, vcf.data(), strm * L.data.vcomp->nb[2], Ev * sizeof(float));
        }
    }
    return max_diff;
}

// the stream's valid-cell count of every layer (the cells the sums hold: the used ones but the ubatch's
// in `skip`, which its graph appends) written, or with check compared (returns the difference)
static double sparq_rebuild_count(llama_sparq_ctx & S, uint32_t strm, const std::vector<uint32_t> & skip, bool check) {
    const llama_kv_cells & cells = upstream::cells(S.kv, strm);
    uint32_t n = cells.get_used();
    for (uint32_t c : skip) {
        n -= c < cells.size() && !cells.is_empty(c) ? 1 : 0;
    }
    const float want = (float) n;
    double diff = 0.0;
    for (sparq_layer & L : S.layers) {
        if (!L.data.vcount) {
            continue;
        }
        if (check) {
            float cur = 0.0f;
            sparq_tensor_get(L.data.vcount, &cur, strm * sizeof(float), sizeof(float));
            diff = std::max(diff, (double) fabsf(cur - want));
        } else {
            sparq_tensor_set(L.data.vcount, &want, strm * sizeof(float), sizeof(float));
        }
    }
    return diff;
}

// Recompute K^T and the V sum of one stream from K, V and the cells, over the used cells
// only ([used_min, used_max_p1); K^T entries of empty cells are masked and left as they
// are), leaving the V values of the cells in `skip` out (the ubatch about to run writes
// them, its graph appends them). Multi-threaded over layers and cell ranges. With check
// set, compare the kept data with the recomputation instead of writing it, and return
// the largest absolute difference. Without check the selectors' per-cell data follows
// (sparq_selector_rebuild), and data on a device (a GPU, an RPC host) is rebuilt there instead. In
// host memory this path is the one: exact f64 sums, and on a 2-core CPU 2-4x faster than the device
// graph run on the CPU backend (bench/results/host_paths_gemma3_t2.md).
double sparq_rebuild_stream(llama_sparq_ctx & S, uint32_t strm, const std::vector<uint32_t> & skip, bool check) {
    const double dc = sparq_rebuild_count(S, strm, skip, check);
    if (!check) {
        sparq_selector_rebuild(S, strm, skip);
        if (sparq_rebuild_stream_device(S, strm, skip, S.graph_rebuild_host)) {
            return 0.0;
        }
    }
    const sparq_rebuild_plan P = sparq_rebuild_plan_make(S, strm, skip, check);
    std::vector<sparq_rebuild_part> res(P.lay.size() * P.n_chunks);
    sparq_parallel(P.nth, res.size(), [&](size_t jid) { sparq_rebuild_range(S, P, jid, res[jid]); });
    if (P.kt4 && !check) {
        sparq_rebuild_kt4_clear(S, P);
    }
    return std::max(dc, sparq_rebuild_merge(S, P, res));
}
