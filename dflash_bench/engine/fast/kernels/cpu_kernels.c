/* The fast path's CPU kernels: what triton_gemm and triton_ops do on a GPU, for one CPU thread (the attention,
 * triton_attn's, is cpu_attention.c; their vector helpers cpu_kernels.h).
 *
 * cpu_kernels.py compiles both files with the machine's C compiler (-O3 -march=native, about 1.5 s, once per
 * source and flags) and calls them through ctypes; decoder.py's torch ops are the reference, and the tests
 * compare the two.
 *
 * - linear: y = x @ w.T + bias over a weight packed in panels of PW output columns, `[n / PW, k, PW]`, so
 *   that a panel streams contiguously while 6 rows of x accumulate 6 x PW outputs in registers (no
 *   horizontal sums). MKL's sgemm costs about twice a one-row gemv from 2 to 8 rows on this kind of CPU
 *   (benchmarks/speed/cpu_step.py); this kernel reads each weight once for up to 6 rows, and rows are blocked by
 *   ROW_BLOCK so that large m (prefill) reuses a panel from the L1/L2 caches.
 * - argmax, rms_norm (with the residual add), silu_mul, embed_norm, qk_rope_store (q/k norm, RoPE from
 *   float32 tables, the K/V cache write) and commit (greedy or synthetic acceptance, the per-slot state).
 */
#include "cpu_kernels.h"

#define ROWS 6         /* rows of x per register tile of linear */
#define ROW_BLOCK 96   /* rows of x per pass over the panels (a pass reuses each panel ROW_BLOCK / ROWS times) */
/* linear prefetches the packed weight this many steps of k (one 64-byte line each) ahead, across panels:
 * a chain of the embedded target's matmuls at 4 rows 2.44 -> 1.72 ms (median), at 1 row unchanged */
#define PF_DIST 128

#define DEFINE_KERNELS(T, V, VI, SUF, EXPV)                                                                    \
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
