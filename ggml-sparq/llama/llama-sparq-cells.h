// llama-sparq: content versions of KV-cache cells, kept by llama_kv_cells (patch 0009).
//
// SparQ keeps data derived from the cache (K^T and the V sums, ggml-sparq/llama/llama-sparq-state.h)
// and must know when the cache's content changed. Every cell gets a version number,
// drawn from one process-wide counter, whenever its K/V may have changed: it is written
// (pos_set: a ubatch, a state load, a stream copy, a synthetic fill) or re-roped (a
// position shift, and again when the deferred K-shift has run). A stream's hash is the
// XOR over its used cells of mix(cell, version): any change of which cells are used or of
// what they hold changes it, and the hash is updated in O(1) per cell operation. The
// prepare/restore round trip of llama_kv_cache::prepare() copies the versions out and
// back (cp / set), so a simulated ubatch leaves the hash as it was.
//
// The data is K/V independent: only llama_kv_cells calls these, next to its own updates.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

struct llama_sparq_cell_versions {
    std::vector<uint64_t> ver; // per cell; meaningful while the cell is used
    uint64_t hash = 0;         // XOR over the used cells of mix(cell, ver[cell])

    static uint64_t next() {
        static std::atomic<uint64_t> n{0};
        return n.fetch_add(1, std::memory_order_relaxed) + 1;
    }

    static uint64_t mix(uint32_t i, uint64_t v) {
        uint64_t z = v * 0x9E3779B97F4A7C15ull + ((uint64_t) i << 1) + 1;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }

    void resize(uint32_t n) { ver.assign(n, 0); hash = 0; }
    void clear() { hash = 0; }                                  // every cell empty
    void add(uint32_t i) { ver[i] = next(); hash ^= mix(i, ver[i]); } // empty cell i now holds new content
    void drop(uint32_t i) { hash ^= mix(i, ver[i]); }           // used cell i becomes empty
    void touch(uint32_t i) { drop(i); add(i); }                 // used cell i: its content changes

    // cell i takes version v (a restore); was_used / now_used: before and after
    void set(uint32_t i, bool was_used, bool now_used, uint64_t v) {
        if (was_used) {
            drop(i);
        }
        ver[i] = v;
        if (now_used) {
            hash ^= mix(i, v);
        }
    }
};
