/* The fast path's CPU kernels: what triton_gemm, triton_ops and triton_attn do on a GPU, for one CPU thread.
 *
 * cpu_kernels.py compiles this file with the machine's C compiler (-O3 -march=native, about a second, once per
 * source and machine) and calls it through ctypes; model.py's torch ops are the reference, and the tests
 * compare the two. Every kernel is written once over T (float32 and float64: the tests run float64 models)
 * with GCC/Clang vector extensions of VB bytes (AVX2's 8 floats or 4 doubles; narrower ISAs split them).
 *
 * - linear: y = x @ w.T + bias over a weight packed in panels of PW output columns, `[n / PW, k, PW]`, so
 *   that a panel streams contiguously while 6 rows of x accumulate 6 x PW outputs in registers (no
 *   horizontal sums). MKL's sgemm costs about twice a one-row gemv from 2 to 8 rows on this kind of CPU
 *   (benchmarks/cpu_step.py); this kernel reads each weight once for up to 6 rows, and rows are blocked by
 *   ROW_BLOCK so that large m (prefill) reuses a panel from the L1/L2 caches.
 * - attention: q `[bs, n, H, hd]` over the slot cache, each row reading only the keys its queries may see
 *   (causal, the non-causal DFlash block, a sliding window), all query heads of a KV head together, in
 *   tiles of TILE keys with an online softmax.
 * - rms_norm (with the residual add), silu_mul, embed_norm, qk_rope_store (q/k norm, RoPE from float32
 *   tables, the K/V cache write) and commit (greedy or synthetic acceptance, the per-slot state).
 */
#include <math.h>
#include <stdint.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

#define VB 32
#define ROWS 6         /* rows of x per register tile of linear */
#define ROW_BLOCK 96   /* rows of x per pass over the panels (a pass reuses each panel ROW_BLOCK / ROWS times) */
#define TILE 64        /* keys per attention tile */
/* linear prefetches the packed weight this many steps of k (one 64-byte line each) ahead, across panels:
 * a chain of the embedded target's matmuls at 4 rows 2.44 -> 1.72 ms (median), at 1 row unchanged */
#define PF_DIST 128

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

#define DEFINE_KERNELS(T, V, VI, SUF, EXPV)                                                                    \
enum { N_##SUF = VB / sizeof(T), PW_##SUF = 2 * (VB / sizeof(T)) };                                          \
static inline V ld_##SUF(const T *p) { V v; memcpy(&v, p, sizeof v); return v; }                             \
static inline void st_##SUF(T *p, V v) { memcpy(p, &v, sizeof v); }                                          \
static inline T hsum_##SUF(V v) { T s = 0; for (int i = 0; i < N_##SUF; i++) s += v[i]; return s; }          \
                                                                                                             \
/* rows (<= ROWS) x PW outputs of one panel; `rows` is a constant wherever this is inlined */                \
static inline __attribute__((always_inline)) void tile_##SUF(                                                \
        int rows, const T *x, long ldx, const T *w, long k, const T *bias, T *y, long ldy) {                 \
    enum { N = N_##SUF, PW = PW_##SUF };                                                                     \
    V a[ROWS][2];                                                                                            \
    V b0 = {0}, b1 = {0};                                                                                    \
    if (bias) { b0 = ld_##SUF(bias); b1 = ld_##SUF(bias + N); }                                              \
    for (int i = 0; i < rows; i++) { a[i][0] = b0; a[i][1] = b1; }                                           \
    for (long p = 0; p < k; p++) {                                                                           \
        __builtin_prefetch(w + (p + PF_DIST) * PW); /* non-faulting past the end */                          \
        V w0 = ld_##SUF(w + p * PW), w1 = ld_##SUF(w + p * PW + N);                                          \
        for (int i = 0; i < rows; i++) {                                                                     \
            T xi = x[i * ldx + p];                                                                           \
            a[i][0] += xi * w0;                                                                              \
            a[i][1] += xi * w1;                                                                              \
        }                                                                                                    \
    }                                                                                                        \
    for (int i = 0; i < rows; i++) { st_##SUF(y + i * ldy, a[i][0]); st_##SUF(y + i * ldy + N, a[i][1]); }  \
}                                                                                                            \
                                                                                                             \
/* y [m, n] (row stride ldy) = x [m, k] (row stride ldx) @ w.T + bias, w packed as [n / PW, k, PW] */       \
void linear_##SUF(const T *x, long ldx, long m, long k, const T *w, long n, const T *bias, T *y, long ldy) {  \
    enum { PW = PW_##SUF };                                                                                  \
    for (long r0 = 0; r0 < m; r0 += ROW_BLOCK) {                                                             \
        long r1 = min_l(m, r0 + ROW_BLOCK);                                                                  \
        for (long j = 0; j * PW < n; j++) {                                                                  \
            const T *panel = w + j * k * PW, *b = bias ? bias + j * PW : 0;                                  \
            for (long r = r0; r < r1; r += ROWS) {                                                           \
                const T *xr = x + r * ldx;                                                                   \
                T *yr = y + r * ldy + j * PW;                                                                \
                switch (min_l(ROWS, r1 - r)) {                                                               \
                case 6: tile_##SUF(6, xr, ldx, panel, k, b, yr, ldy); break;                           \
                case 5: tile_##SUF(5, xr, ldx, panel, k, b, yr, ldy); break;                           \
                case 4: tile_##SUF(4, xr, ldx, panel, k, b, yr, ldy); break;                           \
                case 3: tile_##SUF(3, xr, ldx, panel, k, b, yr, ldy); break;                           \
                case 2: tile_##SUF(2, xr, ldx, panel, k, b, yr, ldy); break;                           \
                default: tile_##SUF(1, xr, ldx, panel, k, b, yr, ldy); break;                          \
                }                                                                                            \
            }                                                                                                \
        }                                                                                                    \
    }                                                                                                        \
}                                                                                                            \
                                                                                                             \
static T sumsq_##SUF(const T *x, long n) {                                                                   \
    V acc = {0};                                                                                             \
    long i = 0;                                                                                              \
    for (; i + N_##SUF <= n; i += N_##SUF) { V v = ld_##SUF(x + i); acc += v * v; }                          \
    T s = hsum_##SUF(acc);                                                                                   \
    for (; i < n; i++) s += x[i] * x[i];                                                                     \
    return s;                                                                                                \
}                                                                                                            \
                                                                                                             \
static void scale_##SUF(const T *x, T r, const T *w, T *out, long n) { /* out = x * r * w (w may be 0) */    \
    long i = 0;                                                                                              \
    for (; i + N_##SUF <= n; i += N_##SUF) {                                                                 \
        V v = ld_##SUF(x + i) * r;                                                                           \
        st_##SUF(out + i, w ? v * ld_##SUF(w + i) : v);                                                      \
    }                                                                                                        \
    for (; i < n; i++) out[i] = w ? x[i] * r * w[i] : x[i] * r;                                              \
}                                                                                                            \
                                                                                                             \
/* per row: sum = h + a (when a is given), out = rms_norm(sum or h) * w; rows of n, contiguous */           \
void rms_norm_##SUF(const T *h, const T *a, T *sum, const T *w, T *out, long rows, long n, double eps) {     \
    for (long r = 0; r < rows; r++) {                                                                        \
        const T *x = h + r * n;                                                                              \
        if (a) {                                                                                             \
            T *s = sum + r * n;                                                                              \
            long i = 0;                                                                                      \
            for (; i + N_##SUF <= n; i += N_##SUF) st_##SUF(s + i, ld_##SUF(x + i) + ld_##SUF(a + r * n + i)); \
            for (; i < n; i++) s[i] = x[i] + a[r * n + i];                                                   \
            x = s;                                                                                           \
        }                                                                                                    \
        T rs = (T)(1.0 / sqrt((double)sumsq_##SUF(x, n) / n + eps));                                         \
        scale_##SUF(x, rs, w, out + r * n, n);                                                               \
    }                                                                                                        \
}                                                                                                            \
                                                                                                             \
/* out[r] = the first column of row r's maximum, x [rows, n] with row stride ld */                           \
static inline V vmax_##SUF(V a, V b) { VI gt = a > b; return (V)(((VI)a & gt) | ((VI)b & ~gt)); }           \
void argmax_##SUF(const T *x, long ld, long rows, long n, int64_t *out) {                                    \
    enum { N = N_##SUF };                                                                                    \
    for (long r = 0; r < rows; r++) {                                                                        \
        const T *xr = x + r * ld;                                                                            \
        V m0 = (V){0} - INFINITY, m1 = m0, m2 = m0, m3 = m0;                                                 \
        long i = 0;                                                                                          \
        for (; i + 4 * N <= n; i += 4 * N) {                                                                 \
            m0 = vmax_##SUF(ld_##SUF(xr + i), m0); m1 = vmax_##SUF(ld_##SUF(xr + i + N), m1);                \
            m2 = vmax_##SUF(ld_##SUF(xr + i + 2 * N), m2); m3 = vmax_##SUF(ld_##SUF(xr + i + 3 * N), m3);    \
        }                                                                                                    \
        m0 = vmax_##SUF(vmax_##SUF(m0, m1), vmax_##SUF(m2, m3));                                             \
        T m = -INFINITY;                                                                                     \
        for (int j = 0; j < N; j++) if (m0[j] > m) m = m0[j];                                                \
        for (; i < n; i++) if (xr[i] > m) m = xr[i];                                                         \
        long best = 0;                                                                                       \
        for (; best + N <= n; best += N) { /* the first vector holding the maximum, then its lane */        \
            VI eq = ld_##SUF(xr + best) == m;                                                                \
            int any = 0;                                                                                     \
            for (int j = 0; j < N; j++) any |= eq[j] != 0;                                                   \
            if (any) break;                                                                                  \
        }                                                                                                    \
        while (best < n - 1 && xr[best] != m) best++;                                                        \
        out[r] = best;                                                                                       \
    }                                                                                                        \
}                                                                                                            \
                                                                                                             \
/* out [rows, n] = silu(gu[:, :n]) * gu[:, n:], gu rows of 2n with row stride ld */                          \
void silu_mul_##SUF(const T *gu, long ld, T *out, long rows, long n) {                                       \
    for (long r = 0; r < rows; r++) {                                                                        \
        const T *g = gu + r * ld, *u = g + n;                                                                \
        T *o = out + r * n;                                                                                  \
        long i = 0;                                                                                          \
        for (; i + N_##SUF <= n; i += N_##SUF) {                                                             \
            V x = ld_##SUF(g + i);                                                                           \
            st_##SUF(o + i, x / (1 + EXPV(-x)) * ld_##SUF(u + i));                                           \
        }                                                                                                    \
        for (; i < n; i++) o[i] = g[i] / (1 + (T)exp(-(double)g[i])) * u[i];                                 \
    }                                                                                                        \
}                                                                                                            \
                                                                                                             \
/* h [bs * n, hidden] = embed[token] * scale, out = rms_norm(h) * w; token = ids[b, j], or with fill >= 0    \
 * ids[b, 0] then fill (the DFlash block) */                                                                 \
void embed_norm_##SUF(const int64_t *ids, long s_b, long s_j, long bs, long n, long fill, const T *embed,    \
                      long hidden, double scale, const T *w, double eps, T *h, T *out) {                     \
    for (long b = 0; b < bs; b++)                                                                            \
        for (long j = 0; j < n; j++) {                                                                       \
            long tok = (fill >= 0 && j > 0) ? fill : ids[b * s_b + j * s_j];                                 \
            T *hr = h + (b * n + j) * hidden;                                                                \
            if (scale == 1.0) memcpy(hr, embed + tok * hidden, hidden * sizeof(T));                          \
            else scale_##SUF(embed + tok * hidden, (T)scale, 0, hr, hidden);                                 \
            T rs = (T)(1.0 / sqrt((double)sumsq_##SUF(hr, hidden) / hidden + eps));                          \
            scale_##SUF(hr, rs, w, out + (b * n + j) * hidden, hidden);                                      \
        }                                                                                                    \
}                                                                                                            \
                                                                                                             \
/* From qkv [t, (nq + 2 hkv) hd] (row stride ld): q [t, nq, hd] (when nq > 0), and k, v into the cache at    \
 * (rows[i], pos[i]); q/k norm with wqk [nq + hkv, hd] when given; NeoX RoPE from float32 tables            \
 * [max_len, hd / 2] */                                                                                      \
void qk_rope_store_##SUF(const T *qkv, long ld, long t, long nq, long hkv, long hd, const float *cos,         \
                         const float *sin, const int64_t *rows, const int64_t *pos, T *kc, T *vc, long s_slot, \
                         long s_pos, long s_head, const T *wqk, double eps, T *q) {                          \
    long half = hd / 2;                                                                                      \
    T buf[hd];                                                                                               \
    for (long i = 0; i < t; i++) {                                                                           \
        const T *src = qkv + i * ld;                                                                         \
        const float *c = cos + pos[i] * half, *s = sin + pos[i] * half;                                      \
        long kv = rows[i] * s_slot + pos[i] * s_pos;                                                         \
        for (long h = 0; h < nq + hkv; h++) {                                                                \
            const T *x = src + h * hd;                                                                       \
            if (wqk) {                                                                                       \
                T rs = (T)(1.0 / sqrt((double)sumsq_##SUF(x, hd) / hd + eps));                               \
                scale_##SUF(x, rs, wqk + h * hd, buf, hd);                                                   \
                x = buf;                                                                                     \
            }                                                                                                \
            T *dst = h < nq ? q + (i * nq + h) * hd : kc + kv + (h - nq) * s_head;                           \
            for (long d = 0; d < half; d++) {                                                                \
                T x1 = x[d], x2 = x[d + half];                                                               \
                dst[d] = x1 * (T)c[d] - x2 * (T)s[d];                                                        \
                dst[d + half] = x2 * (T)c[d] + x1 * (T)s[d];                                                 \
            }                                                                                                \
        }                                                                                                    \
        for (long g = 0; g < hkv; g++)                                                                       \
            memcpy(vc + kv + g * s_head, src + (nq + hkv + g) * hd, hd * sizeof(T));                         \
    }                                                                                                        \
}                                                                                                            \
                                                                                                             \
/* One tile [k0, k1) of keys (K, V rows s_pos apart) for rb (1 or 2, a constant where inlined) query rows   \
 * q[r], pre-scaled, with key ranges [lo[r], hi[r]): scores (4 keys at a time), an online-softmax update of \
 * mx, sum and the rows' unnormalised outputs acc (rows of hd), then p @ V. sc: [rb][TILE] scratch. */      \
static inline __attribute__((always_inline)) void attn_tile_##SUF(                                           \
        int rb, const T *const *q, const T *K, const T *Vv, long s_pos, long hd, const long *lo,             \
        const long *hi, long k0, long k1, T *sc, T *mx, T *sum, T *acc) {                                    \
    enum { N = N_##SUF };                                                                                    \
    long a = k1, e = k0;                                                                                     \
    for (int r = 0; r < rb; r++) { a = min_l(a, max_l(k0, lo[r])); e = max_l(e, min_l(k1, hi[r])); }        \
    if (a >= e) return;                                                                                      \
    long kk = a;                                                                                             \
    for (; kk + 4 <= e; kk += 4) {                                                                           \
        V d[2][4] = {{{0}}};                                                                                 \
        const T *kr = K + kk * s_pos;                                                                        \
        for (long c = 0; c < hd; c += N) {                                                                   \
            V x0 = ld_##SUF(kr + c), x1 = ld_##SUF(kr + s_pos + c);                                          \
            V x2 = ld_##SUF(kr + 2 * s_pos + c), x3 = ld_##SUF(kr + 3 * s_pos + c);                          \
            for (int r = 0; r < rb; r++) {                                                                   \
                V qv = ld_##SUF(q[r] + c);                                                                   \
                d[r][0] += qv * x0; d[r][1] += qv * x1; d[r][2] += qv * x2; d[r][3] += qv * x3;              \
            }                                                                                                \
        }                                                                                                    \
        for (int r = 0; r < rb; r++) hsum4_##SUF(d[r], sc + r * TILE + kk - k0);                             \
    }                                                                                                        \
    for (; kk < e; kk++) {                                                                                   \
        V d[2] = {{0}};                                                                                      \
        for (long c = 0; c < hd; c += N) {                                                                   \
            V x = ld_##SUF(K + kk * s_pos + c);                                                              \
            for (int r = 0; r < rb; r++) d[r] += ld_##SUF(q[r] + c) * x;                                     \
        }                                                                                                    \
        for (int r = 0; r < rb; r++) sc[r * TILE + kk - k0] = hsum_##SUF(d[r]);                              \
    }                                                                                                        \
    for (int r = 0; r < rb; r++) { /* softmax: p = exp(s - max) on the row's keys, 0 on the others */        \
        T *s = sc + r * TILE - k0;                                                                           \
        long ar = max_l(a, lo[r]), er = min_l(e, hi[r]);                                                     \
        if (ar >= er) { memset(s + a, 0, sizeof(T) * (e - a)); continue; }                                   \
        for (long i = a; i < ar; i++) s[i] = -INFINITY;                                                      \
        for (long i = er; i < e; i++) s[i] = -INFINITY;                                                      \
        V mv = (V){0} - INFINITY;                                                                            \
        long i = a;                                                                                          \
        for (; i + N <= e; i += N) { V x = ld_##SUF(s + i); VI gt = x > mv; mv = (V)(((VI)x & gt) | ((VI)mv & ~gt)); } \
        T m = mx[r];                                                                                         \
        for (int j = 0; j < N; j++) if (mv[j] > m) m = mv[j];                                                \
        for (; i < e; i++) if (s[i] > m) m = s[i];                                                           \
        T alpha = mx[r] == -INFINITY ? 0 : (T)exp((double)(mx[r] - m)), l = 0;                               \
        V lv = {0};                                                                                          \
        for (i = a; i + N <= e; i += N) { V p = EXPV(ld_##SUF(s + i) - m); st_##SUF(s + i, p); lv += p; }   \
        l = hsum_##SUF(lv);                                                                                  \
        for (; i < e; i++) { s[i] = s[i] == -INFINITY ? 0 : (T)exp((double)(s[i] - m)); l += s[i]; }         \
        mx[r] = m;                                                                                           \
        sum[r] = sum[r] * alpha + l;                                                                         \
        if (alpha != 1) for (long c = 0; c < hd; c += N) st_##SUF(acc + r * hd + c, ld_##SUF(acc + r * hd + c) * alpha); \
    }                                                                                                        \
    long c = 0;                                                                                              \
    for (; c + 4 * N <= hd; c += 4 * N) { /* p @ V, four vectors of the head dim per pass */                 \
        V o[2][4];                                                                                           \
        for (int r = 0; r < rb; r++) for (int j = 0; j < 4; j++) o[r][j] = ld_##SUF(acc + r * hd + c + j * N); \
        for (long i = a; i < e; i++) {                                                                       \
            const T *vr = Vv + i * s_pos + c;                                                                \
            V v0 = ld_##SUF(vr), v1 = ld_##SUF(vr + N), v2 = ld_##SUF(vr + 2 * N), v3 = ld_##SUF(vr + 3 * N); \
            for (int r = 0; r < rb; r++) {                                                                   \
                T p = sc[r * TILE + i - k0];                                                                 \
                o[r][0] += p * v0; o[r][1] += p * v1; o[r][2] += p * v2; o[r][3] += p * v3;                  \
            }                                                                                                \
        }                                                                                                    \
        for (int r = 0; r < rb; r++) for (int j = 0; j < 4; j++) st_##SUF(acc + r * hd + c + j * N, o[r][j]); \
    }                                                                                                        \
    for (; c < hd; c += N) {                                                                                 \
        V o[2];                                                                                              \
        for (int r = 0; r < rb; r++) o[r] = ld_##SUF(acc + r * hd + c);                                      \
        for (long i = a; i < e; i++) {                                                                       \
            V v = ld_##SUF(Vv + i * s_pos + c);                                                              \
            for (int r = 0; r < rb; r++) o[r] += sc[r * TILE + i - k0] * v;                                  \
        }                                                                                                    \
        for (int r = 0; r < rb; r++) st_##SUF(acc + r * hd + c, o[r]);                                       \
    }                                                                                                        \
}                                                                                                            \
                                                                                                             \
/* out [bs * n, H * hd] = attention of q [bs, n, H, hd] (contiguous) over slots row0.. of the caches (strides \
 * s_slot, s_pos = Hkv * hd, s_head = hd; hd a multiple of the vector width): query j of row b at           \
 * p = starts[b] + j sees key k iff k <= p (causal) or k < starts[b] + n (not), and with window > 0 also    \
 * |p - k| < window. Per row b, tiles of TILE keys: the tile's keys and values, every KV head, are copied   \
 * (one sequential read: strided reads of each head's half measured 25% slower at 32 rows), then every     \
 * query head goes over them, two rows at a time. */                                                        \
int attention_##SUF(const T *q, const T *kc, const T *vc, long s_slot, long s_pos, long s_head,              \
                    const int64_t *starts, long row0, long bs, long n, long H, long hkv, long hd, double scale, \
                    int causal, long window, T *out) {                                                       \
    long rep = H / hkv, nr = rep * n; /* query rows per KV head */                                           \
    T *sc = malloc(sizeof(T) * (2 * TILE + H * n * 2 * hd + 2 * TILE * s_pos + 2 * H * n));                  \
    long *lo = malloc(sizeof(long) * 2 * nr);                                                                \
    const T **qr = malloc(sizeof(T *) * H * n);                                                              \
    if (!sc || !lo || !qr) { free(sc); free(lo); free(qr); return -1; }                                      \
    T *acc = sc + 2 * TILE, *qs = acc + H * n * hd, *kt = qs + H * n * hd, *vt = kt + TILE * s_pos;          \
    T *mx = vt + TILE * s_pos, *sum = mx + H * n;                                                            \
    long *hi = lo + nr;                                                                                      \
    for (long b = 0; b < bs; b++) {                                                                          \
        long s0 = starts[b], klo = s0 + n, khi = 0;                                                          \
        for (long i = 0; i < nr; i++) { /* row i of a KV head: query j = i / rep, its (i % rep)th head */    \
            long p = s0 + i / rep;                                                                           \
            lo[i] = window > 0 ? max_l(0, p - window + 1) : 0;                                               \
            hi[i] = causal ? p + 1 : (window > 0 ? min_l(s0 + n, p + window) : s0 + n);                      \
            klo = min_l(klo, lo[i]);                                                                         \
            khi = max_l(khi, hi[i]);                                                                         \
        }                                                                                                    \
        const T *K = kc + (row0 + b) * s_slot, *Vv = vc + (row0 + b) * s_slot;                               \
        for (long i = 0; i < hkv * nr; i++) { /* rows of KV head g: g * nr .. (g + 1) * nr - 1 */             \
            long g = i / nr, r = i % nr;                                                                     \
            const T *src = q + ((b * n + r / rep) * H + g * rep + r % rep) * hd;                             \
            for (long c = 0; c < hd; c++) qs[i * hd + c] = src[c] * (T)scale;                                \
            qr[i] = qs + i * hd;                                                                             \
            mx[i] = -INFINITY;                                                                               \
            sum[i] = 0;                                                                                      \
        }                                                                                                    \
        memset(acc, 0, sizeof(T) * hkv * nr * hd);                                                           \
        for (long k0 = klo; k0 < khi; k0 += TILE) {                                                          \
            long k1 = min_l(khi, k0 + TILE);                                                                 \
            memcpy(kt, K + k0 * s_pos, sizeof(T) * (k1 - k0) * s_pos);                                       \
            memcpy(vt, Vv + k0 * s_pos, sizeof(T) * (k1 - k0) * s_pos);                                      \
            const T *Kt = kt - k0 * s_pos, *Vt = vt - k0 * s_pos;                                            \
            for (long g = 0; g < hkv; g++) {                                                                 \
                long i = 0, o = g * nr;                                                                      \
                for (; i + 2 <= nr; i += 2)                                                                  \
                    attn_tile_##SUF(2, qr + o + i, Kt + g * s_head, Vt + g * s_head, s_pos, hd, lo + i, hi + i, \
                                    k0, k1, sc, mx + o + i, sum + o + i, acc + (o + i) * hd);               \
                if (i < nr)                                                                                  \
                    attn_tile_##SUF(1, qr + o + i, Kt + g * s_head, Vt + g * s_head, s_pos, hd, lo + i, hi + i, \
                                    k0, k1, sc, mx + o + i, sum + o + i, acc + (o + i) * hd);               \
            }                                                                                                \
        }                                                                                                    \
        for (long i = 0; i < hkv * nr; i++) {                                                                \
            long g = i / nr, r = i % nr;                                                                     \
            T *o = out + (b * n + r / rep) * H * hd + (g * rep + r % rep) * hd, inv = sum[i] > 0 ? 1 / sum[i] : 0; \
            for (long c = 0; c < hd; c++) o[c] = acc[i * hd + c] * inv;                                      \
        }                                                                                                    \
    }                                                                                                        \
    free(sc);                                                                                                \
    free(lo);                                                                                                \
    free(qr);                                                                                                \
    return 0;                                                                                                \
}

DEFINE_KERNELS(float, vf, vi, f32, exp_vf)
DEFINE_KERNELS(double, vd, vl, f64, exp_vd)

/* A step's commit, per row r of bs: accept the leading drafts that equal the target's tokens `post` (or, with
 * uniforms, those whose uniform at table row step[r] % steps is below rate, advancing step[r]); then for an
 * active row start += accepted + 1 and anchor = the bonus token; out = [accepted, drafts, bonus]. post
 * [bs, B] (B - 1 drafts verified, B == 1 for AR); strides in elements. */
void commit(const int64_t *post, long s_post, const int64_t *drafts, long s_drafts, const int64_t *active,
            int64_t *start, int64_t *anchor, long s_anchor, int64_t *out, long s_out, long bs, long B,
            const float *uniforms, long steps, long s_step, long s_row, int64_t *step, double rate) {
    for (long r = 0; r < bs; r++) {
        const int64_t *pr = post + r * s_post, *dr = drafts + r * s_drafts;
        long acc = 0;
        if (uniforms) {
            const float *u = uniforms + (step[r] % steps) * s_step + r * s_row;
            step[r] += 1;
            while (acc < B - 1 && u[acc] < rate) acc++;
        } else {
            while (acc < B - 1 && dr[acc] == pr[acc]) acc++;
        }
        int64_t bonus = pr[acc];
        if (active[r]) {
            start[r] += acc + 1;
            anchor[r * s_anchor] = bonus;
        }
        int64_t *o = out + r * s_out;
        o[0] = acc;
        for (long k = 0; k < B - 1; k++) o[1 + k] = dr[k];
        o[B] = bonus;
    }
}
