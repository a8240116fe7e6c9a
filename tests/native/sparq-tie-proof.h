// llama-sparq: tie-proof inputs for comparing two SparQ implementations whose arithmetic may
// differ in the last bit (the CUDA op against the CPU op in test-backend-ops, the CUDA kernels'
// source run on the CPU in tests/native/sparq-cuda-emu.cpp). With the test support, not in
// ggml-sparq/: no code of the fork uses it; test-backend-ops has this folder as an include path.
//
// SparQ chooses cells by score, so two correct implementations could choose differently where
// two cells score almost alike. With these inputs they cannot: the query is large on a fixed set
// J of r components (so step 1 picks J in both), and every key is level * sign_j on J, with
// level one of 2049 values i / 1024 (exact in f16 and f32), so the approximate scores rank the
// cells by level: two cells either differ by far more than rounding or are identical on J, a
// tie both break towards the lower cell. Any difference in the choice is then a bug.
#pragma once

#include <algorithm>
#include <cstddef>
#include <random>
#include <vector>

struct sparq_tie_proof {
    int d;
    std::vector<char>  in_j; // component j is in J
    std::vector<float> sgn;  // the sign of component j in queries and keys

    // J: r of the d components, chosen at random, with random signs
    sparq_tie_proof(int d, int r, std::mt19937 & gen) : d(d), in_j(d, 0), sgn(d) {
        std::vector<int> perm(d);
        for (int j = 0; j < d; ++j) {
            perm[j] = j;
        }
        std::shuffle(perm.begin(), perm.end(), gen);
        for (int j = 0; j < std::min(r, d); ++j) {
            in_j[perm[j]] = 1;
        }
        for (auto & s : sgn) {
            s = (gen() & 1) ? 1.0f : -1.0f;
        }
    }

    // rows of d: sign * U(0.5, 1) on J, U(-0.01, 0.01) elsewhere
    void query(std::vector<float> & f, std::mt19937 & gen) const {
        std::uniform_real_distribution<float> mag(0.5f, 1.0f), tiny(-0.01f, 0.01f);
        for (size_t i = 0; i < f.size(); ++i) {
            const int j = (int) (i % (size_t) d);
            f[i] = in_j[j] ? sgn[j] * mag(gen) : tiny(gen);
        }
    }

    // rows of d (one per cell): level * sign on J, U(-1, 1) elsewhere
    void keys(std::vector<float> & f, std::mt19937 & gen) const {
        std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
        for (size_t c = 0; c < f.size() / (size_t) d; ++c) {
            const float level = (float) ((int) (gen() % 2049) - 1024) / 1024.0f;
            for (int j = 0; j < d; ++j) {
                f[c * d + j] = in_j[j] ? level * sgn[j] : uni(gen);
            }
        }
    }
};
