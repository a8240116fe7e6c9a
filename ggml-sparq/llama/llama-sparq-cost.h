// llama-sparq: the cost model (docs/algorithm.md, "Cost model"): bytes moved per KV head and decode
// step, dense and with SparQ, from which the counters' compression is made.
#pragma once

#include "ggml.h"

#include <algorithm>

// A K or V element costs its cache type's bytes (f16 2, f32 4, q8_0 34/32, q4_0 18/32), a K^T element K^T's (2
// or 4); the mean of V and the selectors' other terms are counted in 2-byte units (an f16 element),
// so that with f16 everywhere the ratio is the ratio of elements moved.
struct sparq_cost {
    double d = 0.0;     // K's head size
    double dv = -1.0;   // V's head size (MLA's V, the first dv values of each K row, counted as read again); < 0: d
    double r = 0.0;     // per cell: K^T elements read (steps 1-2), at bt bytes
    double rs = 0.0;    // per cell: the selector's own per-cell data, 2-byte units
    double rk = 0.0;    // per cell: K-row elements the selector reads to choose (estimated)
    double extra = 0.0; // other elements per KV head, 2-byte units (a rotation, a selector's own tensors)
    double bk = 2.0, bv = 2.0, bt = 2.0; // bytes per element of K, V and K^T
    double v_size() const { return dv < 0.0 ? d : dv; }
    // bytes of one K row and one V row
    double row_bytes() const { return d * bk + v_size() * bv; }
    // dense: read n_cells rows of K and of V, write the new k and v
    double dense(double n_cells) const { return (n_cells + 1.0) * row_bytes(); }
    // the selection's reads, `rows` rows of K and of V, the new k and v written, vbar read and written
    double sparq(double n_cells, double rows) const {
        return n_cells * (r * bt + 2.0 * rs + rk * bk) + (std::min(rows, n_cells) + 1.0) * row_bytes() +
               2.0 * (2.0 * v_size() + extra);
    }
};

// bytes per element of a cache type (34/32 for q8_0's blocks, 18/32 for q4_0's)
inline double sparq_elem_bytes(ggml_type t) {
    return (double) ggml_row_size(t, ggml_blck_size(t)) / (double) ggml_blck_size(t);
}
