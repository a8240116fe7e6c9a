// llama-sparq: the basis of steps 1-2: the PCA basis's tensors, and its calibration on the cache's keys:
// per layer and KV head, the keys' second moment; its diagonal (the scaled basis's RMS per component)
// or its eigenvectors (the PCA basis).
#include "llama-sparq-basis.h"

#include "llama-sparq-buffers.h"
#include "llama-sparq-elems.h"
#include "llama-sparq-parallel.h"
#include "llama-sparq-state.h"
#include "llama-sparq-transfers.h"
#include "llama-sparq-upstream.h"

#include "ggml-backend.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <thread>
#include <vector>

// the PCA basis back to the identity (unit spread), not calibrated
void sparq_basis_reset(llama_sparq_ctx & S) {
    for (sparq_layer & L : S.layers) {
        if (!L.basis.rot) {
            continue;
        }
        const int64_t d = L.basis.rot->ne[0], hkv = L.basis.rot->ne[2];
        std::vector<float> eye((size_t) d * d * hkv, 0.0f), one((size_t) d * hkv, 1.0f);
        for (int64_t h = 0; h < hkv; ++h) {
            for (int64_t j = 0; j < d; ++j) {
                eye[(size_t) (h * d + j) * d + j] = 1.0f;
            }
        }
        sparq_tensor_set(L.basis.rot, eye.data(), 0, eye.size() * sizeof(float));
        sparq_tensor_set(L.basis.spread, one.data(), 0, one.size() * sizeof(float));
        L.basis.rot_host.clear();
    }
}

// allocate the PCA basis tensors (identity, unit spread) next to each layer's K^T
bool sparq_alloc_basis(llama_sparq_ctx & S, char * err, size_t err_size) {
    if (S.basis.ctx) {
        return true;
    }
    ggml_init_params ip = { (S.layers.size() * 2 + 1) * ggml_tensor_overhead(), nullptr, true };
    S.basis.ctx.reset(ggml_init(ip));
    std::map<ggml_backend_buffer_type_t, std::vector<ggml_tensor *>> by_buft;
    for (sparq_layer & L : S.layers) {
        if (!L.data.kt) {
            continue;
        }
        const int64_t d = L.data.kt->ne[1], hkv = L.data.kt->ne[2];
        L.basis.rot = ggml_new_tensor_3d(S.basis.ctx.get(), GGML_TYPE_F32, d, d, hkv);
        L.basis.spread = ggml_new_tensor_2d(S.basis.ctx.get(), GGML_TYPE_F32, d, hkv);
        ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(L.data.kt->buffer);
        by_buft[buft].push_back(L.basis.rot);
        by_buft[buft].push_back(L.basis.spread);
    }
    if (!sparq_alloc_buffers(S, by_buft, S.basis.bufs, "the PCA basis", err, err_size)) {
        return false;
    }
    sparq_basis_reset(S);
    return true;
}

// eigen-decomposition of a symmetric n x n matrix (row-major, destroyed) by cyclic Jacobi
// rotations: eigenvalues in ev, eigenvectors in the columns of V (row-major)
static void sparq_jacobi(std::vector<double> & A, int n, std::vector<double> & ev, std::vector<double> & V) {
    V.assign((size_t) n * n, 0.0);
    for (int i = 0; i < n; ++i) {
        V[(size_t) i * n + i] = 1.0;
    }
    for (int sweep = 0; sweep < 60; ++sweep) {
        double off = 0.0, diag = 0.0;
        for (int i = 0; i < n; ++i) {
            diag += A[(size_t) i * n + i] * A[(size_t) i * n + i];
            for (int j = i + 1; j < n; ++j) {
                off += A[(size_t) i * n + j] * A[(size_t) i * n + j];
            }
        }
        if (off <= 1e-22 * diag || off == 0.0) {
            break;
        }
        for (int p = 0; p < n - 1; ++p) {
            for (int q = p + 1; q < n; ++q) {
                const double apq = A[(size_t) p * n + q];
                if (fabs(apq) < 1e-300) {
                    continue;
                }
                const double app = A[(size_t) p * n + p], aqq = A[(size_t) q * n + q];
                const double theta = (aqq - app) / (2.0 * apq);
                const double t = (theta >= 0 ? 1.0 : -1.0) / (fabs(theta) + sqrt(theta * theta + 1.0));
                const double c = 1.0 / sqrt(t * t + 1.0), sn = t * c;
                for (int k = 0; k < n; ++k) { // columns p, q
                    const double akp = A[(size_t) k * n + p], akq = A[(size_t) k * n + q];
                    A[(size_t) k * n + p] = c * akp - sn * akq;
                    A[(size_t) k * n + q] = sn * akp + c * akq;
                }
                for (int k = 0; k < n; ++k) { // rows p, q
                    const double apk = A[(size_t) p * n + k], aqk = A[(size_t) q * n + k];
                    A[(size_t) p * n + k] = c * apk - sn * aqk;
                    A[(size_t) q * n + k] = sn * apk + c * aqk;
                }
                for (int k = 0; k < n; ++k) {
                    const double vkp = V[(size_t) k * n + p], vkq = V[(size_t) k * n + q];
                    V[(size_t) k * n + p] = c * vkp - sn * vkq;
                    V[(size_t) k * n + q] = sn * vkp + c * vkq;
                }
            }
        }
    }
    ev.resize(n);
    for (int i = 0; i < n; ++i) {
        ev[i] = A[(size_t) i * n + i];
    }
}

// one key x (d components) into the second moment M (d x d, row-major): the upper triangle, or
// with !rotate only the diagonal (the scaled basis needs no more)
static void sparq_add_moment(double * M, const float * x, int64_t d, bool rotate) {
    if (!rotate) {
        // the scaled basis needs the diagonal only
        for (int64_t a = 0; a < d; ++a) {
            M[a * d + a] += (double) x[a] * x[a];
        }
        return;
    }
    for (int64_t a = 0; a < d; ++a) {
        const double xa = x[a];
        for (int64_t b = a; b < d; ++b) {
            M[a * d + b] += xa * x[b];
        }
    }
}

// the keys' second moments of every job (layer, KV head) over the used cells of all streams but
// `skip`, each layer's keys read to the host once; spread[ikv] set to ones for the layers with a basis
static void sparq_key_moments(llama_sparq_ctx & S, bool rotate, const std::vector<std::vector<uint32_t>> & skip,
                              const std::vector<sparq_head_job> & jobs, std::vector<std::vector<float>> & spread,
                              std::vector<std::vector<double>> & mom) {
    const llama_kv_cache * kv = S.kv;
    const uint32_t kv_size = upstream::kv_size(kv), n_stream = upstream::n_stream(kv);
    for (size_t ikv = 0; ikv < S.layers.size(); ++ikv) {
        sparq_layer & L = S.layers[ikv];
        if (!L.basis.rot) {
            continue;
        }
        spread[ikv].assign(ggml_nelements(L.basis.spread), 1.0f);
        ggml_tensor * k = upstream::layer_k(kv, ikv);
        const int64_t d = L.basis.rot->ne[0];
        for (size_t ji = 0; ji < jobs.size(); ++ji) {
            if (jobs[ji].ikv == ikv) {
                mom[ji].assign((size_t) d * d, 0.0);
            }
        }
        std::vector<float> row(k->ne[0]);
        for (uint32_t strm = 0; strm < n_stream; ++strm) {
            const llama_kv_cells & cells = upstream::cells(kv, strm);
            const std::vector<uint8_t> kb = sparq_get_slice(k, strm * k->nb[2], (size_t) kv_size * k->nb[1]);
            for (uint32_t c = 0; c < kv_size; ++c) {
                if (cells.is_empty(c) ||
                    (strm < skip.size() && std::find(skip[strm].begin(), skip[strm].end(), c) != skip[strm].end())) {
                    continue;
                }
                sparq_row_f32(kb.data() + (size_t) c * k->nb[1], k->type, k->ne[0], row.data());
                for (size_t ji = 0; ji < jobs.size(); ++ji) {
                    if (jobs[ji].ikv == ikv) {
                        sparq_add_moment(mom[ji].data(), row.data() + jobs[ji].h * d, d, rotate);
                    }
                }
            }
        }
    }
}

// one job's axes and spread from its second moment M (the upper triangle; M is destroyed): with
// !rotate the model's own axes and the keys' RMS per component; else the eigenvectors by falling
// eigenvalue into L.basis.rot_host and the keys' RMS along each (a floor keeps every axis selectable)
static void sparq_basis_from_moment(sparq_layer & L, int64_t h, std::vector<double> & M, bool rotate, float * spread_h) {
    const int d = (int) L.basis.rot->ne[0];
    for (int a = 0; a < d; ++a) {
        for (int b = 0; b < a; ++b) {
            M[(size_t) a * d + b] = M[(size_t) b * d + a];
        }
    }
    if (!rotate) {
        // the model's own axes: the keys' RMS per component
        double top = 1e-30;
        for (int j = 0; j < d; ++j) {
            top = std::max(top, M[(size_t) j * d + j]);
        }
        for (int j = 0; j < d; ++j) {
            spread_h[j] = (float) sqrt(std::max(M[(size_t) j * d + j], 1e-6 * top));
        }
        return;
    }
    std::vector<double> ev, V;
    sparq_jacobi(M, d, ev, V);
    std::vector<int> order(d);
    for (int i = 0; i < d; ++i) {
        order[i] = i;
    }
    std::sort(order.begin(), order.end(), [&](int x, int y) { return ev[x] > ev[y]; });
    const double top = std::max(ev[order[0]], 1e-30);
    for (int m = 0; m < d; ++m) {
        const int src = order[m];
        for (int j = 0; j < d; ++j) {
            L.basis.rot_host[(size_t) (h * d + m) * d + j] = (float) V[(size_t) j * d + src];
        }
        // the keys' RMS along the axis (a floor keeps every axis selectable)
        spread_h[m] = (float) sqrt(std::max(ev[src], 1e-6 * top));
    }
}

// the PCA basis of every layer and KV head from the keys the cache holds now (all streams):
// the eigenvectors of the keys' second moment, by falling variance
// skip: per stream, the cells the current ubatch writes (their K is not in the cache yet)
void sparq_calibrate(llama_sparq_ctx & S, bool rotate, const std::vector<std::vector<uint32_t>> & skip) {
    for (sparq_layer & L : S.layers) {
        if (L.basis.rot) {
            L.basis.rot_host.assign(rotate ? ggml_nelements(L.basis.rot) : 0, 0.0f);
        }
    }
    std::vector<ggml_tensor *> rot(S.layers.size());
    for (size_t ikv = 0; ikv < S.layers.size(); ++ikv) {
        rot[ikv] = S.layers[ikv].basis.rot;
    }
    const std::vector<sparq_head_job> jobs = sparq_head_jobs(rot);
    // the keys of each layer, all streams, on the host once
    std::vector<std::vector<float>> spread(S.layers.size());
    std::vector<std::vector<double>> mom(jobs.size());
    sparq_key_moments(S, rotate, skip, jobs, spread, mom);
    // eigen-decompositions in parallel
    sparq_parallel((int) std::thread::hardware_concurrency(), jobs.size(), [&](size_t ji) {
        sparq_layer & L = S.layers[jobs[ji].ikv];
        const int64_t d = L.basis.rot->ne[0];
        sparq_basis_from_moment(L, jobs[ji].h, mom[ji], rotate, spread[jobs[ji].ikv].data() + jobs[ji].h * d);
    });
    for (size_t ikv = 0; ikv < S.layers.size(); ++ikv) {
        sparq_layer & L = S.layers[ikv];
        if (L.basis.rot) {
            if (rotate) {
                sparq_tensor_set(L.basis.rot, L.basis.rot_host.data(), 0, L.basis.rot_host.size() * sizeof(float));
            }
            sparq_tensor_set(L.basis.spread, spread[ikv].data(), 0, spread[ikv].size() * sizeof(float));
        }
    }
    S.basis.calibrated = true;
}
