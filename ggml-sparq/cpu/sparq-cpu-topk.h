// llama-sparq: k-selection over float keys, the CPU driver's reusable top-k primitive (no SparQ
// state: keys in, the k-th key or the k best candidates out), exact or bucketed (the approximate
// bucketed top-k: one cell per bucket, then the best of those). Every selector that ranks cells
// and the coverage cut use it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace sparq_cpu {

// a candidate cell and its key; the order of a selection: larger keys first, ties to the lower cell
struct cand { float key; int32_t idx; };

struct cand_greater {
    bool operator()(const cand & a, const cand & b) const {
        return a.key > b.key || (a.key == b.key && a.idx < b.idx);
    }
};

// The bin of a key among SPARQ_KEY_BINS: half an octave each, in the order of the keys (an
// order-preserving map of the float bits, negative keys and -INF included), for the selection's
// histograms: a bin's keys are all above every key of a lower bin.
constexpr int SPARQ_KEY_BINS = 1024;
inline __attribute__((always_inline)) int key_bin(float key) {
    uint32_t u;
    memcpy(&u, &key, sizeof(u));
    return (int) ((u & 0x80000000u ? ~u : u | 0x80000000u) >> 22);
}

// The kk-th largest of x[0..n) (1 <= kk <= n), the value nth_element finds, which reorders x: a
// histogram of the bins first, then nth_element among the one bin's values that holds it (over all
// n, its passes branched on every value).
float kth_largest(float * x, int n, int kk);

// keep the kk largest of buf[0..n) in buf[0..kk); return the kk-th key
inline float compact(cand * buf, int n, int kk) {
    std::nth_element(buf, buf + (kk - 1), buf + n, cand_greater());
    return buf[kk - 1].key;
}

// The bucketed top-k, in two parts that a selection over chunks of cells composes: a chunk's keys
// x[0..n) of cells base.. keep only each bucket's best (cell mod B; larger key, ties to the lower
// cell; -INFINITY keys offer nothing), every other key set to -INFINITY (best: B ints of scratch);
// then the chunks' candidates merged keep each bucket's best over them (the best of a bucket is its
// best in some chunk). bucket_merge returns how many remain, in bucket order.
void bucket_keep_best(float * x, int n, int base, int B, int32_t * best);
int bucket_merge(cand * merge, int n, int B);

} // namespace sparq_cpu
