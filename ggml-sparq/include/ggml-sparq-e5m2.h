// llama-sparq: the 8-bit K^T's element, e5m2, and its conversions from and to f16 bits. Plain C with
// <stdint.h> only, so that the CPU kernels, CUDA (host and device) and the CUDA emulator share it.
#pragma once

#include <stdint.h>

#if defined(__CUDACC__)
#define GGML_SPARQ_HD __host__ __device__
#else
#define GGML_SPARQ_HD
#endif

// K^T in 8 bits: a GGML_TYPE_I8 K^T holds e5m2 bytes (ggml has no FP8 type): FP8 with 5 exponent
// and 2 mantissa bits, which is exactly the upper byte of an IEEE f16, so a byte b reads as the f16
// whose bits are b << 8. An f16 h is rounded to it to nearest even on its bit pattern; an f32 is
// rounded to f16 first (the double rounding is intended: the keys' f16 is what an f16 K^T holds,
// and the NumPy reference rounds the same way). Inf stays Inf, NaN stays NaN, and a finite value
// that would round beyond the largest finite e5m2 saturates at +-57344 (0x7B), as the reference.
#define GGML_SPARQ_E5M2_MAX 57344.0f

static inline GGML_SPARQ_HD uint8_t ggml_sparq_f16_to_e5m2(uint16_t h) {
    if ((h & 0x7C00) == 0x7C00) {
        return (uint8_t) ((h >> 8) | ((h & 0x03FF) ? 0x02 : 0x00)); // Inf, or a NaN kept a NaN
    }
    const uint8_t b = (uint8_t) ((h + 0x7F + ((h >> 8) & 1)) >> 8);
    return (b & 0x7F) == 0x7C ? (uint8_t) (b - 1) : b; // rounded up to Inf: the largest finite
}

static inline GGML_SPARQ_HD uint16_t ggml_sparq_e5m2_to_f16(uint8_t b) {
    return (uint16_t) (b << 8);
}
