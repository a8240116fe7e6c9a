// llama-sparq: the index selector's CPU part (an inverted-file index of the keys): the lists each
// search probes (phase_components), the probed cells' exact scores as candidates, filing the cells
// in no list yet (phase_scores), and the count of key rows read (phase_select).

#include "sparq-cpu-phases.h"

namespace sparq_cpu {

// Its inputs: the centroids, sel_in[0] [d, n_list, n_head_kv, n_stream] (with a row after the last
// for the reads it reports), and each cell's list, sel_in[1] [n_kv, n_head_kv, n_stream] (f32 ids).
static int ivf_n_list(const sparq_args * a) { return a->sel_in[0].ne1; }

static const float * ivf_centroid(const ctx & C, int st, int kvh, int c) {
    const sparq_sel_input & in = C.a->sel_in[0];
    return (const float *) ((const char *) in.data + (size_t) c * in.nb1 + (size_t) kvh * in.nb2 + (size_t) st * in.nb3);
}

// where the op reports the key rows it read for (stream, KV head): centroid row n_list
static float * ivf_reads(const ctx & C, int st, int kvh) { return (float *) ivf_centroid(C, st, kvh, ivf_n_list(C.a)); }

static float * ivf_lists(const ctx & C, int st, int kvh) {
    const sparq_sel_input & in = C.a->sel_in[1];
    return (float *) ((char *) in.data + (size_t) kvh * in.nb1 + (size_t) st * in.nb2);
}

// per unit (its scratch, off_own[0]): a query per search (the group's sum, or each head's), the
// lists' |c|^2, per search its probe flags, and the flags of the lists any search probes (int32,
// list_gather's table)
static size_t ivf_unit_floats(const sparq_args * a, int ph) {
    const int nl = ivf_n_list(a);
    return (size_t) ph * a->d + nl + (size_t) ph * nl + nl;
}

static float * ivf_q(const ctx & C, int u, int h = 0) {
    return (float *) (C.base + C.L.off_own[0]) + (size_t) u * ivf_unit_floats(C.a, C.L.ph) + (size_t) h * C.a->d;
}
static float * ivf_cn2(const ctx & C, int u) { return ivf_q(C, u, C.L.ph); }
static float * ivf_probe(const ctx & C, int u, int h = 0) {
    return ivf_cn2(C, u) + ivf_n_list(C.a) + (size_t) h * ivf_n_list(C.a);
}
static int32_t * ivf_any(const ctx & C, int u) { return (int32_t *) ivf_probe(C, u, C.L.ph); }
// per unit of the wave and chunk (off_own[1]): the key rows scored
static int32_t * ivf_n(const ctx & C, int w, int c) {
    return (int32_t *) (C.base + C.L.off_own[1]) + (size_t) w * C.L.n_chunks + c;
}

// per unit: the query of each search (the group's sum; with per-head choice each head's own),
// the lists' squared norms (for assignments), and each search's probed lists
// its scratch: per unit, a query per search, the lists' |c|^2 and the probe flags; per unit of the
// wave and chunk the key rows scored; per thread the lists' ranking and the chunk's cells in probed lists
static void index_scratch(const sparq_args * a, layout & L, int, size_t * o, size_t * t) {
    L.off_own[0] = *o; *o += align_up((size_t) L.n_units * ivf_unit_floats(a, L.ph) * sizeof(float));
    L.off_own[1] = *o; *o += align_up((size_t) L.wave_units * L.n_chunks * sizeof(int32_t));
    L.t_own[0]   = *t; *t += align_up((size_t) ivf_n_list(a) * sizeof(cand));
    L.t_own[1]   = *t; *t += align_up((size_t) (L.chunk_max + 16) * sizeof(int32_t));
}

static void index_probe_lists(const ctx & C, int ith, int nth) {
    const sparq_args * a = C.a;
    const int d = a->d, g = C.L.group_size;
    const int nl = ivf_n_list(a), ph = C.L.ph;
    cand * ls = (cand *) C.tbuf(ith, C.L.t_own[0]);
    for (int u = ith; u < C.L.n_units; u += nth) {
        const int R = C.unit_row(u), kvh = C.unit_kvh(u), st = C.row_stream(R);
        for (int hs = 0; hs < ph; ++hs) {
            float * qv = ivf_q(C, u, hs);
            for (int j = 0; j < d; ++j) {
                qv[j] = 0.0f;
            }
            for (int h = ph > 1 ? hs : 0; h < (ph > 1 ? hs + 1 : g); ++h) {
                const float * q = C.q_row(R, kvh * g + h);
                for (int j = 0; j < d; ++j) {
                    qv[j] += q[j];
                }
            }
        }
        float * cn2 = ivf_cn2(C, u);
        for (int c = 0; c < nl; ++c) {
            const float * ce = ivf_centroid(C, st, kvh, c);
            cn2[c] = C.isa->dot_f32(ce, ce, d);
        }
        const int np = std::min(a->n_probe, nl);
        int32_t * any = ivf_any(C, u);
        for (int c = 0; c < nl; ++c) {
            any[c] = 0;
        }
        for (int hs = 0; hs < ph; ++hs) {
            float * pr = ivf_probe(C, u, hs);
            for (int c = 0; c < nl; ++c) {
                ls[c].key = C.isa->dot_f32(ivf_q(C, u, hs), ivf_centroid(C, st, kvh, c), d);
                ls[c].idx = c;
                pr[c] = 0.0f;
            }
            // the n_probe best lists, ties to the lower index
            if (np < nl) {
                compact(ls, nl, np);
            }
            for (int i = 0; i < np; ++i) {
                pr[ls[i].idx] = 1.0f;
                any[ls[i].idx] = 1;
            }
        }
    }
}

// The index selector's candidates in one chunk [s0, s1) of unit u: the cells of the probed lists,
// by their exact logit summed over the group (or each head's own, searching per query head).
// Three passes, so that only the probed cells' key rows are read:
//   1. every list id of the chunk: a valid cell in no list yet joins its nearest centroid's list
//      (this thread owns the chunk's cells), and the cells before the window whose list some
//      search probes are gathered, in cell order (the ISA's list_gather, vectorised);
//   2. the gathered cells' keys (rows prefetched ahead), masked cells dropped;
//   3. the selection over the gathered scores (cell order kept, so ties still go to the lower cell).
static void index_candidates(const ctx & C, int u, int w, int s0, int s1, int ith) {
    const sparq_args * a = C.a;
    const int R = C.unit_row(u), kvh = C.unit_kvh(u), st = C.row_stream(R);
    const row_info * ri = C.rinfo(R);
    const float * m = C.mask_row(R);
    const int ph = C.L.ph, nl = ivf_n_list(a), d = a->d;
    const float * cn2 = ivf_cn2(C, u);
    float * lists = ivf_lists(C, st, kvh);
    float * ck = (float *) C.tbuf(ith, C.L.t_ck);
    float * kf = (float *) C.tbuf(ith, C.L.t_vec); // a key in f32 (3 * max(d, dv) floats)
    const int32_t * any = ivf_any(C, u); // the lists some search of the unit probes (phase_components)
    int32_t * pc = (int32_t *) C.tbuf(ith, C.L.t_own[1]);
    // files a valid cell that is in no list yet: argmin |k - c|^2 = argmin |c|^2 - 2 k.c, ties to the lower list
    auto file = [&](int cell) -> int {
        if (m && !is_valid(m[cell])) {
            return -1;
        }
        const char * kr = C.K_row(st, kvh, cell);
        sparq_row_to_f32(C.isa, a->K_type, kr, kf, d);
        float best = INFINITY;
        int li = 0;
        for (int c = 0; c < nl; ++c) {
            const float dist = cn2[c] - 2.0f * C.isa->dot_f32(kf, ivf_centroid(C, st, kvh, c), d);
            if (dist < best) {
                best = dist;
                li = c;
            }
        }
        lists[cell] = (float) li;
        return li;
    };
    // pass 1: cells before the window are gathered; the window's cells are only filed
    const int e = std::max(s0, std::min(s1, (int) ri->w0));
    int n = 0;
    for (int pos = s0; pos < e;) {
        int stop = 0;
        n += C.isa->list_gather(lists + pos, e - pos, any, nl, pos, pc + n, &stop);
        pos += stop;
        if (pos < e) {
            const int li = file(pos); // in no list yet
            if (li >= 0 && any[li]) {
                pc[n++] = pos;
            }
            ++pos;
        }
    }
    for (int cell = e; cell < s1; ++cell) {
        const int li = (int) lists[cell];
        if ((unsigned) li >= (unsigned) nl) {
            file(cell);
        }
    }
    // pass 2: the gathered cells' logits (masked cells dropped; with per-head search a head's
    // unprobed lists give -inf, which the selection never takes)
    const size_t rb = sparq_row_bytes(a->K_type, d);
    constexpr int PF = 8; // rows ahead
    int n2 = 0;
    for (int i = 0; i < n; ++i) {
        if (i + PF < n) {
            const char * nx = C.K_row(st, kvh, pc[i + PF]);
            for (size_t o = 0; o < rb; o += 64) {
                __builtin_prefetch(nx + o);
            }
        }
        const int cell = pc[i];
        if (m && !is_valid(m[cell])) {
            continue;
        }
        const char * kr = C.K_row(st, kvh, cell);
        const int li = ph > 1 ? (int) lists[cell] : 0;
        for (int hs = 0; hs < ph; ++hs) {
            float x = -INFINITY;
            if (ph == 1 || ivf_probe(C, u, hs)[li] != 0.0f) {
                const float * qv = ivf_q(C, u, hs);
                x = dot_row(C.isa, a->K_type, qv, kr, d) * a->scale;
            }
            ck[(size_t) hs * C.L.chunk_max + n2] = x;
        }
        pc[n2++] = cell;
    }
    *ivf_n(C, w, ith) = n2;
    // pass 3: the chunk's best, as positions in the gathered list, then as cells
    for (int hs = 0; hs < ph; ++hs) {
        cand * out = C.cands(w, ith, hs);
        const int cnt = select_chunk(C, ith, ck + (size_t) hs * C.L.chunk_max, n2, 0, row_kk_scan(a, ri), out);
        for (int i = 0; i < cnt; ++i) {
            out[i].idx = pc[out[i].idx];
        }
        *C.ccount(w, ith, hs) = cnt;
    }
}

// what the stream's last row read, when asked: the key rows its chunks scored (-1: it ran dense)
static void index_record_reads(const ctx & C, int u, int w, bool dense) {
    const int R = C.unit_row(u), kvh = C.unit_kvh(u), st = C.row_stream(R);
    if (!C.a->sel_reads || C.row_in_stream(R) != C.a->n_rows - 1) {
        return;
    }
    int32_t n = 0;
    for (int c = 0; c < C.L.n_chunks; ++c) {
        n += *ivf_n(C, w, c);
    }
    *ivf_reads(C, st, kvh) = dense ? -1.0f : (float) n;
}

// the index can search per query head; no approximate scores, no mean of V
static void index_args(sparq_args & b) {
    b.r = 1;
    b.no_mean_v = 1;
    b.q_sel = nullptr;
    b.comp_w = nullptr;
}

// top-k over an inverted-file index of the keys: the probed lists' cells ranked by their exact logits
extern const selector select_index = {
    /* name           */ "index",
    /* ranks_scores   */ false,
    /* window_choice  */ false,
    /* even_attend    */ false,
    /* args           */ index_args,
    /* scratch        */ index_scratch,
    /* window_more    */ nullptr,
    /* prepare        */ index_probe_lists,
    /* chunk          */ index_candidates,
    /* selected       */ index_record_reads,
    /* attended       */ nullptr,
    /* attended_dense */ nullptr,
    /* finish         */ nullptr,
};

} // namespace sparq_cpu
