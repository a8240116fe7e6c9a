// llama-sparq: the vector index's training: k-means (Lloyd, L2) of each layer's and KV head's
// keys into the stream's lists, and the assignment of cells to their nearest centroid.
#include "llama-sparq-index.h"

#include "llama-sparq-elems.h"
#include "llama-sparq-parallel.h"
#include "llama-sparq-state.h"
#include "llama-sparq-transfers.h"
#include "llama-sparq-upstream.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

// The nearest of C centroids to each of the n rows of x (n x d): argmin |c|^2 - 2 x.c, ties to
// the lower index (the op's rule). centT is the centroids transposed (d x C), so the distances of
// a few rows to all centroids accumulate in vertical multiply-adds over the centroids; dist holds
// SPARQ_ASSIGN_ROWS x C floats. Training the index runs this for every used cell against every
// centroid (a 1M-cell stream of 8 KV heads against 1024 lists: 10^12 multiply-adds), so on x86-64
// with GCC it is also compiled for AVX2+FMA and AVX-512 and the loader picks the clone the CPU runs
// (libllama is otherwise built for the baseline ISA); the clones differ only in rounding.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define SPARQ_ISA_CLONES __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define SPARQ_ISA_CLONES
#endif
#define SPARQ_ASSIGN_ROWS 4
SPARQ_ISA_CLONES
static void sparq_assign(const float * x, int64_t n, const float * centT, const float * cn2, int64_t C, int64_t d,
                         int32_t * out, float * dist) {
    for (int64_t i0 = 0; i0 < n; i0 += SPARQ_ASSIGN_ROWS) {
        const int64_t nr = std::min<int64_t>(SPARQ_ASSIGN_ROWS, n - i0);
        for (int64_t i = 0; i < nr; ++i) {
            float * di = dist + i * C;
            for (int64_t c = 0; c < C; ++c) {
                di[c] = cn2[c];
            }
        }
        for (int64_t j = 0; j < d; ++j) {
            const float * cj = centT + j * C;
            for (int64_t i = 0; i < nr; ++i) {
                const float xj = -2.0f * x[(i0 + i) * d + j];
                float * di = dist + i * C;
                for (int64_t c = 0; c < C; ++c) {
                    di[c] += xj * cj[c];
                }
            }
        }
        for (int64_t i = 0; i < nr; ++i) {
            const float * di = dist + i * C;
            float best = INFINITY;
            int32_t bi = 0;
            for (int64_t c = 0; c < C; ++c) {
                if (di[c] < best) {
                    best = di[c];
                    bi = (int32_t) c;
                }
            }
            out[i0 + i] = bi;
        }
    }
}

// |c|^2 of the C centroids (C x d) and their transpose (d x C), for sparq_assign
static void sparq_centroid_prep(const float * cent, int64_t C, int64_t d, float * cn2, float * centT) {
    for (int64_t c = 0; c < C; ++c) {
        float s2 = 0.0f;
        for (int64_t j = 0; j < d; ++j) {
            s2 += cent[c * d + j] * cent[c * d + j];
            centT[j * C + c] = cent[c * d + j];
        }
        cn2[c] = s2;
    }
}

// Lloyd's k-means (L2) of the n rows of x (n x d) into C centroids, started from C rows spread
// evenly over x; a list left empty keeps its centroid
static void sparq_kmeans(const std::vector<float> & x, int64_t n, int64_t d, int64_t C, int iters, float * cent) {
    for (int64_t c = 0; c < C; ++c) {
        const int64_t i = n > 0 ? (c * n) / C : 0;
        for (int64_t j = 0; j < d; ++j) {
            cent[c * d + j] = n > 0 ? x[i * d + j] : 0.0f;
        }
    }
    if (n == 0) {
        return;
    }
    std::vector<int32_t> asg(n);
    std::vector<double> sum((size_t) C * d);
    std::vector<int64_t> cnt(C);
    std::vector<float> cn2(C), centT((size_t) d * C), dist((size_t) SPARQ_ASSIGN_ROWS * C);
    for (int it = 0; it < iters; ++it) {
        sparq_centroid_prep(cent, C, d, cn2.data(), centT.data());
        sparq_assign(x.data(), n, centT.data(), cn2.data(), C, d, asg.data(), dist.data());
        std::fill(sum.begin(), sum.end(), 0.0);
        std::fill(cnt.begin(), cnt.end(), 0);
        for (int64_t i = 0; i < n; ++i) {
            cnt[asg[i]]++;
            for (int64_t j = 0; j < d; ++j) {
                sum[(size_t) asg[i] * d + j] += x[i * d + j];
            }
        }
        for (int64_t c = 0; c < C; ++c) {
            if (cnt[c] > 0) {
                for (int64_t j = 0; j < d; ++j) {
                    cent[c * d + j] = (float) (sum[(size_t) c * d + j] / cnt[c]);
                }
            }
        }
    }
}

// the key of one cell and KV head in f32, into x[0..d) (row: scratch for d values of K's type)
static void sparq_key_f32(const ggml_tensor * k, uint32_t strm, uint32_t cell, int64_t h, int64_t d,
                          std::vector<uint8_t> & row, float * x) {
    sparq_tensor_get(k, row.data(), strm * k->nb[2] + (size_t) cell * k->nb[1] + ggml_row_size(k->type, h * d),
                            row.size());
    sparq_row_f32(row.data(), k->type, d, x);
}

// the cells of `all` in their nearest of the C centroids (lists[cell] = its list id), in batches of
// cells: their keys in f32, then their nearest centroids
static void sparq_assign_cells(const ggml_tensor * k, uint32_t strm, int64_t h, int64_t d, const float * cent, int64_t C,
                               const std::vector<uint32_t> & all, std::vector<uint8_t> & row, std::vector<float> & lists) {
    constexpr size_t NB = 256;
    std::vector<float> cn2(C), centT((size_t) d * C), dist((size_t) SPARQ_ASSIGN_ROWS * C), kf(NB * d);
    std::vector<int32_t> asg(NB);
    sparq_centroid_prep(cent, C, d, cn2.data(), centT.data());
    for (size_t b0 = 0; b0 < all.size(); b0 += NB) {
        const size_t nb = std::min(NB, all.size() - b0);
        for (size_t i = 0; i < nb; ++i) {
            sparq_key_f32(k, strm, all[b0 + i], h, d, row, kf.data() + i * d);
        }
        sparq_assign(kf.data(), (int64_t) nb, centT.data(), cn2.data(), C, d, asg.data(), dist.data());
        for (size_t i = 0; i < nb; ++i) {
            lists[all[b0 + i]] = (float) asg[i];
        }
    }
}

// The index of one layer and KV head of a stream: k-means on the keys of the cells `use`, its
// centroids written, and every list id of the stream reset to -1, or with assign_all the cells of
// `all` put in their nearest list.
static void sparq_train_head(const llama_sparq_ctx & S, const sparq_index_state & X, uint32_t strm,
                             const sparq_head_job & job, const std::vector<uint32_t> & use,
                             const std::vector<uint32_t> & all, bool assign_all) {
    const llama_kv_cache * kv = S.kv;
    const uint32_t kv_size = upstream::kv_size(kv);
    const int64_t C = X.n_list;
    ggml_tensor * cent_t = X.cent[job.ikv];
    ggml_tensor * list_t = X.list[job.ikv];
    ggml_tensor * k = upstream::layer_k(kv, job.ikv);
    const int64_t d = cent_t->ne[0], h = job.h;
    std::vector<float> x(use.size() * d);
    std::vector<uint8_t> row(ggml_row_size(k->type, d));
    for (size_t i = 0; i < use.size(); ++i) {
        sparq_key_f32(k, strm, use[i], h, d, row, x.data() + i * d);
    }
    std::vector<float> cent((size_t) C * d);
    sparq_kmeans(x, (int64_t) use.size(), d, C, 6, cent.data());
    sparq_tensor_set(cent_t, cent.data(), strm * cent_t->nb[3] + h * cent_t->nb[2], cent.size() * sizeof(float));
    std::vector<float> lists(kv_size, -1.0f);
    if (assign_all) {
        sparq_assign_cells(k, strm, h, d, cent.data(), C, all, row, lists);
    }
    sparq_tensor_set(list_t, lists.data(), strm * list_t->nb[2] + h * list_t->nb[1], lists.size() * sizeof(float));
}

// Trains the index of one stream on its used cells' keys (but `skip`, which the next ubatch
// writes): per layer and KV head, k-means on at most 16 keys per list (evenly spaced over the
// cells), 6 iterations. Every list id of the stream is reset to -1 (the op assigns each cell to
// its nearest centroid when it next reads it), or with assign_all set here to the used cells'
// nearest centroid (llama_sparq_sync: the work done before a timed step). Threads over (layer, KV head).
void sparq_train_index(const llama_sparq_ctx & S, sparq_index_state & X, uint32_t strm, const std::vector<uint32_t> & skip,
                       uint32_t n_used, bool assign_all) {
    const llama_kv_cells & cells = upstream::cells(S.kv, strm);
    const int64_t C = X.n_list;
    std::vector<uint32_t> all;
    for (uint32_t c = cells.used_min(); c < cells.used_max_p1(); ++c) {
        if (!cells.is_empty(c) && std::find(skip.begin(), skip.end(), c) == skip.end()) {
            all.push_back(c);
        }
    }
    std::vector<uint32_t> use = all;
    const size_t n_max = (size_t) 16 * C;
    if (use.size() > n_max) {
        std::vector<uint32_t> sub(n_max);
        for (size_t i = 0; i < n_max; ++i) {
            sub[i] = use[(i * use.size()) / n_max];
        }
        use.swap(sub);
    }
    const std::vector<sparq_head_job> jobs = sparq_head_jobs(X.cent);
    sparq_parallel(S.lctx ? (int) upstream::cparams(S.lctx).n_threads : 1, jobs.size(), [&](size_t ji) {
        sparq_train_head(S, X, strm, jobs[ji], use, all, assign_all);
    });
    X.trained[strm] = std::max<uint32_t>(1, n_used);
}
