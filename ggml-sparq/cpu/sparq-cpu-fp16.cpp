// llama-sparq: IEEE binary16 <-> binary32, portable (the ISA files' scalar tails and the driver
// use it; round to nearest even, subnormals, inf and NaN kept).

#include "sparq-cpu.h"

#include <cstring>

float sparq_fp16_to_fp32(uint16_t h) {
    const uint32_t sign = (uint32_t) (h & 0x8000u) << 16;
    uint32_t exp  = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {                 // inf / nan
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {             // normal
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {            // zero
        bits = sign;
    } else {                           // subnormal: normalise
        exp = 113;
        while ((mant & 0x400u) == 0) {
            mant <<= 1;
            exp--;
        }
        bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

uint16_t sparq_fp32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    const uint16_t sign = (uint16_t) ((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {                       // inf / nan
        return sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0);
    }
    if (ax >= 0x477ff000u) {                       // rounds to >= 65520: inf
        return sign | 0x7c00u;
    }
    if (ax < 0x38800000u) {                        // subnormal or zero in half
        if (ax < 0x33000000u) {
            return sign;                           // below half of the smallest subnormal
        }
        const uint32_t e = ax >> 23;
        const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126 - e;            // 14..24
        uint32_t h = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1);
        const uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u))) {
            h++;
        }
        return sign | (uint16_t) h;
    }
    uint32_t h = ((ax >> 13) - (112u << 10));      // rebias exponent
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) {
        h++;
    }
    return sign | (uint16_t) h;
}
