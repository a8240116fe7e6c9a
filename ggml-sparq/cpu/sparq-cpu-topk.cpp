// llama-sparq: the CPU's exact k-selection (sparq-cpu-topk.h).

#include "sparq-cpu-topk.h"

#include <functional>

namespace sparq_cpu {

float kth_largest(float * x, int n, int kk) {
    if (n < 64) {
        std::nth_element(x, x + (kk - 1), x + n, std::greater<float>());
        return x[kk - 1];
    }
    int cnt[SPARQ_KEY_BINS];
    memset(cnt, 0, sizeof(cnt));
    int B = 0, above = 0; // the walk down starts at the highest bin used
    for (int i = 0; i < n; ++i) {
        const int b = key_bin(x[i]);
        cnt[b] += 1;
        B = std::max(B, b);
    }
    while (above + cnt[B] < kk) {
        above += cnt[B--];
    }
    // the bin's values to the front, then the rank within them
    int m = 0;
    for (int i = 0; i < n; ++i) {
        if (key_bin(x[i]) == B) {
            std::swap(x[m++], x[i]);
        }
    }
    std::nth_element(x, x + (kk - above - 1), x + m, std::greater<float>());
    return x[kk - above - 1];
}

} // namespace sparq_cpu
