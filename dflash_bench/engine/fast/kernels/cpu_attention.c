/* The fast path's CPU attention (`triton_attn.decode_attention` on a GPU): each row reads only the keys its
 * queries may see (causal, the non-causal DFlash block, a sliding window), all query heads of a KV head
 * together, in tiles of TILE keys with an online softmax. Built with cpu_kernels.c (see there). */
#include "cpu_kernels.h"

#define TILE 64 /* keys per attention tile */

#define DEFINE_ATTENTION(T, V, VI, SUF, EXPV)                                                                  \
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
 * |p - k| < window. ring > 0: the caches hold key k at row k % ring (a sliding layer's window). Per row b, tiles of TILE keys: the tile's keys and values, every KV head, are copied   \
 * (one sequential read: strided reads of each head's half measured 25% slower at 32 rows), then every     \
 * query head goes over them, two rows at a time. */                                                        \
int attention_##SUF(const T *q, const T *kc, const T *vc, long s_slot, long s_pos, long s_head,              \
                    const int64_t *starts, long row0, long bs, long n, long H, long hkv, long hd, double scale, \
                    int causal, long window, long ring, T *out) {                                            \
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
            long r0 = ring > 0 ? k0 % ring : k0, m = ring > 0 ? min_l(k1 - k0, ring - r0) : k1 - k0;          \
            memcpy(kt, K + r0 * s_pos, sizeof(T) * m * s_pos);                                               \
            memcpy(vt, Vv + r0 * s_pos, sizeof(T) * m * s_pos);                                              \
            if (m < k1 - k0) { /* the tile wraps around the ring */                                          \
                memcpy(kt + m * s_pos, K, sizeof(T) * (k1 - k0 - m) * s_pos);                                \
                memcpy(vt + m * s_pos, Vv, sizeof(T) * (k1 - k0 - m) * s_pos);                               \
            }                                                                                                \
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

DEFINE_ATTENTION(float, vf, vi, f32, exp_vf)
DEFINE_ATTENTION(double, vd, vl, f64, exp_vd)
