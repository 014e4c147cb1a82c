// Peak FMA throughput of the NEON backend (through SIMDe on x86): 12 independent float32x4
// accumulators per thread, so FMA latency is hidden; OpenMP threads as the kernels use.
// Returns the checksum so the compiler cannot drop the work.
#if defined(__aarch64__) || defined(__ARM_NEON)
#  include <arm_neon.h>
#else
#  define SIMDE_ENABLE_NATIVE_ALIASES
#  include <simde/arm/neon.h>
#endif
#include <stdint.h>

float kg_peak_fma(int64_t iterations)
{
    float total = 0.0f;
    #pragma omp parallel reduction(+:total)
    {
        float32x4_t acc[12];
        const float32x4_t b = vdupq_n_f32(1.0000001f), c = vdupq_n_f32(0.9999999f);
        for (int k = 0; k < 12; ++k) acc[k] = vdupq_n_f32((float)k);
        for (int64_t i = 0; i < iterations; ++i)
            for (int k = 0; k < 12; ++k) acc[k] = vfmaq_f32(acc[k], acc[k], b);
        for (int k = 0; k < 12; ++k) total += vaddvq_f32(vmulq_f32(acc[k], c));
    }
    return total;
}
