/* The vector types and helpers of the fast path's CPU kernels (cpu_kernels.c, cpu_attention.c). Every kernel
 * is written once over T (float32 and float64: the tests run float64 models) with GCC/Clang vector extensions
 * of VB bytes (AVX2's 8 floats or 4 doubles; narrower ISAs split them). */
#ifndef DFLASH_CPU_KERNELS_H
#define DFLASH_CPU_KERNELS_H

#include <math.h>
#include <stdint.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

#define VB 32

typedef float vf __attribute__((vector_size(VB)));
typedef double vd __attribute__((vector_size(VB)));
typedef int32_t vi __attribute__((vector_size(VB)));
typedef int64_t vl __attribute__((vector_size(VB)));

static inline long min_l(long a, long b) { return a < b ? a : b; }
static inline long max_l(long a, long b) { return a > b ? a : b; }

/* exp over a vector of floats: Cephes' expf (range reduction to [-ln2/2, ln2/2], degree-5 polynomial,
 * then 2^n in the exponent bits); about one ulp. Inputs below -87.3 give about 1e-38, not 0. */
static inline vf exp_vf(vf x) {
    const vf hi = (vf){0} + 88.3762626647949f, lo = (vf){0} + -87.3365478515625f;
    vi over = x > hi, under = x < lo;
    x = (vf)(((vi)x & ~over) | ((vi)hi & over));
    x = (vf)(((vi)x & ~under) | ((vi)lo & under));
    vf fx = x * 1.44269504088896341f;
    fx = (fx + 12582912.0f) - 12582912.0f; /* round to nearest (|fx| < 2^22) */
    x = x - fx * 0.693359375f - fx * -2.12194440e-4f;
    vf y = (vf){0} + 1.9875691500e-4f;
    y = y * x + 1.3981999507e-3f;
    y = y * x + 8.3334519073e-3f;
    y = y * x + 4.1665795894e-2f;
    y = y * x + 1.6666665459e-1f;
    y = y * x + 5.0000001201e-1f;
    y = y * x * x + x + 1.0f;
    vi e = (__builtin_convertvector(fx, vi) + 127) << 23;
    return (vf)((vi)(y * (vf)e) & ~under); /* 0 below the range (exp(-inf) included), as libm's */
}

static inline vd exp_vd(vd x) { /* float64 runs only in tests: libm's exp, lane by lane */
    for (int i = 0; i < (int)(VB / sizeof(double)); i++) x[i] = exp(x[i]);
    return x;
}

/* out[j] = the sum of the lanes of v[j], j < 4 */
static inline void hsum4_f32(const vf *v, float *out) {
#if defined(__AVX__) && VB == 32
    __m256 ab = _mm256_hadd_ps((__m256)v[0], (__m256)v[1]), cd = _mm256_hadd_ps((__m256)v[2], (__m256)v[3]);
    __m256 all = _mm256_hadd_ps(ab, cd); /* lanes 0-3: halves of the four sums, lanes 4-7: the other halves */
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(all), _mm256_extractf128_ps(all, 1)));
#else
    for (int j = 0; j < 4; j++) { float t = 0; for (int i = 0; i < 8; i++) t += v[j][i]; out[j] = t; }
#endif
}

static inline void hsum4_f64(const vd *v, double *out) {
    for (int j = 0; j < 4; j++) { double t = 0; for (int i = 0; i < 4; i++) t += v[j][i]; out[j] = t; }
}

/* per T: its vector width N, load and store at any alignment, the sum of a vector's lanes */
#define DEFINE_HELPERS(T, V, SUF)                                                                            \
enum { N_##SUF = VB / sizeof(T), PW_##SUF = 2 * (VB / sizeof(T)) };                                          \
static inline V ld_##SUF(const T *p) { V v; memcpy(&v, p, sizeof v); return v; }                             \
static inline void st_##SUF(T *p, V v) { memcpy(p, &v, sizeof v); }                                          \
static inline T hsum_##SUF(V v) { T s = 0; for (int i = 0; i < N_##SUF; i++) s += v[i]; return s; }

DEFINE_HELPERS(float, vf, f32)
DEFINE_HELPERS(double, vd, f64)

#endif
