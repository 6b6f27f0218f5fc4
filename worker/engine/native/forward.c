/* The whole forward of a Llama-family decoder for N tokens, each at its own (slot, position), with the parts
 * Gemma 2 / 3 add where a layer names them: norms of attention's and the MLP's outputs before each residual add,
 * a sliding window, a rotary table of its own (local / global bases), and model-wide GeGLU and soft-capped
 * attention scores. Gemma's (1 + w) norms, scaled embeddings and capped logits are the caller's: it folds the
 * one into the weights, the others into the input embeddings and the returned logits.
 *
 * Projections hold groups of 32 weights as unsigned codes u with a per-group binary16 scale d and
 * minimum m (w = d * u + m), stored after each tile group's codes: 4-bit codes packed two to a byte, or
 * 8-bit codes. Each projection's input is quantized per 32-block to int8 (x = a * q), so a group's product is
 *     d * a * sum(u * q) + m * a * sum(q)
 * whose integer part runs on AVX512-VNNI (vpdpbusd: unsigned x signed bytes into int32) where the
 * compiler targets it, else on plain C.
 *
 * The VNNI kernel works on register tiles of 16 weight rows x up to TOKEN_TILE tokens: the codes are
 * stored 16 rows side by side (pack.py's layout), so one vpdpbusd adds 4 inputs of 16 rows for one token
 * (its 4 activation bytes broadcast), a group's integer sums of 16 rows land in one vector, and the float
 * part (convert, the scales, the minimum's part) runs once per group for 16 rows rather than per row.
 * Each token's sums run in the same order whatever the tile holds (groups in turn, rows in lanes), so a
 * token's result does not depend on N or on the other tokens of its call.
 *
 * A team of threads runs the whole call: each projection splits its output rows between them (every
 * weight row is read once for all N tokens), attention splits (token, head) pairs. The team is our own
 * pthreads with a barrier that spins briefly, then yields: OpenMP's runtime is the one torch loaded, its
 * wait policy fixed at torch's import, and its spinning barriers ran a step 4x slower than one thread on a
 * host busier than its cores (measured). About 10 barriers a layer. The KV
 * cache is the caller's IEEE half-precision tensors (torch.float16), [slots, kv_heads, capacity, head_dim]
 * per layer: half the memory of float32, its rounding (2^-11 relative) far below the int8 activations'.
 * Keys and values are rounded once, when written; attention widens them to float32 as it reads. Within a
 * layer every token's key/value is written before any attention reads, so the tokens of a prefill
 * chunk (one slot, consecutive positions) see each other causally.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include "exp16.h"
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define SLUICE_VNNI 1
#else
#define SLUICE_VNNI 0
#endif

/* a KV cache element: binary16 (F16C / AVX512F convert 16 at a time; elsewhere the compiler's _Float16) */
typedef _Float16 kv_t;

#define GROUP 32
#define TILE_ROWS 16  /* output rows of a register tile: an int32 lane each (pack.py's TILE_ROWS) */
#define TOKEN_TILE 8  /* tokens of a register tile: an int32 and a float accumulator each */
#define SCALE_BYTES (TILE_ROWS * 2 * 2) /* a tile group's binary16 scales and minimums (pack.py's SCALE_BYTES) */

typedef struct {
    /* [ceil(rows / 16), cols / 32, 16 * 32 * bits / 8 + 64]: pack.py's tile layout, each tile group's codes
     * followed by its 16 rows' scales and 16 minimums in binary16 */
    const uint8_t *tiles;
    int64_t bits, rows, cols;
} qmat;

typedef struct {
    qmat qkv, o, gate_up, down;
    const float *qkv_bias; /* NULL: none */
    const float *input_norm, *post_norm;
    const float *q_norm, *k_norm; /* per-head RMSNorm weights [head_dim] of q / k (Qwen3); NULL: none */
    const float *attn_out_norm, *mlp_out_norm; /* RMSNorms of attention's / the MLP's output (Gemma); NULL: none */
    const float *rope_cos, *rope_sin; /* this layer's own rotary table, as the model's; NULL: the model's */
    int64_t window; /* > 0: a token attends to its last `window` positions only (sliding); else to all */
} layer_weights;

typedef struct {
    int64_t layers, hidden, heads, kv_heads, head_dim, inter, max_positions;
    float eps, attn_scale;
    const float *rope_cos, *rope_sin; /* [max_positions, head_dim]; sin with rotate_half's sign folded in */
    const float *final_norm;
    qmat head;
    const layer_weights *layer;
    int64_t act; /* the MLP's gate: 1 = GELU, tanh approximation (Gemma's GeGLU); else SiLU */
    float attn_softcap; /* > 0: each score becomes cap * tanh(score / cap) before the softmax (Gemma 2) */
} model_weights;

/* int8 activations of one matrix input, laid out for the register tiles: tokens in tiles of TOKEN_TILE, and
 * within a tile and group, chunk k (inputs 4k..4k+3) of each token in turn, so a tile's broadcasts read one
 * run of bytes: token i's input j at q[(i / T * cols + j / 4 * 4) * T + i % T * 4 + j % 4] (T = TOKEN_TILE).
 * Per token and group its scale a and a * sum(codes) at [(i / T * groups + g) * T + i % T]. */
typedef struct {
    int8_t *q;
    float *scale, *sum;
    int64_t cols;
} qact;

int sluice_native_vnni(void) { return SLUICE_VNNI; }

/* the threads of one call, and their barrier */
typedef struct {
    atomic_int arrived, generation;
    int count;
} barrier_t;

typedef struct {
    int id, count;
    barrier_t *barrier;
} team_t;

#define SPINS 4000 /* pauses before a waiting thread yields its core */

static void sync_team(const team_t *t) {
    if (t->count == 1) return;
    barrier_t *b = t->barrier;
    int generation = atomic_load_explicit(&b->generation, memory_order_acquire);
    if (atomic_fetch_add_explicit(&b->arrived, 1, memory_order_acq_rel) == t->count - 1) {
        atomic_store_explicit(&b->arrived, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&b->generation, 1, memory_order_release);
        return;
    }
    for (int spin = 0; atomic_load_explicit(&b->generation, memory_order_acquire) == generation; spin++) {
        if (spin < SPINS) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        } else {
            sched_yield();
        }
    }
}

/* this thread's share [lo, hi) of `total` items */
static void share(const team_t *t, int64_t total, int64_t *lo, int64_t *hi) {
    *lo = total * t->id / t->count;
    *hi = total * (t->id + 1) / t->count;
}

/* token i's row of `in` (x->cols wide) quantized into x */
static void quantize_token(const float *in, const qact *x, int64_t i) {
    const int64_t groups = x->cols / GROUP, t = i % TOKEN_TILE;
    int8_t *q = x->q + (i - t) * x->cols + 4 * t;
    float *scale = x->scale + (i - t) * groups + t, *sum = x->sum + (i - t) * groups + t;
    for (int64_t g = 0; g < groups; g++) {
        const float *v = in + g * GROUP;
        int8_t *qg = q + g * GROUP * TOKEN_TILE; /* input j at qg[j / 4 * 4 * TOKEN_TILE + j % 4] */
        int total = 0;
        float a;
#if defined(__AVX512F__)
        __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
        float peak = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        a = peak / 127.f;
        __m512 inv = _mm512_set1_ps(peak > 0.f ? 127.f / peak : 0.f);
        /* rounded to nearest even, as lrintf */
        __m512i c0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv)), c1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv));
        total = _mm512_reduce_add_epi32(_mm512_add_epi32(c0, c1));
        int32_t fours[8]; /* each 4 codes as one int32, stored a token tile apart */
        _mm_storeu_si128((__m128i *)fours, _mm512_cvtsepi32_epi8(c0));
        _mm_storeu_si128((__m128i *)(fours + 4), _mm512_cvtsepi32_epi8(c1));
        for (int k = 0; k < 8; k++) memcpy(qg + k * 4 * TOKEN_TILE, fours + k, 4);
#else
        float peak = 0.f;
        for (int j = 0; j < GROUP; j++) peak = fmaxf(peak, fabsf(v[j]));
        a = peak / 127.f;
        float inv = peak > 0.f ? 127.f / peak : 0.f;
        for (int j = 0; j < GROUP; j++) {
            int c = (int)lrintf(v[j] * inv);
            qg[j / 4 * 4 * TOKEN_TILE + j % 4] = (int8_t)c;
            total += c;
        }
#endif
        scale[g * TOKEN_TILE] = a;
        sum[g * TOKEN_TILE] = a * (float)total;
    }
}

/* bytes of the codes of one group of a tile (16 rows x 32 codes), and of the whole group with its scales */
static inline int64_t code_bytes(const qmat *w) { return w->bits == 8 ? TILE_ROWS * GROUP : TILE_ROWS * GROUP / 2; }
static inline int64_t tile_group_bytes(const qmat *w) { return code_bytes(w) + SCALE_BYTES; }

#if SLUICE_VNNI
/* the four activation bytes at q as the int32 that vpdpbusd broadcasts */
typedef int32_t __attribute__((may_alias, aligned(1))) int32_any;

static inline __m512i four(const int8_t *q) { return _mm512_set1_epi32(*(const int32_any *)q); }

/* out[t][lane] = row (r0 + lane) of w . token (t0 + t)'s input, for COUNT tokens: per group, the integer sums
 * of 16 rows (vpdpbusd, lanes = rows), then acc = fma(float(sum) * a, d, acc), acc = fma(m, a * sum(q), acc).
 * always_inline with a constant COUNT: the accumulators stay in registers. */
static inline __attribute__((always_inline)) void tile(const qmat *w, int64_t block, const qact *x, int64_t t0,
                                                       const int COUNT, __mmask16 lanes, __m512 bias, float *out,
                                                       int64_t out_stride, int accumulate) {
    const int64_t groups = w->cols / GROUP, r0 = block * TILE_ROWS, step = tile_group_bytes(w), scales = code_bytes(w);
    const uint8_t *codes = w->tiles + block * groups * step;
    const int8_t *q = x->q + t0 * x->cols; /* this token tile's activations */
    const float *a = x->scale + t0 * groups, *qs = x->sum + t0 * groups;
    const __m512i low = _mm512_set1_epi8(15);
    __m512 acc[TOKEN_TILE];
    for (int t = 0; t < COUNT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++, codes += step) {
        __m512i s[TOKEN_TILE];
        for (int t = 0; t < COUNT; t++) s[t] = _mm512_setzero_si512();
        const int8_t *qg = q + g * GROUP * TOKEN_TILE; /* chunk k of token t: qg + (k * TOKEN_TILE + t) * 4 */
        if (w->bits == 4) {
            for (int k = 0; k < 4; k++) { /* chunk k: inputs 4k.. in the low nibbles, 16 + 4k.. in the high */
                __m512i packed = _mm512_loadu_si512((const void *)(codes + 64 * k));
                __m512i u0 = _mm512_and_si512(packed, low), u1 = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
                for (int t = 0; t < COUNT; t++) {
                    s[t] = _mm512_dpbusd_epi32(s[t], u0, four(qg + (k * TOKEN_TILE + t) * 4));
                    s[t] = _mm512_dpbusd_epi32(s[t], u1, four(qg + ((k + 4) * TOKEN_TILE + t) * 4));
                }
            }
        } else {
            for (int k = 0; k < 8; k++) {
                __m512i u = _mm512_loadu_si512((const void *)(codes + 64 * k));
                for (int t = 0; t < COUNT; t++) s[t] = _mm512_dpbusd_epi32(s[t], u, four(qg + (k * TOKEN_TILE + t) * 4));
            }
        }
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(codes + scales)));
        __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(codes + scales + 32)));
        for (int t = 0; t < COUNT; t++) {
            __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(s[t]), _mm512_set1_ps(a[g * TOKEN_TILE + t]));
            acc[t] = _mm512_fmadd_ps(f, d, acc[t]);
            acc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(qs[g * TOKEN_TILE + t]), acc[t]);
        }
    }
    for (int t = 0; t < COUNT; t++) {
        float *o = out + (t0 + t) * out_stride + r0;
        __m512 value = _mm512_add_ps(acc[t], bias);
        if (accumulate) value = _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, o), value);
        _mm512_mask_storeu_ps(o, lanes, value);
    }
}
#else
/* code of row `lane` of a tile, input j of the group whose bytes are at `codes` */
static inline int tile_code(const qmat *w, const uint8_t *codes, int lane, int j) {
    int k = j / 4, i = j % 4;
    if (w->bits == 8) return codes[64 * k + 4 * lane + i];
    uint8_t b = codes[64 * (k % 4) + 4 * lane + i];
    return k < 4 ? b & 15 : b >> 4;
}
#endif

/* out[t, r] (= or +=) row r of w . token t's input (+ bias), for every token: tiles of 16 rows split between
 * threads, each tile's codes read once for all tokens. */
static void project(const team_t *team, const qmat *w, const qact *x, int64_t n, float *out, int64_t out_stride,
                    int accumulate, const float *bias) {
    const int64_t blocks = (w->rows + TILE_ROWS - 1) / TILE_ROWS;
    int64_t first, last;
    share(team, blocks, &first, &last);
    for (int64_t block = first; block < last; block++) {
        const int64_t r0 = block * TILE_ROWS, live = w->rows - r0 < TILE_ROWS ? w->rows - r0 : TILE_ROWS;
#if SLUICE_VNNI
        const __mmask16 lanes = (__mmask16)((1u << live) - 1);
        const __m512 b = bias ? _mm512_maskz_loadu_ps(lanes, bias + r0) : _mm512_setzero_ps();
        for (int64_t t0 = 0; t0 < n; t0 += TOKEN_TILE) {
            switch (n - t0 < TOKEN_TILE ? (int)(n - t0) : TOKEN_TILE) { /* a constant count each: registers */
#define TILE(COUNT) tile(w, block, x, t0, COUNT, lanes, b, out, out_stride, accumulate); break
            case 8: TILE(8);
            case 7: TILE(7);
            case 6: TILE(6);
            case 5: TILE(5);
            case 4: TILE(4);
            case 3: TILE(3);
            case 2: TILE(2);
            default: TILE(1);
#undef TILE
            }
        }
#else
        const int64_t groups = w->cols / GROUP;
        const uint8_t *codes = w->tiles + block * groups * tile_group_bytes(w);
        for (int lane = 0; lane < live; lane++) {
            for (int64_t t = 0; t < n; t++) {
                const int64_t tt = t % TOKEN_TILE, base = t - tt;
                const int8_t *q = x->q + base * x->cols + 4 * tt;
                const float *a = x->scale + base * groups + tt, *qs = x->sum + base * groups + tt;
                float acc = 0.f;
                for (int64_t g = 0; g < groups; g++) {
                    const uint8_t *cg = codes + g * tile_group_bytes(w);
                    const _Float16 *dm = (const _Float16 *)(cg + code_bytes(w)); /* 16 scales, then 16 minimums */
                    const int8_t *qg = q + g * GROUP * TOKEN_TILE;
                    int32_t s = 0;
                    for (int j = 0; j < GROUP; j++)
                        s += tile_code(w, cg, lane, j) * (int32_t)qg[j / 4 * 4 * TOKEN_TILE + j % 4];
                    acc += (float)s * a[g * TOKEN_TILE] * (float)dm[lane];
                    acc += (float)dm[TILE_ROWS + lane] * qs[g * TOKEN_TILE];
                }
                float value = acc + (bias ? bias[r0 + lane] : 0.f);
                float *o = out + t * out_stride + r0 + lane;
                *o = accumulate ? *o + value : value;
            }
        }
#endif
    }
    sync_team(team);
}

/* RMSNorm of each token's row of `hidden`, quantized into `x` (rows split between threads) */
static void norm_quantize(const team_t *team, const float *hidden, int64_t n, int64_t width, const float *weight,
                          float eps, float *normed, qact *x, const int *rows) {
    int64_t first, last;
    share(team, n, &first, &last);
    for (int64_t i = first; i < last; i++) {
        const float *h = hidden + (rows ? rows[i] : i) * width;
        float *o = normed + i * width;
        double squares = 0.;
        for (int64_t j = 0; j < width; j++) squares += (double)h[j] * h[j];
        float inv = 1.f / sqrtf((float)(squares / width) + eps);
        for (int64_t j = 0; j < width; j++) o[j] = weight[j] * (h[j] * inv);
        quantize_token(o, x, i);
    }
    sync_team(team);
}

/* float32 -> the cache's binary16, rounded to nearest even */
static void to_half(const float *x, kv_t *out, int64_t n) {
    int64_t j = 0;
#if defined(__AVX512F__)
    for (; j + 16 <= n; j += 16)
        _mm256_storeu_si256((__m256i *)(out + j), _mm512_cvtps_ph(_mm512_loadu_ps(x + j), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; j < n; j++) out[j] = (kv_t)x[j];
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* q . k over D values, k in binary16 (16 lanes at a time, then the tail) */
static inline float dot_half(const float *q, const kv_t *k, int64_t D) {
    float s = 0.f;
    int64_t j = 0;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    for (; j + 16 <= D; j += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + j), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(k + j))), acc);
    s = _mm512_reduce_add_ps(acc);
#endif
    for (; j < D; j++) s += q[j] * (float)k[j];
    return s;
}


/* s[0..len-1] = e^(s - peak); returns their sum */
static float exponentiate(float *s, int64_t len, float peak) {
    float total = 0.f;
    int64_t p = 0;
#if defined(__AVX512F__)
    const __m512 top = _mm512_set1_ps(peak);
    __m512 sum = _mm512_setzero_ps();
    for (; p < len; p += 16) {
        const __mmask16 live = len - p >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (len - p)) - 1);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, s + p), top));
        _mm512_mask_storeu_ps(s + p, live, e);
        sum = _mm512_mask_add_ps(sum, live, sum, e);
    }
    total = _mm512_reduce_add_ps(sum);
#endif
    for (; p < len; p++) total += (s[p] = expf(s[p] - peak));
    return total;
}

/* out[0..D-1] = sum over p < len of weight[p] * scale * v[p] (v: [len, D] in binary16); 64 outputs at a time
 * in registers */
static void weigh_values(const float *weight, float scale, const kv_t *v, int64_t len, int64_t D, float *out) {
    int64_t j = 0;
#if defined(__AVX512F__)
    for (; j + 64 <= D; j += 64) {
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
        for (int64_t p = 0; p < len; p++) {
            const __m512 w = _mm512_set1_ps(weight[p] * scale);
            const kv_t *vp = v + p * D + j;
            a0 = _mm512_fmadd_ps(w, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)vp)), a0);
            a1 = _mm512_fmadd_ps(w, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(vp + 16))), a1);
            a2 = _mm512_fmadd_ps(w, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(vp + 32))), a2);
            a3 = _mm512_fmadd_ps(w, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(vp + 48))), a3);
        }
        _mm512_storeu_ps(out + j, a0);
        _mm512_storeu_ps(out + j + 16, a1);
        _mm512_storeu_ps(out + j + 32, a2);
        _mm512_storeu_ps(out + j + 48, a3);
    }
#endif
    for (int64_t k = j; k < D; k++) out[k] = 0.f;
    for (int64_t p = 0; p < len && j < D; p++)
        for (int64_t k = j; k < D; k++) out[k] += weight[p] * scale * (float)v[p * D + k];
}

#define ATTEND_QUERIES 32 /* queries (tokens x heads of a kv head) that share one pass over the keys */
#define KEY_BLOCK 16      /* keys widened to float32 at a time, once for every query of the pass */
#define VALUE_BLOCK 32    /* values widened at a time, likewise */

#if defined(__AVX512F__)
/* The 16 lane sums of 16 vectors p[0..15], in order, each summed as _mm512_reduce_add_ps sums one vector (GCC's:
 * lane j + lane j + 8, then j + 4, then j + 2, then the last two), so a score has the bits dot_half gives it. The
 * sums of 16 keys come out of one transpose-and-add tree (31 shuffles, 15 adds) instead of 16 reductions. */
static inline __m512 reduce_16(const __m512 *p) {
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++) /* [p[2i] lanes j + (j + 8) | p[2i + 1]'s], j < 8 */
        a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int i = 0; i < 4; i++) /* 128-bit lane k: key 4i + k's lanes j + (j + 4), j < 4 */
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int i = 0; i < 2; i++) /* lane k: keys 8i + k and 8i + 4 + k, each its j + (j + 2), j < 2 */
        c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1))); /* 4k + m: key k + 4m */
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r);
}

/* lanes r of a block of 16 from position p0 that lie in [from, len) */
static inline __mmask16 block_lanes(int64_t p0, int64_t from, int64_t len) {
    const int64_t lo = from - p0, hi = len - p0;
    const uint32_t below = hi >= 16 ? 0xFFFFu : hi <= 0 ? 0u : (1u << hi) - 1;
    const uint32_t before = lo <= 0 ? 0u : lo >= 16 ? 0xFFFFu : (1u << lo) - 1;
    return (__mmask16)(below & ~before);
}

/* attend()'s arithmetic, bit for bit, for D a multiple of 16: each block of keys (then of values) widened to float32
 * once into `wide` (KEY_BLOCK + VALUE_BLOCK rows of D) for every query, each query's 16 scores of a key block from
 * one reduce_16, its weighted values accumulated over the value blocks in position order. */
static void attend_blocks(const float *const *q, const int64_t *from, const int64_t *len, float *const *out,
                          int count, const kv_t *k, const kv_t *v, int64_t D, float scale, float softcap,
                          float *score, int64_t stride, float *wide, int64_t first, int64_t longest) {
    float *keys = wide, *values = wide + KEY_BLOCK * D;
    __m512 peaks[ATTEND_QUERIES];
    for (int i = 0; i < count; i++) peaks[i] = _mm512_set1_ps(-INFINITY);
    for (int64_t p0 = first; p0 < longest; p0 += KEY_BLOCK) {
        const int64_t rows = longest - p0 < KEY_BLOCK ? longest - p0 : KEY_BLOCK;
        for (int64_t r = 0; r < KEY_BLOCK; r++)
            for (int64_t j = 0; j < D; j += 16)
                _mm512_storeu_ps(keys + r * D + j, r < rows ? _mm512_cvtph_ps(_mm256_loadu_si256(
                                     (const __m256i *)(k + (p0 + r) * D + j))) : _mm512_setzero_ps());
        for (int i = 0; i < count; i++) {
            const __mmask16 live = block_lanes(p0, from[i], len[i]);
            if (!live) continue;
            __m512 part[KEY_BLOCK];
            for (int r = 0; r < KEY_BLOCK; r++) part[r] = _mm512_setzero_ps();
            for (int64_t j = 0; j < D; j += 16) { /* dot_half's order: the 16-lane chunks in turn */
                const __m512 qj = _mm512_loadu_ps(q[i] + j);
                for (int r = 0; r < KEY_BLOCK; r++)
                    part[r] = _mm512_fmadd_ps(qj, _mm512_loadu_ps(keys + r * D + j), part[r]);
            }
            __m512 s = _mm512_mul_ps(reduce_16(part), _mm512_set1_ps(scale));
            if (softcap > 0.f) {
                float capped[16];
                _mm512_storeu_ps(capped, s);
                for (int r = 0; r < 16; r++) capped[r] = softcap * tanhf(capped[r] / softcap);
                s = _mm512_loadu_ps(capped);
            }
            _mm512_mask_storeu_ps(score + i * stride + p0, live, s);
            peaks[i] = _mm512_mask_max_ps(peaks[i], live, s, peaks[i]); /* fmaxf's: a NaN score leaves the peak */
        }
    }
    for (int i = 0; i < count; i++) { /* each weight times 1 / sum, as weigh_values multiplies them */
        float *weight = score + i * stride + from[i];
        const int64_t seen = len[i] - from[i];
        const float inv = 1.f / exponentiate(weight, seen, _mm512_reduce_max_ps(peaks[i]));
        int64_t p = 0;
        for (; p + 16 <= seen; p += 16)
            _mm512_storeu_ps(weight + p, _mm512_mul_ps(_mm512_loadu_ps(weight + p), _mm512_set1_ps(inv)));
        for (; p < seen; p++) weight[p] = weight[p] * inv;
    }
    const int64_t full = D / 64 * 64; /* columns summed 64 at a time in registers; the rest as weigh_values's tail */
    for (int64_t p0 = first; p0 < longest && full; p0 += VALUE_BLOCK) {
        const int64_t rows = longest - p0 < VALUE_BLOCK ? longest - p0 : VALUE_BLOCK;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < full; j += 16)
                _mm512_storeu_ps(values + r * full + j, _mm512_cvtph_ps(_mm256_loadu_si256(
                                     (const __m256i *)(v + (p0 + r) * D + j))));
        for (int i = 0; i < count; i++) {
            const int64_t lo = from[i] > p0 ? from[i] : p0, hi = len[i] < p0 + rows ? len[i] : p0 + rows;
            if (lo >= hi) continue;
            const float *weight = score + i * stride;
            for (int64_t j = 0; j < full; j += 64) {
                float *o = out[i] + j;
                const int opening = lo == from[i];
                __m512 a0 = opening ? _mm512_setzero_ps() : _mm512_loadu_ps(o);
                __m512 a1 = opening ? _mm512_setzero_ps() : _mm512_loadu_ps(o + 16);
                __m512 a2 = opening ? _mm512_setzero_ps() : _mm512_loadu_ps(o + 32);
                __m512 a3 = opening ? _mm512_setzero_ps() : _mm512_loadu_ps(o + 48);
                for (int64_t p = lo; p < hi; p++) {
                    const __m512 w = _mm512_set1_ps(weight[p]);
                    const float *vp = values + (p - p0) * full + j;
                    a0 = _mm512_fmadd_ps(w, _mm512_loadu_ps(vp), a0);
                    a1 = _mm512_fmadd_ps(w, _mm512_loadu_ps(vp + 16), a1);
                    a2 = _mm512_fmadd_ps(w, _mm512_loadu_ps(vp + 32), a2);
                    a3 = _mm512_fmadd_ps(w, _mm512_loadu_ps(vp + 48), a3);
                }
                _mm512_storeu_ps(o, a0);
                _mm512_storeu_ps(o + 16, a1);
                _mm512_storeu_ps(o + 32, a2);
                _mm512_storeu_ps(o + 48, a3);
            }
        }
    }
    for (int i = 0; i < count && full < D; i++) {
        const float *weight = score + i * stride;
        for (int64_t c = full; c < D; c++) out[i][c] = 0.f;
        for (int64_t p = from[i]; p < len[i]; p++)
            for (int64_t c = full; c < D; c++) out[i][c] += weight[p] * (float)v[p * D + c];
    }
}
#endif

/* `count` queries over one kv head's cache (k, v: [positions, D] in binary16): query i attends positions
 * from[i]..len[i]-1 (from[i] < len[i]), softmax(q . k * scale) . v into out[i] [D], each score soft-capped
 * (cap * tanh(score / cap)) where `softcap` > 0. Each key row is read once for all of them (the heads
 * of a group, the tokens of a prefill chunk); a query's own arithmetic runs in the same order whatever shares
 * the pass, so its result does not depend on them. `score`: count rows of `stride` (>= every len) floats of
 * scratch; `wide`: (KEY_BLOCK + VALUE_BLOCK) * D floats of scratch (attend_blocks). */
static void attend(const float *const *q, const int64_t *from, const int64_t *len, float *const *out, int count,
                   const kv_t *k, const kv_t *v, int64_t D, float scale, float softcap, float *score,
                   int64_t stride, float *wide) {
    float peak[ATTEND_QUERIES];
    int64_t longest = 0, first = INT64_MAX;
    for (int i = 0; i < count; i++) {
        peak[i] = -INFINITY;
        longest = max64(longest, len[i]);
        first = from[i] < first ? from[i] : first;
    }
#if defined(__AVX512F__)
    if (D % 16 == 0 && count > 1) { /* one query alone gains less from the widened blocks than they cost */
        attend_blocks(q, from, len, out, count, k, v, D, scale, softcap, score, stride, wide, first, longest);
        return;
    }
#else
    (void)wide;
#endif
    for (int64_t p = first; p < longest; p++)
        for (int i = 0; i < count; i++)
            if (p >= from[i] && p < len[i]) {
                float s = dot_half(q[i], k + p * D, D) * scale;
                if (softcap > 0.f) s = softcap * tanhf(s / softcap);
                score[i * stride + p] = s;
                peak[i] = fmaxf(peak[i], s);
            }
    for (int i = 0; i < count; i++) {
        float *weight = score + i * stride + from[i];
        const int64_t seen = len[i] - from[i];
        weigh_values(weight, 1.f / exponentiate(weight, seen, peak[i]), v + from[i] * D, seen, D, out[i]);
    }
}

typedef struct {
    const model_weights *m;
    int64_t n, n_out, longest;
    const int32_t *slots, *positions, *out_rows;
    float *hidden, *logits, *out_hidden;
    kv_t *const *keys, *const *values;
    const int64_t *capacity;
    float *normed, *qkv, *attended, *gate_up, *branch, *act_scale, *act_sum, *scores, *wide;
    int8_t *codes;
    int64_t own_floats, own_codes, own_groups; /* each thread's share of the scratch above where `own` */
    int own; /* each thread prepares every token's inputs itself (below) */
    int64_t *block_start, blocks, job_heads; /* attention's jobs (sluice_native_forward) */
    barrier_t barrier;
    atomic_int go; /* set once the team's size is known */
    int count;
} call_t;

/* v = w * (v / rms(v)) over one head: Qwen3's per-head q/k norm, in float32 as the torch path computes it */
static void head_norm(float *v, int64_t D, const float *w, float eps) {
    float sum = 0.f;
    for (int64_t j = 0; j < D; j++) sum += v[j] * v[j];
    const float r = 1.f / sqrtf(sum / (float)D + eps);
    for (int64_t j = 0; j < D; j++) v[j] = w[j] * (v[j] * r);
}

/* hidden[i] += w * (branch[i] / rms(branch[i])) for each token (rows split between threads): Gemma's norm of a
 * sublayer's output before the residual add */
static void norm_add(const team_t *team, float *hidden, const float *branch, int64_t n, int64_t width,
                     const float *weight, float eps) {
    int64_t first, last;
    share(team, n, &first, &last);
    for (int64_t i = first; i < last; i++) {
        const float *b = branch + i * width;
        float *h = hidden + i * width;
        double squares = 0.;
        for (int64_t j = 0; j < width; j++) squares += (double)b[j] * b[j];
        float inv = 1.f / sqrtf((float)(squares / width) + eps);
        for (int64_t j = 0; j < width; j++) h[j] += weight[j] * (b[j] * inv);
    }
    sync_team(team);
}

/* a projection's output added to the residual stream: directly, or normed first where the layer says so */
static void project_residual(const team_t *team, const qmat *w, const qact *x, int64_t n, float *hidden,
                             int64_t width, const float *out_norm, float eps, float *branch) {
    if (!out_norm) {
        project(team, w, x, n, hidden, width, 1, NULL);
        return;
    }
    project(team, w, x, n, branch, width, 0, NULL);
    norm_add(team, hidden, branch, n, width, out_norm, eps);
}

#if defined(__AVX512F__)
/* glibc's expf (2.27 on, sysdeps/ieee754/flt-32/e_expf.c as its x86-64 FMA build computes it: 2^(k/32) from a
 * table times a cubic in r, in double) for 16 values at once, bit for bit: the SiLU of every MLP called the scalar
 * expf once per value. Lanes where glibc takes its special path (|x| >= 88, infinities, NaN) call expf itself. */
static const uint64_t expf_table[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,
    0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,
    0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
    0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da, 0x3fefd0765b6e4540};

static inline __m512d expf_half(__m256 x) {
    const __m512d xd = _mm512_cvtps_pd(x), inv_ln2 = _mm512_set1_pd(0x1.71547652b82fep+0 * 32);
    const __m512d shift = _mm512_set1_pd(0x1.8p+52);
    __m512d kd = _mm512_fmadd_pd(inv_ln2, xd, shift); /* round(x * 32 / ln 2), in the low bits */
    const __m512i ki = _mm512_castpd_si512(kd);
    kd = _mm512_sub_pd(kd, shift);
    const __m512d r = _mm512_fmsub_pd(inv_ln2, xd, kd);
    const __m512i index = _mm512_and_si512(ki, _mm512_set1_epi64(31));
    const __m512i low = _mm512_permutex2var_epi64(_mm512_loadu_si512(expf_table), index,
                                                  _mm512_loadu_si512(expf_table + 8));
    const __m512i high = _mm512_permutex2var_epi64(_mm512_loadu_si512(expf_table + 16), index,
                                                   _mm512_loadu_si512(expf_table + 24));
    const __mmask8 upper = _mm512_test_epi64_mask(index, _mm512_set1_epi64(16));
    const __m512d s = _mm512_castsi512_pd(_mm512_add_epi64(_mm512_mask_blend_epi64(upper, low, high),
                                                           _mm512_slli_epi64(ki, 47)));
    const __m512d z = _mm512_fmadd_pd(r, _mm512_set1_pd(0x1.c6af84b912394p-5 / 32 / 32 / 32),
                                      _mm512_set1_pd(0x1.ebfce50fac4f3p-3 / 32 / 32));
    const __m512d y = _mm512_fmadd_pd(r, _mm512_set1_pd(0x1.62e42ff0c52d6p-1 / 32), _mm512_set1_pd(1.0));
    return _mm512_mul_pd(_mm512_fmadd_pd(z, _mm512_mul_pd(r, r), y), s);
}

static inline __m512 expf16(__m512 x) {
    const __m512 e = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(expf_half(_mm512_castps512_ps256(x)))),
                                        _mm512_cvtpd_ps(expf_half(_mm512_extractf32x8_ps(x, 1))), 1);
    const __m512i top = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(x), 20), _mm512_set1_epi32(0x7ff));
    const __mmask16 special = _mm512_cmpge_epu32_mask(top, _mm512_set1_epi32(0x42b)); /* top12(88.0f) */
    if (!special) return e;
    float in[16], out[16];
    _mm512_storeu_ps(in, x);
    _mm512_storeu_ps(out, e);
    for (int j = 0; j < 16; j++)
        if (special >> j & 1) out[j] = expf(in[j]);
    return _mm512_loadu_ps(out);
}
#endif

/* o = SiLU(gate) * up, gate / (1 + e^-gate) * up, for n values */
static void silu_gate(const float *gate, const float *up, float *o, int64_t n) {
    int64_t j = 0;
#if defined(__AVX512F__)
    for (; j + 16 <= n; j += 16) {
        const __m512 g = _mm512_loadu_ps(gate + j);
        const __m512 e = expf16(_mm512_sub_ps(_mm512_setzero_ps(), g));
        _mm512_storeu_ps(o + j, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e)),
                                              _mm512_loadu_ps(up + j)));
    }
#endif
    for (; j < n; j++) o[j] = gate[j] / (1.f + expf(-gate[j])) * up[j];
}

/* o = GELU(gate) * up, GELU's tanh approximation (torch's gelu(approximate="tanh"), Gemma's
 * gelu_pytorch_tanh) as x / (1 + e^(-2u)), u = sqrt(2 / pi) (x + 0.044715 x^3): 0.5 (1 + tanh u) is the
 * logistic of 2u. Vectorized: the scalar tanhf per value took a third of a 16-row decode step of Gemma 3. */
static void gelu_gate(const float *gate, const float *up, float *o, int64_t n) {
    const float k = -2.f * 0.7978845608028654f;
    int64_t j = 0;
#if defined(__AVX512F__)
    for (; j + 16 <= n; j += 16) {
        const __m512 x = _mm512_loadu_ps(gate + j);
        const __m512 cube = _mm512_mul_ps(_mm512_mul_ps(x, x), _mm512_mul_ps(x, _mm512_set1_ps(0.044715f)));
        const __m512 e = expf16(_mm512_mul_ps(_mm512_set1_ps(k), _mm512_add_ps(x, cube)));
        _mm512_storeu_ps(o + j, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.f), e)),
                                              _mm512_loadu_ps(up + j)));
    }
#endif
    for (; j < n; j++) {
        const float x = gate[j];
        o[j] = x / (1.f + expf(k * (x + x * x * (x * 0.044715f)))) * up[j];
    }
}

static void forward_part(call_t *c, int me) {
    const model_weights *m = c->m;
    const int64_t H = m->hidden, D = m->head_dim, heads = m->heads, kvh = m->kv_heads, I = m->inter, n = c->n;
    const int64_t qkv_width = (heads + 2 * kvh) * D;
    const int32_t *slots = c->slots, *positions = c->positions;
    float *hidden = c->hidden, *normed = c->normed, *qkv = c->qkv, *attended = c->attended, *gate_up = c->gate_up;
    team_t team_v = {me, c->count, &c->barrier}, *team = &team_v;
    /* Who prepares the projections' inputs (norms, quantizing, SiLU): for a few tokens each thread does all of
     * them into its own scratch, which saves the barrier after each (4 of a layer's 10), and a token's inputs
     * are the same bits whoever computes them; for many the team splits the tokens. */
    team_t solo = {0, 1, &c->barrier};
    const team_t *prep = c->own ? &solo : team;
    const int64_t mine = c->own ? me : 0;
    normed += mine * c->own_floats;
    int8_t *codes = c->codes + mine * c->own_codes;
    float *act_scale = c->act_scale + mine * c->own_groups, *act_sum = c->act_sum + mine * c->own_groups;
    float *score = c->scores + me * ATTEND_QUERIES * c->longest;
    float *wide = c->wide + me * (KEY_BLOCK + VALUE_BLOCK) * D;
    qact x_h = {codes, act_scale, act_sum, H};
    int64_t first, last;
    for (int64_t l = 0; l < m->layers; l++) {
        const layer_weights *w = &m->layer[l];
        kv_t *K = c->keys[l], *V = c->values[l];
        int64_t cap = c->capacity[l];
        norm_quantize(prep, hidden, n, H, w->input_norm, m->eps, normed, &x_h, NULL);
        project(team, &w->qkv, &x_h, n, qkv, qkv_width, 0, w->qkv_bias);
        /* rotate q and k (x * cos + roll(x, D/2) * signed sin), write k and v into the cache */
        share(team, n, &first, &last);
        const float *table_cos = w->rope_cos ? w->rope_cos : m->rope_cos;
        const float *table_sin = w->rope_sin ? w->rope_sin : m->rope_sin;
        for (int64_t i = first; i < last; i++) {
            const float *cs = table_cos + (int64_t)positions[i] * D, *sn = table_sin + (int64_t)positions[i] * D;
            float *row = qkv + i * qkv_width;
            float turned[1024];
            for (int64_t h = 0; h < heads + kvh; h++) {
                float *v = row + h * D;
                const float *qk_norm = h < heads ? w->q_norm : w->k_norm;
                if (qk_norm) head_norm(v, D, qk_norm, m->eps);
                if (D % 2 == 0) { /* the same sums in two halves, with no modulo: the compiler vectorizes them */
                    for (int64_t j = 0; j < D / 2; j++) turned[j] = v[j] * cs[j] + v[j + D / 2] * sn[j];
                    for (int64_t j = D / 2; j < D; j++) turned[j] = v[j] * cs[j] + v[j - D / 2] * sn[j];
                } else {
                    for (int64_t j = 0; j < D; j++) turned[j] = v[j] * cs[j] + v[(j + D / 2) % D] * sn[j];
                }
                memcpy(v, turned, sizeof(float) * D);
            }
            for (int64_t g = 0; g < kvh; g++) {
                int64_t at = (((int64_t)slots[i] * kvh + g) * cap + positions[i]) * D;
                to_half(row + (heads + g) * D, K + at, D);
                to_half(row + (heads + kvh + g) * D, V + at, D);
            }
        }
        sync_team(team);
        /* attention: a job is a block of one slot's tokens x (some of) the heads of one kv head, over that slot's
         * positions 0..position of each token, the cache read once for all of them; jobs dealt round-robin */
        const int64_t group = heads / kvh, chunks = (group + c->job_heads - 1) / c->job_heads;
        for (int64_t job = me; job < c->blocks * kvh * chunks; job += c->count) {
            const int64_t b = job / (kvh * chunks), g = job / chunks % kvh, h0 = g * group + job % chunks * c->job_heads;
            const int64_t h1 = h0 + c->job_heads < (g + 1) * group ? h0 + c->job_heads : (g + 1) * group;
            const float *q[ATTEND_QUERIES];
            float *out[ATTEND_QUERIES];
            int64_t from[ATTEND_QUERIES], len[ATTEND_QUERIES];
            int count = 0;
            for (int64_t i = c->block_start[b]; i < c->block_start[b + 1]; i++)
                for (int64_t h = h0; h < h1; h++, count++) {
                    q[count] = qkv + i * qkv_width + h * D;
                    out[count] = attended + i * heads * D + h * D;
                    len[count] = positions[i] + 1;
                    /* a window keeps positions p > position - window (transformers' sliding_window_overlay) */
                    from[count] = w->window > 0 && len[count] > w->window ? len[count] - w->window : 0;
                }
            const int64_t at = ((int64_t)slots[c->block_start[b]] * kvh + g) * cap * D;
            attend(q, from, len, out, count, K + at, V + at, D, m->attn_scale, m->attn_softcap, score, c->longest,
                   wide);
        }
        sync_team(team);
        qact x_o = {codes, act_scale, act_sum, heads * D};
        share(prep, n, &first, &last);
        for (int64_t i = first; i < last; i++)
            quantize_token(attended + i * heads * D, &x_o, i);
        sync_team(prep);
        project_residual(team, &w->o, &x_o, n, hidden, H, w->attn_out_norm, m->eps, c->branch);
        norm_quantize(prep, hidden, n, H, w->post_norm, m->eps, normed, &x_h, NULL);
        project(team, &w->gate_up, &x_h, n, gate_up, 2 * I, 0, NULL);
        qact x_i = {codes, act_scale, act_sum, I};
        share(prep, n, &first, &last);
        for (int64_t i = first; i < last; i++) { /* SiLU(gate) * up or GELU(gate) * up, quantized for down */
            float *gu = gate_up + i * 2 * I, *o = normed + i * I;
            if (m->act == 1)
                gelu_gate(gu, gu + I, o, I);
            else
                silu_gate(gu, gu + I, o, I);
            quantize_token(o, &x_i, i);
        }
        sync_team(prep);
        project_residual(team, &w->down, &x_i, n, hidden, H, w->mlp_out_norm, m->eps, c->branch);
    }
    norm_quantize(prep, hidden, c->n_out, H, m->final_norm, m->eps, normed, &x_h, c->out_rows);
    if (c->out_hidden && me == 0) memcpy(c->out_hidden, normed, sizeof(float) * c->n_out * H);
    if (c->logits) project(team, &m->head, &x_h, c->n_out, c->logits, m->head.rows, 0, NULL);
}

typedef struct {
    call_t *call;
    int id;
} part_t;

static void *run_part(void *arg) {
    part_t *part = arg;
    while (!atomic_load_explicit(&part->call->go, memory_order_acquire)) sched_yield();
    forward_part(part->call, part->id);
    return NULL;
}

#define MAX_THREADS 64
#define OWN_TOKENS 16 /* calls of up to this many tokens prepare inputs in every thread (forward_part) */

#define BAD_INDEX -2

/* The last guard against a caller that skipped model.py's checks (native/bounds.py): every index the forward
 * writes or reads through, against the cache's `slot_count` slots and each layer's capacity. Nothing is
 * touched before it passes, so a bad call changes no other request's keys and values. */
static int indices_ok(const model_weights *m, int64_t n, const int32_t *slots, const int32_t *positions,
                      const int64_t *capacity, int64_t slot_count, int64_t n_out, const int32_t *out_rows) {
    if (n < 1 || n_out < 0 || n_out > n || slot_count < 1 || m->layers < 1) return 0;
    int64_t room = m->max_positions; /* the rotary table's rows */
    for (int64_t l = 0; l < m->layers; l++) room = capacity[l] < room ? capacity[l] : room;
    for (int64_t i = 0; i < n; i++)
        if (slots[i] < 0 || slots[i] >= slot_count || positions[i] < 0 || positions[i] >= room) return 0;
    for (int64_t i = 0; i < n_out; i++)
        if (out_rows[i] < 0 || out_rows[i] >= n) return 0;
    return 1;
}

/* Returns 0, -1 when scratch memory could not be allocated, or BAD_INDEX (nothing done) when a slot, position
 * or output row is out of range. `slot_count`: the slots every layer's cache holds. */
int sluice_native_forward(const model_weights *m, int64_t n, const int32_t *slots, const int32_t *positions,
                          float *hidden, kv_t *const *keys, kv_t *const *values, const int64_t *capacity,
                          int64_t slot_count, int64_t n_out, const int32_t *out_rows, float *logits,
                          float *out_hidden, int threads) {
    if (!indices_ok(m, n, slots, positions, capacity, slot_count, n_out, out_rows)) return BAD_INDEX;
    const int64_t H = m->hidden, D = m->head_dim, heads = m->heads, kvh = m->kv_heads, I = m->inter;
    const int64_t widest = max64(max64(H, I), heads * D);
    call_t c = {.m = m, .n = n, .n_out = n_out, .slots = slots, .positions = positions, .out_rows = out_rows,
                .hidden = hidden, .logits = logits, .out_hidden = out_hidden, .keys = keys, .values = values,
                .capacity = capacity};
    for (int64_t i = 0; i < n; i++) c.longest = max64(c.longest, positions[i] + 1);
    c.count = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    const int64_t tiled = (n + TOKEN_TILE - 1) / TOKEN_TILE * TOKEN_TILE; /* tokens, whole activation tiles */
    c.own = n <= OWN_TOKENS;
    const int64_t copies = c.own ? c.count : 1;
    c.own_floats = n * widest, c.own_codes = tiled * widest, c.own_groups = tiled * (widest / GROUP);
    c.normed = malloc(sizeof(float) * copies * c.own_floats);
    c.qkv = malloc(sizeof(float) * n * (heads + 2 * kvh) * D);
    c.attended = malloc(sizeof(float) * n * heads * D);
    c.gate_up = malloc(sizeof(float) * n * 2 * I);
    c.branch = malloc(sizeof(float) * n * H);
    c.codes = malloc(copies * c.own_codes);
    c.act_scale = malloc(sizeof(float) * copies * c.own_groups);
    c.act_sum = malloc(sizeof(float) * copies * c.own_groups);
    c.scores = malloc(sizeof(float) * c.count * ATTEND_QUERIES * c.longest);
    c.wide = malloc(sizeof(float) * c.count * (KEY_BLOCK + VALUE_BLOCK) * D);
    /* attention blocks: runs of one slot's consecutive tokens, as many as fill ATTEND_QUERIES with the heads
     * of a job (all of a kv head's, up to ATTEND_QUERIES) */
    c.job_heads = heads / kvh < ATTEND_QUERIES ? heads / kvh : ATTEND_QUERIES;
    const int64_t block_tokens = ATTEND_QUERIES / c.job_heads;
    c.block_start = malloc(sizeof(int64_t) * (n + 1));
    if (c.block_start) {
        for (int64_t i = 0; i < n; i++)
            if (i == 0 || slots[i] != slots[i - 1] || i - c.block_start[c.blocks - 1] == block_tokens)
                c.block_start[c.blocks++] = i;
        c.block_start[c.blocks] = n;
    }
    atomic_init(&c.barrier.arrived, 0);
    atomic_init(&c.barrier.generation, 0);
    atomic_init(&c.go, 0);
    int failed = !c.normed || !c.qkv || !c.attended || !c.gate_up || !c.branch || !c.codes || !c.act_scale || !c.act_sum
                 || !c.scores || !c.wide || !c.block_start;
    if (!failed) {
        pthread_t helpers[MAX_THREADS];
        part_t parts[MAX_THREADS];
        int started = 1;
        for (; started < c.count; started++) {
            parts[started] = (part_t){&c, started};
            if (pthread_create(&helpers[started], NULL, run_part, &parts[started]) != 0) break;
        }
        c.count = started; /* a thread that could not start: the others share its work */
        atomic_store_explicit(&c.go, 1, memory_order_release);
        forward_part(&c, 0);
        for (int i = 1; i < started; i++) pthread_join(helpers[i], NULL);
    }
    free(c.normed); free(c.qkv); free(c.attended); free(c.gate_up); free(c.branch); free(c.codes); free(c.act_scale); free(c.act_sum);
    free(c.scores); free(c.wide); free(c.block_start);
    return failed ? -1 : 0;
}
