// llama-sparq: the SparQ selector's CPU part (the oracle is the same with r = d): the r query
// components (phase_components), the approximate scores from r rows of K^T (phase_scores), the GQA
// group's candidates (phase_gqa_candidates) and the approximate mass of the selection for the
// mean-V mix (phase_select).

#include "sparq-cpu-phases.h"

namespace sparq_cpu {

void sparq_components(const ctx & C, int u, float * absq, int32_t * order, float * wts) {
    const sparq_args * a = C.a;
    const int d = a->d, r = a->r, g = C.L.group_size;
    const int R = C.unit_row(u), kvh = C.unit_kvh(u);
    const float * cw = C.comp_w(kvh, C.row_stream(R));
    if (cw) {
        // the weights once per unit (the roots of the sums of k^2 where comp_w is that tensor)
        for (int j = 0; j < d; ++j) {
            wts[j] = a->comp_w_sq ? sqrtf(cw[j]) : cw[j];
        }
    }
    auto weight = [wts](int j) { return wts[j]; };
    for (int j = 0; j < d; ++j) {
        absq[j] = 0.0f;
    }
    for (int h = 0; h < g; ++h) {
        const float * q = C.qsel_row(R, kvh * g + h);
        for (int j = 0; j < d; ++j) {
            absq[j] += fabsf(q[j]);
        }
    }
    if (cw) {
        for (int j = 0; j < d; ++j) {
            absq[j] *= weight(j);
        }
    }
    // the r largest of sum_h |q_h|, ties to the lower index, ascending (K^T rows in address order).
    // Up to 128 components: each one's rank, counted without a branch (nth_element's branches on
    // the data took twice as long at d = 64); else, or with NaNs (ranks that do not add up to r),
    // nth_element.
    int n_sel = 0;
    if (r < d && d <= 128) {
        for (int j = 0; j < d; ++j) {
            const float v = absq[j];
            int rank = 0;
            for (int i = 0; i < j; ++i) {
                rank += absq[i] >= v;
            }
            for (int i = j + 1; i < d; ++i) {
                rank += absq[i] > v;
            }
            order[n_sel] = j;
            n_sel += rank < r;
        }
    }
    if (n_sel != r) {
        for (int j = 0; j < d; ++j) {
            order[j] = j;
        }
        auto by_mag = [absq](int32_t x, int32_t y) { return absq[x] > absq[y] || (absq[x] == absq[y] && x < y); };
        if (r < d) {
            std::nth_element(order, order + (r - 1), order + d, by_mag);
        }
        std::sort(order, order + r);
    }
    int32_t * i1 = C.i1(u);
    memcpy(i1, order, r * sizeof(int32_t));
    float * qs = C.qs(u);
    for (int h = 0; h < g; ++h) {
        const float * q = C.qsel_row(R, kvh * g + h);
        double l1_all = 0.0, l1_sel = 0.0;
        for (int j = 0; j < d; ++j) {
            l1_all += fabsf(q[j]) * (cw ? weight(j) : 1.0f);
        }
        for (int j = 0; j < r; ++j) {
            l1_sel += fabsf(q[i1[j]]) * (cw ? weight(i1[j]) : 1.0f);
        }
        // 1/tau generalised to any scale: scale * sqrt(||q||_1 / ||q[i1]||_1)
        const float f = l1_sel > 0.0 ? (float) (a->scale * sqrt(l1_all / l1_sel)) : a->scale;
        for (int j = 0; j < r; ++j) {
            qs[h * r + j] = q[i1[j]] * f;
        }
    }
}

// The K^T rows' cells s0 .. s1 of unit u, asked for: the tiles prefetch each block's next one, but
// a chunk's first block has no earlier one, and cold it took four times the others' time.
// (always_inline: GCC drops a call to a function of prefetches only, as having no effect)
static inline __attribute__((always_inline)) void prefetch_kt_rows(const ctx & C, int u, int s0, int s1) {
    const sparq_args * a = C.a;
    const int R = C.unit_row(u), kvh = C.unit_kvh(u), st = C.row_stream(R);
    const int32_t * i1 = C.i1(u);
    const size_t b0 = sparq_cell_offset(a->KT_type, s0), b1 = sparq_cell_offset(a->KT_type, s1);
    for (int j = 0; j < a->r; ++j) {
        const char * row = C.KT_row(st, kvh, i1[j]);
        for (size_t o = b0 & ~(size_t) 63; o < b1; o += 64) {
            __builtin_prefetch(row + o);
        }
    }
}

// phase_components, after this thread's units' components: the first unit's first block of every
// chunk (the other units' are asked for by the unit before them, sparq_chunk_scores)
static void sparq_prepare(const ctx & C, int ith, int nth) {
    (void) nth;
    if (ith != 0 || C.L.n_units == 0) {
        return; // unit 0's components are thread 0's
    }
    for (int c = 0; c < C.L.n_chunks; ++c) {
        int s0, s1;
        chunk_range(C.a->n_kv, c, C.L.n_chunks, &s0, &s1);
        prefetch_kt_rows(C, 0, s0, std::min(s1, s0 + C.L.block_cells));
    }
}

// Blocks of B cells: the g rows of approximate logits of a block stay in L1/L2 while the r rows
// of K^T stream through the ISA's approx; each block's maxima and sums update the chunk's
// softmax statistics (stat: per head its maximum and sum of exp). A shared GQA list keeps the
// sum's exponentials with the maximum they are taken against (keep_exps), per-head lists the
// logits.
void sparq_chunk_scores(const ctx & C, int u, int w, int s0, int s1, int ith) {
    const sparq_args * a = C.a;
    const int r = a->r, g = C.L.group_size;
    const size_t esz = a->KT_type == SPARQ_E5M2 ? 1 : a->KT_type == SPARQ_F16 ? 2 : 4;
    float * blk = (float *) C.tbuf(ith, C.L.t_blk);
    float * ck = (float *) C.tbuf(ith, C.L.t_ck);
    const void ** rows = (const void **) C.tbuf(ith, C.L.t_rows);
    const int R = C.unit_row(u), kvh = C.unit_kvh(u), st = C.row_stream(R);
    const row_info * ri = C.rinfo(R);
    float * stat = C.stat(w, ith);
    const int32_t * i1 = C.i1(u);
    const float * qs = C.qs(u);
    const float * m = C.mask_row(R);
    for (int b0 = s0, b = 0; b0 < s1; b0 += C.L.block_cells, ++b) {
        const int nb = std::min(C.L.block_cells, s1 - b0);
        const bool kt4 = a->KT_type == SPARQ_KT4; // its rows from cell 0: a block holds 32 cells
        for (int j = 0; j < r; ++j) {
            rows[j] = C.KT_row(st, kvh, i1[j]) + (kt4 ? 0 : (size_t) b0 * esz);
        }
        // g == 1: the keys of the chunk are kept for the selection; g > 1: a block buffer
        float * out = g == 1 ? ck + (b0 - s0) : blk;
        if (a->KT_type == SPARQ_F16) {
            C.isa->approx_f16((const uint16_t * const *) rows, r, qs, g, nb, out);
        } else if (a->KT_type == SPARQ_E5M2) {
            C.isa->approx_e5m2((const uint8_t * const *) rows, r, qs, g, nb, out);
        } else if (kt4) {
            C.isa->approx_kt4((const uint8_t * const *) rows, b0, r, qs, g, nb, out);
        } else {
            C.isa->approx_f32((const float * const *) rows, r, qs, g, nb, out);
        }
        for (int h = 0; h < g; ++h) {
            float * x = out + (size_t) h * nb;
            variant_logits(a, x, nb, head_terms_of(C, R, kvh * g + h), m, b0);
            const float bm = C.isa->max(x, nb);
            float & M = stat[2 * h];
            float & Z = stat[2 * h + 1];
            if (bm != -INFINITY && bm > M) {
                Z = M == -INFINITY ? 0.0f : Z * expf(M - bm);
                M = bm;
            }
            if (C.L.keep_exps) {
                float * e = C.exps(w, h) + b0;
                C.blkm(w, h, ith)[b] = bm == -INFINITY ? -INFINITY : M;
                if (bm != -INFINITY) {
                    Z += C.isa->expsum_store(x, nb, M, e);
                } else {
                    memset(e, 0, nb * sizeof(float)); // every cell masked
                }
            } else {
                if (bm != -INFINITY) {
                    Z += C.isa->expsum(x, nb, M);
                }
                if (g > 1) {
                    memcpy(C.logits(w, h) + b0, x, nb * sizeof(float));
                }
            }
        }
    }
    if (u + 1 < C.L.n_units) {
        prefetch_kt_rows(C, u + 1, s0, std::min(s1, s0 + C.L.block_cells)); // the next unit's first block
    }
    if (g == 1) {
        // candidates: cells before the local window
        const int n = std::min(s1, (int) ri->w0) - s0;
        *C.ccount(w, ith) = select_chunk(C, ith, ck, n, s0, row_kk_scan(a, ri), C.cands(w, ith), nullptr, R);
    }
}

// the unit's softmax statistics of query head hh over the chunks: its maximum approximate logit
// and the sum of exp(logit - maximum), the head's sink included
static void head_softmax(const ctx & C, int u, int w, int hh, float * M, double * Z) {
    float Ms = -INFINITY;
    double Zs = 0.0;
    for (int c = 0; c < C.L.n_chunks; ++c) {
        Ms = std::max(Ms, C.stat(w, c)[2 * hh]);
    }
    for (int c = 0; c < C.L.n_chunks; ++c) {
        const float * stt = C.stat(w, c);
        if (stt[2 * hh] != -INFINITY) {
            Zs += stt[2 * hh + 1] * exp((double) stt[2 * hh] - Ms);
        }
    }
    sink_fold(C.a, C.unit_kvh(u) * C.L.group_size + hh, &Ms, &Zs);
    *M = Ms;
    *Z = Zs;
}

void sparq_rescale_exps(const ctx & C, int u, int w, int s0, int s1, int c) {
    for (int h = 0; h < C.L.group_size; ++h) {
        float M;
        double Z;
        head_softmax(C, u, w, h, &M, &Z);
        float * bm = C.blkm(w, h, c);
        for (int b0 = s0, b = 0; b0 < s1; b0 += C.L.block_cells, ++b) {
            if (bm[b] == M) {
                continue;
            }
            const float sc = bm[b] == -INFINITY ? 0.0f : (float) exp((double) bm[b] - M);
            float * e = C.exps(w, h) + b0;
            for (int i = 0, nb = std::min(C.L.block_cells, s1 - b0); i < nb; ++i) {
                e[i] *= sc;
            }
            bm[b] = M;
        }
    }
}

void sparq_group_candidates(const ctx & C, int u, int w, int s0, int s1, int kk, int c, int ith) {
    const int g = C.L.group_size;
    const int R = C.unit_row(u);
    if (C.L.ph > 1) {
        // per-head selection: each head's best cells by its own approximate logits
        // (masked cells hold -inf there, so they are never chosen)
        for (int h = 0; h < g; ++h) {
            *C.ccount(w, c, h) = select_chunk(C, ith, C.logits(w, h) + s0, s1 - s0, s0, kk, C.cands(w, c, h),
                                              C.cbound(w, c, h), R);
        }
        return;
    }
    float * ck = (float *) C.tbuf(ith, C.L.t_ck);
    float * Mh = (float *) C.tbuf(ith, C.L.t_gh);
    float * iZ = Mh + g;
    for (int h = 0; h < g; ++h) {
        float M;
        double Z;
        head_softmax(C, u, w, h, &M, &Z);
        Mh[h] = M;
        iZ[h] = Z > 0 ? (float) (1.0 / Z) : 0.0f;
    }
    const int n = s1 - s0;
    for (int s = 0; s < n; ++s) {
        ck[s] = 0.0f;
    }
    // the heads' exp(l - M) / Z (the kept exponentials, rescaled: sparq_rescale_exps)
    for (int h = 0; h < g; ++h) {
        C.isa->axpy_f32(ck, C.exps(w, h) + s0, iZ[h], n);
    }
    // masked cells (key 0) must never be chosen
    const float * m = C.mask_row(R);
    if (m) {
        for (int s = 0; s < n; ++s) {
            if (!is_valid(m[s0 + s])) {
                ck[s] = -INFINITY;
            }
        }
    }
    *C.ccount(w, c) = select_chunk(C, ith, ck, n, s0, kk, C.cands(w, c), C.cbound(w, c), R);
}

void sparq_group_candidates_all(const ctx & C, int u, int w, int ith) {
    const sparq_args * a = C.a;
    const row_info * ri = C.rinfo(C.unit_row(u));
    const int kk = row_kk_scan(a, ri);
    for (int c = 0; c < C.L.n_chunks; ++c) {
        for (int h = 0; h < C.L.ph; ++h) {
            *C.ccount(w, c, h) = 0;
            *C.cbound(w, c, h) = -INFINITY;
        }
        int s0, s1;
        chunk_range(a->n_kv, c, C.L.n_chunks, &s0, &s1);
        s1 = std::min(s1, (int) ri->w0);
        if (s1 > s0 && kk > 0) {
            sparq_group_candidates(C, u, w, s0, s1, kk, c, ith);
        }
    }
}

// the approximate logit (mask included) of cell i for query head hh: kept with per-head GQA lists,
// else recomputed from the r rows of K^T (the window's cells, which no chunk kept)
static float approx_logit(const ctx & C, int u, int w, int hh, int i, const float * m) {
    if (C.L.group_size > 1 && !C.L.keep_exps) {
        return C.logits(w, hh)[i];
    }
    const sparq_args * a = C.a;
    const int r = a->r;
    const int R = C.unit_row(u), kvh = C.unit_kvh(u), st = C.row_stream(R);
    const int32_t * i1 = C.i1(u);
    const float * qs = C.qs(u);
    float ap = 0.0f;
    for (int j = 0; j < r; ++j) {
        const char * kt = C.KT_row(st, kvh, i1[j]);
        const float kv = a->KT_type == SPARQ_F16    ? sparq_fp16_to_fp32(((const uint16_t *) kt)[i])
                         : a->KT_type == SPARQ_E5M2 ? sparq_e5m2_to_fp32(((const uint8_t *) kt)[i])
                         : a->KT_type == SPARQ_KT4  ? sparq_kt4_to_fp32((const uint8_t *) kt, i)
                                                    : ((const float *) kt)[i];
        ap += qs[hh * r + j] * kv;
    }
    return variant_logit(a, ap, head_terms_of(C, R, kvh * C.L.group_size + hh), m, i);
}

// exp(l - M) for the approximate logit l (mask included) of cell i for query head hh, M its
// maximum (head_softmax): kept after sparq_rescale_exps, else from the logit
static double approx_exp(const ctx & C, int u, int w, int hh, int i, double M, const float * m) {
    if (C.L.keep_exps) {
        return C.exps(w, hh)[i];
    }
    return exp((double) approx_logit(C, u, w, hh, i, m) - M);
}

float sparq_alpha(const ctx & C, int u, int w, int hh, const int32_t * sel, int n_sel, int n_cand,
                  const cand * merge, const float * m, float * ap) {
    float Ms;
    double Z;
    head_softmax(C, u, w, hh, &Ms, &Z);
    if (Z <= 0.0) {
        return 1.0f;
    }
    // the selection's approximate logits gathered, then one vectorised sum of their exp
    const int n_key = C.L.group_size == 1 ? std::min(n_cand, n_sel) : 0;
    for (int t = 0; t < n_key; ++t) {
        ap[t] = merge[t].key; // with g == 1 a candidate's key is its approximate logit (+ mask)
    }
    double mass = 0.0;
    if (C.L.keep_exps) {
        const float * e = C.exps(w, hh); // exp(l - Ms) (sparq_rescale_exps)
        for (int t = 0; t < n_sel; ++t) {
            mass += e[sel[t]];
        }
    } else {
        if (C.L.group_size > 1) {
            const float * lg = C.logits(w, hh);
            for (int t = 0; t < n_sel; ++t) {
                ap[t] = lg[sel[t]];
            }
        } else {
            for (int t = std::max(n_key, 0); t < n_sel; ++t) {
                ap[t] = approx_logit(C, u, w, hh, sel[t], m);
            }
        }
        mass = n_sel > 0 ? (double) C.isa->expsum(ap, n_sel, Ms) : 0.0;
    }
    if (C.a->sinks) {
        mass += exp((double) C.a->sinks[C.unit_kvh(u) * C.L.group_size + hh] - Ms); // always attended
    }
    return (float) std::min(1.0, mass / Z);
}

// the coverage cut within one bin's candidates merge[lo..hi) (sparq_coverage_cut): merge[0..lo)
// are better than the rest and hold acc < need; a quickselect on the mass moves the fewest best of
// the bin reaching need after them and returns where they end
template <class W>
static int cut_within_bin(cand * merge, int lo, int hi, double acc, double need, W wt) {
    const cand_greater better;
    while (hi - lo > 32) {
        const cand & x = merge[lo], & y = merge[lo + (hi - lo) / 2], & z = merge[hi - 1];
        const cand piv = better(x, y) ? (better(y, z) ? y : (better(x, z) ? z : x))
                                      : (better(x, z) ? x : (better(y, z) ? z : y));
        cand * mid = std::partition(merge + lo, merge + hi, [&](const cand & c) { return better(c, piv); });
        const int mi = (int) (mid - merge);
        double s = 0.0;
        for (int i = lo; i < mi; ++i) {
            s += wt(merge[i]);
        }
        if (acc + s >= need) {
            hi = mi;
        } else {
            acc += s;
            lo = mi;
            // the pivot, the best of what is left, goes next
            int pi = lo;
            while (pi < hi && (better(merge[pi], piv) || better(piv, merge[pi]))) {
                ++pi;
            }
            std::swap(merge[lo], merge[pi]);
            acc += wt(merge[lo]);
            ++lo;
            if (acc >= need) {
                return lo;
            }
        }
    }
    std::sort(merge + lo, merge + hi, better);
    for (int i = lo; i < hi; ++i) {
        acc += wt(merge[i]);
        if (acc >= need) {
            return i + 1;
        }
    }
    return hi; // the bin's mass reached the target: rounding left its sum a hair short
}

int sparq_coverage_cut(const ctx & C, int u, int w, int h, const row_info * ri, const int32_t * wl, cand * merge,
                       int n, int floor, int * reached, int * front) {
    const int g = C.L.group_size;
    const float * m = C.mask_row(C.unit_row(u));
    // the heads whose mean mass the target is on: list h's head (per-head lists), else the group
    const int h0 = C.L.ph > 1 ? h : 0, h1 = C.L.ph > 1 ? h + 1 : g;
    float M[64];
    double iZ[64];
    double win = 0.0;
    for (int hh = h0; hh < h1 && hh - h0 < 64; ++hh) {
        double Z;
        head_softmax(C, u, w, hh, &M[hh - h0], &Z);
        iZ[hh - h0] = Z > 0.0 ? 1.0 / Z : 0.0;
        if (C.a->sinks) {
            // a sink is always attended, as the window
            win += exp((double) C.a->sinks[C.unit_kvh(u) * g + hh] - M[hh - h0]) * iZ[hh - h0];
        }
        for (int i = 0; i < ri->n_win; ++i) {
            win += approx_exp(C, u, w, hh, wl[i], M[hh - h0], m) * iZ[hh - h0];
        }
    }
    const int nh = std::min(h1 - h0, 64);
    win /= nh;
    // a candidate's estimated weight: its head's softmax (per-head lists, g == 1), or the group's
    // summed normalised scores over g (the key of a shared GQA list): there the weights and the
    // target are counted g times over, the key itself (a division per candidate cost more than the
    // rest of the histogram)
    const bool summed = g > 1 && C.L.ph == 1;
    const float M0 = M[0];
    const double iZ0 = iZ[0];
    auto wt = [&](const cand & c) -> double {
        return summed ? (double) c.key : exp((double) c.key - M0) * iZ0;
    };
    const double need = ((double) C.a->cov_p - win) * (summed ? g : 1);
    *reached = 1;
    *front = 0;
    if (need <= 0.0) {
        return 0;
    }
    // First the keys' histogram (key_bin) with each bin's mass; from the top bin down, the one
    // where the mass reaches the target. The bins above it are the best cells, so only that bin's
    // candidates are ranked (a quickselect over all of them, every pass branching on each, cost
    // more than the rest of the selection). Most keys fall in a few bins: four histograms (and
    // sums), one per candidate mod 4, keep each add from waiting on the last one to its bin.
    if (n == 0) {
        *reached = 0;
        return 0;
    }
    int b_lo = SPARQ_KEY_BINS, B = 0; // the walk down starts at the highest bin used
    for (int i = 0; i < n; ++i) {
        const int b = key_bin(merge[i].key);
        b_lo = std::min(b_lo, b);
        B = std::max(B, b);
    }
    const int nb = B - b_lo + 1;
    double bmass4[4][SPARQ_KEY_BINS];
    int bcnt4[4][SPARQ_KEY_BINS];
    for (int j = 0; j < 4; ++j) {
        memset(bmass4[j], 0, (size_t) nb * sizeof(double));
        memset(bcnt4[j], 0, (size_t) nb * sizeof(int));
    }
    double total4[4] = { 0.0, 0.0, 0.0, 0.0 };
    for (int i = 0; i < n; ++i) {
        const int j = i & 3, b = key_bin(merge[i].key) - b_lo;
        const double x = wt(merge[i]);
        bmass4[j][b] += x;
        bcnt4[j][b] += 1;
        total4[j] += x;
    }
    // bin b's mass and count at bmass[b - b_lo], bcnt[b - b_lo]
    double * bmass = bmass4[0];
    int * bcnt = bcnt4[0];
    for (int b = 0; b < nb; ++b) {
        bmass[b] = (bmass4[0][b] + bmass4[1][b]) + (bmass4[2][b] + bmass4[3][b]);
        bcnt[b] += bcnt4[1][b] + bcnt4[2][b] + bcnt4[3][b];
    }
    const double total = (total4[0] + total4[1]) + (total4[2] + total4[3]);
    if (total < need) {
        *reached = 0; // all of them fall short: all of them, in any order
        *front = n;
        return n;
    }
    double above = 0.0;
    int n_above = 0;
    while (B > b_lo && above + bmass[B - b_lo] < need) {
        above += bmass[B - b_lo];
        n_above += bcnt[B - b_lo];
        --B;
    }
    std::partition(merge, merge + n, [&](const cand & c) { return key_bin(c.key) > B; });
    std::partition(merge + n_above, merge + n, [&](const cand & c) { return key_bin(c.key) == B; });
    const int end = n_above + bcnt[B - b_lo]; // merge[n_above..end): bin B's candidates
    const cand_greater better;
    const int n_cut = cut_within_bin(merge, n_above, end, above, need, wt);
    // the floor: the best floor cells at the front when the cut has fewer, from the rest of bin B
    // and the histogram's lower bins (not a selection over all the rest, which cost more)
    *front = n_cut;
    const int want = std::min(floor, n);
    if (want > n_cut) {
        if (want <= end) {
            std::nth_element(merge + n_cut, merge + (want - 1), merge + end, better);
        } else {
            int Bf = B - 1, cum = end;
            while (cum + bcnt[Bf - b_lo] < want) {
                cum += bcnt[Bf - b_lo];
                --Bf;
            }
            std::partition(merge + end, merge + n, [&](const cand & c) { return key_bin(c.key) > Bf; });
            cand * e = std::partition(merge + cum, merge + n, [&](const cand & c) { return key_bin(c.key) == Bf; });
            std::nth_element(merge + cum, merge + (want - 1), e, better);
        }
        *front = want;
    }
    return n_cut;
}

// the oracle: SparQ with every component
static void oracle_args(sparq_args & b) {
    b.r = b.d;
}

// the paper's: approximate scores from the r largest query components
extern const selector select_sparq = {
    /* name           */ "sparq",
    /* ranks_scores   */ true,
    /* window_choice  */ false,
    /* even_attend    */ false,
    /* args           */ nullptr,
    /* scratch        */ nullptr,
    /* window_more    */ nullptr,
    /* prepare        */ sparq_prepare,
    /* chunk          */ sparq_chunk_scores,
    /* selected       */ nullptr,
    /* attended       */ nullptr,
    /* attended_dense */ nullptr,
    /* finish         */ nullptr,
};

// exact scores: the oracle top-k (reads all of K^T)
extern const selector select_oracle = {
    /* name           */ "oracle",
    /* ranks_scores   */ true,
    /* window_choice  */ false,
    /* even_attend    */ false,
    /* args           */ oracle_args,
    /* scratch        */ nullptr,
    /* window_more    */ nullptr,
    /* prepare        */ sparq_prepare,
    /* chunk          */ sparq_chunk_scores,
    /* selected       */ nullptr,
    /* attended       */ nullptr,
    /* attended_dense */ nullptr,
    /* finish         */ nullptr,
};

} // namespace sparq_cpu
