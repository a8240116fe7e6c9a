// llama-sparq: the one thread pool of libllama's SparQ code (index training, basis calibration,
// host rebuilds, the synthetic fill): independent jobs spread over a few threads.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
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
