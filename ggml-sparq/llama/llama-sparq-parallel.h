// llama-sparq: the one thread pool of libllama's SparQ code (a selector's training, basis calibration,
// host rebuilds, the synthetic fill): independent jobs spread over a few threads.
#pragma once

#include "ggml.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

// runs f(0..n_jobs-1) on up to n_threads threads (the caller's included; at least one, at most one
// per job). Each thread takes the next job not yet taken, so which thread runs a job varies: the
// jobs must be independent (each writes only its own outputs), and then the results do not depend
// on the thread count or the order.
template <typename F>
void sparq_parallel(int n_threads, size_t n_jobs, F && f) {
    const int nth = (int) std::max<size_t>(1, std::min<size_t>((size_t) std::max(1, n_threads), n_jobs));
    std::atomic<size_t> next{0};
    auto work = [&]() {
        for (size_t j; (j = next.fetch_add(1, std::memory_order_relaxed)) < n_jobs;) {
            f(j);
        }
    };
    std::vector<std::thread> th;
    th.reserve(nth - 1);
    for (int t = 1; t < nth; ++t) {
        th.emplace_back(work);
    }
    work();
    for (auto & t : th) {
        t.join();
    }
}

// one unit of the per-(layer, KV head) work of a selector's training and the basis calibration
struct sparq_head_job {
    size_t ikv;
    int64_t h;
};

// one job per KV head of every layer whose tensor per_layer[ikv] is allocated (its ne[2] is the KV head count)
inline std::vector<sparq_head_job> sparq_head_jobs(const std::vector<ggml_tensor *> & per_layer) {
    std::vector<sparq_head_job> jobs;
    for (size_t ikv = 0; ikv < per_layer.size(); ++ikv) {
        if (const ggml_tensor * t = per_layer[ikv]) {
            for (int64_t h = 0; h < t->ne[2]; ++h) {
                jobs.push_back({ ikv, h });
            }
        }
    }
    return jobs;
}
