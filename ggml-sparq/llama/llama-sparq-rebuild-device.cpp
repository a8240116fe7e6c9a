// llama-sparq: the rebuild of a stream's K^T and sums on the device that holds the cache (a ggml
// graph per layer on the context's backend), where the whole SparQ data lives on one device.
#include "llama-sparq-rebuild.h"

#include "llama-sparq-state.h"
#include "llama-sparq-transfers.h"
#include "llama-sparq-upstream.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-sparq.h"
#include "llama-impl.h"

#include <algorithm>
#include <vector>

// The device of every layer's K, V, K^T and sums when all are in one non-host (GPU) buffer
// type's memory, else NULL (with allow_host, host memory counts too: the CPU device).
static ggml_backend_dev_t sparq_data_device(const llama_sparq_ctx & S, bool allow_host) {
    ggml_backend_dev_t dev = nullptr;
    for (size_t ikv = 0; ikv < S.layers.size(); ++ikv) {
        const sparq_layer & L = S.layers[ikv];
        if (!L.data.kt) {
            continue;
        }
        for (const ggml_tensor * t : { (const ggml_tensor *) L.data.kt, (const ggml_tensor *) L.data.vsum,
                                       (const ggml_tensor *) L.data.ksq, (const ggml_tensor *) L.data.vcomp,
                                       (const ggml_tensor *) upstream::layer_k(S.kv, ikv),
                                       (const ggml_tensor *) L.data.v }) {
            if (!t->buffer || (!allow_host && ggml_backend_buffer_is_host(t->buffer))) {
                return nullptr;
            }
            ggml_backend_dev_t d = ggml_backend_buft_get_device(ggml_backend_buffer_get_type(t->buffer));
            if (!d && allow_host && ggml_backend_buffer_is_host(t->buffer)) {
                d = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU); // ggml's CPU buffer type names no device
            }
            if (!d || (dev && d != dev)) {
                return nullptr;
            }
            dev = d;
        }
    }
    return dev;
}

// One layer's K^T rows and sums of stream strm by a graph on `backend`: K's used cells [u0, u0 + nu)
// transposed into K^T, and V and k^2 summed with the 0/1 weights w (per used cell) in chunks of
// cells; the compensation zeroed.
static void sparq_rebuild_layer_device(llama_sparq_ctx & S, size_t ikv, uint32_t strm, uint32_t u0, uint32_t nu,
                                       const std::vector<float> & w, ggml_backend_t backend, ggml_gallocr_t galloc,
                                       ggml_backend_dev_t dev) {
    constexpr uint32_t chunk = 16384; // cells per product: bounds the f32 temporaries
    const llama_kv_cache * kv = S.kv;
    const uint32_t kv_size = upstream::kv_size(kv);
    sparq_layer & L = S.layers[ikv];
    ggml_tensor * k = upstream::layer_k(kv, ikv);
    ggml_tensor * v = L.data.v;
    const int64_t E = k->ne[0], Ev = v->ne[0];
    const size_t esz = ggml_type_size(L.data.kt->type);
    sparq_tensor_memset(L.data.vcomp, 0, strm * L.data.vcomp->nb[2], Ev * sizeof(float));
    if (nu == 0) {
        sparq_tensor_memset(L.data.vsum, 0, strm * L.data.vsum->nb[2], Ev * sizeof(float));
        sparq_tensor_memset(L.data.ksq, 0, strm * L.data.ksq->nb[2], E * sizeof(float));
        return;
    }
    const size_t n_nodes = 26 * ((nu + chunk - 1) / chunk) + 16;
    ggml_init_params ip = { n_nodes * ggml_tensor_overhead() + ggml_graph_overhead_custom(n_nodes, false), nullptr, true };
    ggml_context_ptr ctx(ggml_init(ip));
    ggml_context * c0 = ctx.get();
    ggml_cgraph * gf = ggml_new_graph_custom(c0, n_nodes, false);
    ggml_tensor * wt = ggml_new_tensor_2d(c0, GGML_TYPE_F32, 1, nu);
    ggml_set_input(wt);
    ggml_tensor * vacc = nullptr;
    ggml_tensor * kacc = nullptr;
    for (uint32_t a = 0; a < nu; a += chunk) {
        const uint32_t n = std::min(chunk, nu - a), cell = u0 + a;
        ggml_tensor * kc = ggml_view_2d(c0, k, E, n, k->nb[1], strm * k->nb[2] + (size_t) cell * k->nb[1]);
        ggml_tensor * vc = ggml_view_2d(c0, v, Ev, n, v->nb[1], strm * v->nb[2] + (size_t) cell * v->nb[1]);
        // K^T rows [cell, cell + n) of the stream: element (cell c, component j) at j * kv_size + c
        ggml_tensor * ktd = ggml_view_2d(c0, L.data.kt, n, E, (size_t) kv_size * esz, strm * L.data.kt->nb[3] + (size_t) cell * esz);
        // a quantized K: dequantized first (the keys as the cache holds them), K^T being f16, and rotated
        // back from upstream's Hadamard rotation outside the PCA basis (as the appends do)
        ggml_tensor * k32 = k->type == GGML_TYPE_F32 ? kc : ggml_cast(c0, kc, GGML_TYPE_F32);
        if (sparq_unrotates(S, L)) {
            k32 = llama_mul_mat_hadamard(c0, k32, L.data.hrot);
        }
        // transposed into a contiguous [n, E] first, then copied into K^T's rows: CUDA's copy of a
        // transposed source writes its destination as contiguous, whatever the destination's strides
        // (K^T's rows are kv_size cells apart), so a direct copy scrambles K^T when n < kv_size
        ggml_tensor * kt_src = ggml_cont(c0, ggml_transpose(c0, ggml_is_quantized(k->type) ? k32 : kc));
        // an 8-bit K^T: the op's append mode rounds to e5m2 (as the graph's appends do)
        ggml_build_forward_expand(gf, L.data.kt->type == GGML_TYPE_I8 ? ggml_sparq_kt_append(c0, ktd, kt_src, nullptr)
                                                                        : ggml_cpy(c0, kt_src, ktd));
        ggml_tensor * wc = ggml_view_2d(c0, wt, 1, n, wt->nb[1], (size_t) a * sizeof(float));
        ggml_tensor * vf = v->type == GGML_TYPE_F32 ? vc : ggml_cast(c0, vc, GGML_TYPE_F32);
        vf = ggml_is_contiguous(vf) ? vf : ggml_cont(c0, vf); // V read through K's rows (MLA)
        ggml_tensor * kf = ggml_sqr(c0, k32);
        ggml_tensor * vp = ggml_out_prod(c0, vf, wc); // [Ev, 1]: sum over the cells of w * v
        ggml_tensor * kp = ggml_out_prod(c0, kf, wc); // [E, 1]
        vacc = vacc ? ggml_add(c0, vacc, vp) : vp;
        kacc = kacc ? ggml_add(c0, kacc, kp) : kp;
    }
    ggml_build_forward_expand(gf, ggml_cpy(c0, ggml_reshape_1d(c0, vacc, Ev),
                                           ggml_view_1d(c0, L.data.vsum, Ev, strm * L.data.vsum->nb[2])));
    ggml_build_forward_expand(gf, ggml_cpy(c0, ggml_reshape_1d(c0, kacc, E),
                                           ggml_view_1d(c0, L.data.ksq, E, strm * L.data.ksq->nb[2])));
    if (!ggml_gallocr_alloc_graph(galloc, gf)) {
        GGML_ABORT("llama_sparq: the device rebuild could not allocate its temporaries on %s", ggml_backend_dev_name(dev));
    }
    sparq_tensor_set(wt, w.data(), 0, (size_t) nu * sizeof(float));
    if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) {
        GGML_ABORT("llama_sparq: the device rebuild failed on %s", ggml_backend_dev_name(dev));
    }
}

// The rebuild of one stream on the device that holds the cache: a ggml graph
// per layer on the context's backend for that device transposes K into K^T and sums V and k^2
// over the stream's used cells (minus `skip`), in chunks of cells, in device memory; only a 0/1
// weight per used cell goes to the device, no layer comes to the host. The sums are f32 products
// (cuBLAS) with a zero compensation, not the host path's f64 sums. Returns false where it does not
// apply (the data in host memory, the PCA basis, a 4-bit K^T, no backend for the device): the host
// path runs.
// allow_host (llama_sparq_debug_graph_rebuild): the graph rebuild for host memory too (on the CPU
// backend), so that the tests check it on machines without a GPU.
bool sparq_rebuild_stream_device(llama_sparq_ctx & S, uint32_t strm, const std::vector<uint32_t> & skip, bool allow_host) {
    if (!S.lctx) {
        return false;
    }
    for (const sparq_layer & L : S.layers) {
        if (L.data.kt && !L.basis.rot_host.empty()) {
            return false; // K^T in the PCA basis: the host path rotates
        }
        if (L.data.kt && L.data.kt->type == GGML_TYPE_Q4_1) {
            return false; // a 4-bit K^T: the host path writes its blocks whole (through copies on a GPU)
        }
    }
    ggml_backend_dev_t dev = sparq_data_device(S, allow_host);
    if (!dev) {
        return false;
    }
    ggml_backend_t backend = nullptr;
    for (const auto & b : upstream::backends(S.lctx)) {
        if (ggml_backend_get_device(b.get()) == dev) {
            backend = b.get();
        }
    }
    if (!backend) {
        return false;
    }
    const llama_kv_cache * kv = S.kv;
    const llama_kv_cells & cells = upstream::cells(kv, strm);
    const uint32_t u0 = cells.used_min(), u1 = cells.used_max_p1();
    const uint32_t nu = u1 > u0 ? u1 - u0 : 0;
    std::vector<float> w(std::max<uint32_t>(nu, 1), 0.0f);
    for (uint32_t c = u0; c < u1; ++c) {
        w[c - u0] = cells.is_empty(c) ? 0.0f : 1.0f;
    }
    for (uint32_t c : skip) {
        if (c >= u0 && c < u1) {
            w[c - u0] = 0.0f;
        }
    }
    ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));
    sparq_backend_sync(backend);
    for (size_t ikv = 0; ikv < S.layers.size(); ++ikv) {
        if (S.layers[ikv].data.kt) {
            sparq_rebuild_layer_device(S, ikv, strm, u0, nu, w, backend, galloc, dev);
        }
    }
    ggml_gallocr_free(galloc);
    return true;
}
