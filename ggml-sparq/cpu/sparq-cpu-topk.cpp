// llama-sparq: the CPU's exact k-selection (sparq-cpu-topk.h).

#include "sparq-cpu-topk.h"

#include <cmath>
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

void bucket_keep_best(float * x, int n, int base, int B, int32_t * best) {
    std::fill(best, best + B, -1);
    int b = base % B;
    for (int i = 0; i < n; ++i) {
        const float v = x[i];
        if (v != -INFINITY) {
            const int j = best[b];
            if (j < 0) {
                best[b] = i;
            } else if (v > x[j]) {
                x[j] = -INFINITY;
                best[b] = i;
            } else {
                x[i] = -INFINITY;
            }
        }
        if (++b == B) {
            b = 0;
        }
    }
}

int bucket_merge(cand * merge, int n, int B) {
    std::sort(merge, merge + n, [B](const cand & x, const cand & y) {
        const int bx = x.idx % B, by = y.idx % B;
        return bx != by ? bx < by : cand_greater()(x, y);
    });
    int m = 0;
    for (int i = 0; i < n; ++i) {
        if (m == 0 || merge[i].idx % B != merge[m - 1].idx % B) {
            merge[m++] = merge[i];
        }
    }
    return m;
}

} // namespace sparq_cpu
