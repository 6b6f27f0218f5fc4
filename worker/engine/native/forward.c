/* The whole forward of a Llama-family decoder for N tokens, each at its own (slot, position).
 *
 * Projections hold groups of 32 weights as unsigned codes u with a per-group float scale d and
 * minimum m (w = d * u + m): 4-bit codes packed two to a byte, or 8-bit codes. Each projection's
 * input is quantized per 32-block to int8 (x = a * q), so a group's product is
 *     d * a * sum(u * q) + m * a * sum(q)
 * whose integer part runs on AVX512-VNNI (vpdpbusd: unsigned x signed bytes into int32) where the
 * compiler targets it, else on plain C that the compiler vectorizes.
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
#define ROW_BLOCK 8 /* output rows per scheduling unit */

typedef struct {
    const uint8_t *codes; /* bits 4: [rows, cols / 2] (layout: pair_codes); bits 8: [rows, cols] */
    const float *scale;   /* [rows, cols / 32] */
    const float *min;     /* [rows, cols / 32] */
    int64_t bits, rows, cols;
} qmat;

typedef struct {
    qmat qkv, o, gate_up, down;
    const float *qkv_bias; /* NULL: none */
    const float *input_norm, *post_norm;
} layer_weights;

typedef struct {
    int64_t layers, hidden, heads, kv_heads, head_dim, inter, max_positions;
    float eps, attn_scale;
    const float *rope_cos, *rope_sin; /* [max_positions, head_dim]; sin with rotate_half's sign folded in */
    const float *final_norm;
    qmat head;
    const layer_weights *layer;
} model_weights;

/* int8 activations of one matrix input: codes, and per group its scale and scale * sum(codes); `wide`: the
 * scales of each two groups as 16 lanes (8 of each), as the VNNI loop multiplies them */
typedef struct {
    int8_t *q;
    float *scale, *sum, *wide;
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

static void quantize_row(const float *x, int64_t cols, int8_t *q, float *scale, float *sum, float *wide) {
    for (int64_t g = 0; g < cols / GROUP; g++) {
        const float *v = x + g * GROUP;
        float peak = 0.f;
        for (int i = 0; i < GROUP; i++) peak = fmaxf(peak, fabsf(v[i]));
        float a = peak / 127.f, inv = peak > 0.f ? 127.f / peak : 0.f;
        int total = 0;
        for (int i = 0; i < GROUP; i++) {
            int c = (int)lrintf(v[i] * inv);
            q[g * GROUP + i] = (int8_t)c;
            total += c;
        }
        scale[g] = a;
        sum[g] = a * (float)total;
        for (int i = 0; i < 8; i++) wide[g * 8 + i] = a;
    }
}

/* token i's row of `in` (x->cols wide) quantized into x */
static void quantize_token(const float *in, const qact *x, int64_t i) {
    int64_t groups = x->cols / GROUP;
    quantize_row(in, x->cols, x->q + i * x->cols, x->scale + i * groups, x->sum + i * groups, x->wide + i * groups * 8);
}

#define TOKEN_TILE 4 /* tokens that share one decoding of a weight row's codes */

/* Codes of two groups (64 inputs) as 64 bytes at input `at` of a row: 4-bit rows hold them in 32 bytes,
 * byte j = code j | code j + 32 << 4 (a row's odd last group: 16 bytes, byte j = code j | code j + 16 << 4). */
#if SLUICE_VNNI
static inline __m512i pair_codes(const qmat *w, const uint8_t *row, int64_t at) {
    if (w->bits == 8) return _mm512_loadu_si512((const void *)(row + at));
    __m256i packed = _mm256_loadu_si256((const __m256i *)(row + at / 2));
    __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(packed), _mm256_srli_epi16(packed, 4), 1);
    return _mm512_and_si512(both, _mm512_set1_epi8(15));
}

static inline __m256i last_codes(const qmat *w, const uint8_t *row, int64_t at) {
    if (w->bits == 8) return _mm256_loadu_si256((const __m256i *)(row + at));
    __m128i packed = _mm_loadu_si128((const __m128i *)(row + at / 2));
    __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(packed), _mm_srli_epi16(packed, 4), 1);
    return _mm256_and_si256(both, _mm256_set1_epi8(15));
}

static inline int32_t sum8_epi32(__m256i p) {
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
    return _mm_cvtsi128_si32(h);
}
#else
static inline int code_at(const qmat *w, const uint8_t *row, int64_t i) {
    if (w->bits == 8) return row[i];
    int64_t groups = w->cols / GROUP, g = i / GROUP;
    if ((groups & 1) && g == groups - 1) { /* the odd last group */
        int64_t j = i - g * GROUP;
        uint8_t b = row[g * 16 + (j & 15)];
        return j < 16 ? b & 15 : b >> 4;
    }
    int64_t base = (i / 64) * 64, j = i - base;
    uint8_t b = row[base / 2 + (j & 31)];
    return j < 32 ? b & 15 : b >> 4;
}
#endif

/* out[t] = sum over groups of d_g * a_tg * sum(u * q_t) + m_g * a_tg * sum(q_t), for row r and `count` (<= TOKEN_TILE) tokens */
static void dot_tile(const qmat *w, int64_t r, const qact *x, int64_t first, int count, float *out) {
    const int64_t groups = w->cols / GROUP;
    const uint8_t *row = w->codes + r * (w->bits == 8 ? w->cols : w->cols / 2);
    const float *d = w->scale + r * groups;
#if SLUICE_VNNI
    __m512 acc[TOKEN_TILE];
    for (int t = 0; t < count; t++) acc[t] = _mm512_setzero_ps();
    int64_t g = 0;
    for (; g + 1 < groups; g += 2) {
        __m512i u = pair_codes(w, row, g * GROUP);
        __m512 dv = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(d[g]), _mm512_set1_ps(d[g + 1]));
        for (int t = 0; t < count; t++) {
            const int8_t *q = x->q + (first + t) * x->cols + g * GROUP;
            __m512 av = _mm512_loadu_ps(x->wide + ((first + t) * groups + g) * 8);
            __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, _mm512_loadu_si512((const void *)q));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dv, av), acc[t]);
        }
    }
    /* the minimum's part, sum_g m_g * a_g * sum(q), 16 groups a vector: a scalar loop here was a chain of
     * dependent adds per row and token, most of a 16-row step */
    const float *m = w->min + r * groups;
    for (int64_t g0 = 0; g0 < groups; g0 += 16) {
        __mmask16 lanes = groups - g0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (groups - g0)) - 1);
        __m512 mv = _mm512_maskz_loadu_ps(lanes, m + g0);
        for (int t = 0; t < count; t++)
            acc[t] = _mm512_fmadd_ps(mv, _mm512_maskz_loadu_ps(lanes, x->sum + (first + t) * groups + g0), acc[t]);
    }
    for (int t = 0; t < count; t++) out[t] = _mm512_reduce_add_ps(acc[t]);
    if (g < groups) {
        __m256i u = last_codes(w, row, g * GROUP);
        for (int t = 0; t < count; t++) {
            const int8_t *q = x->q + (first + t) * x->cols + g * GROUP;
            __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, _mm256_loadu_si256((const __m256i *)q));
            out[t] += d[g] * x->scale[(first + t) * groups + g] * (float)sum8_epi32(p);
        }
    }
#else
    uint8_t u[GROUP];
    for (int t = 0; t < count; t++) out[t] = 0.f;
    for (int64_t g = 0; g < groups; g++) {
        for (int i = 0; i < GROUP; i++) u[i] = (uint8_t)code_at(w, row, g * GROUP + i);
        for (int t = 0; t < count; t++) {
            const int8_t *q = x->q + (first + t) * x->cols + g * GROUP;
            int32_t s = 0;
            for (int i = 0; i < GROUP; i++) s += (int32_t)u[i] * (int32_t)q[i];
            out[t] += d[g] * x->scale[(first + t) * groups + g] * (float)s;
        }
    }
    const float *m = w->min + r * groups;
    for (int t = 0; t < count; t++)
        for (int64_t g = 0; g < groups; g++) out[t] += m[g] * x->sum[(first + t) * groups + g];
#endif
}

/* out[t, r] (= or +=) row r of w . token t's input, for every token; the rows split between threads, so
 * each weight row is read once for all tokens. */
static void project(const team_t *team, const qmat *w, const qact *x, int64_t n, float *out, int64_t out_stride,
                    int accumulate, const float *bias) {
    int64_t blocks = (w->rows + ROW_BLOCK - 1) / ROW_BLOCK, first, last;
    share(team, blocks, &first, &last);
    for (int64_t block = first; block < last; block++) {
        int64_t end = (block + 1) * ROW_BLOCK < w->rows ? (block + 1) * ROW_BLOCK : w->rows;
        for (int64_t r = block * ROW_BLOCK; r < end; r++) {
            for (int64_t t0 = 0; t0 < n; t0 += TOKEN_TILE) {
                int count = n - t0 < TOKEN_TILE ? (int)(n - t0) : TOKEN_TILE;
                float v[TOKEN_TILE];
                dot_tile(w, r, x, t0, count, v);
                for (int t = 0; t < count; t++) {
                    float value = v[t] + (bias ? bias[r] : 0.f);
                    float *o = out + (t0 + t) * out_stride + r;
                    *o = accumulate ? *o + value : value;
                }
            }
        }
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

/* One query head over positions 0..len-1 of its kv head (k, v: [len, D] in binary16): softmax(q . k * scale) . v
 * into out [D]; `score`: len floats of scratch. */
static void attend(const float *q, const kv_t *k, const kv_t *v, int64_t len, int64_t D, float scale, float *score,
                   float *out) {
    float peak = -INFINITY;
    for (int64_t p = 0; p < len; p++) {
        const kv_t *kp = k + p * D;
        float s = 0.f;
        int64_t j = 0;
#if defined(__AVX512F__)
        __m512 acc = _mm512_setzero_ps();
        for (; j + 16 <= D; j += 16)
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + j), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kp + j))), acc);
        s = _mm512_reduce_add_ps(acc);
#endif
        for (; j < D; j++) s += q[j] * (float)kp[j];
        score[p] = s * scale;
        peak = fmaxf(peak, score[p]);
    }
    float total = 0.f;
    for (int64_t p = 0; p < len; p++) total += (score[p] = expf(score[p] - peak));
    for (int64_t j = 0; j < D; j++) out[j] = 0.f;
    for (int64_t p = 0; p < len; p++) {
        const kv_t *vp = v + p * D;
        float weight = score[p] / total;
        int64_t j = 0;
#if defined(__AVX512F__)
        __m512 w = _mm512_set1_ps(weight);
        for (; j + 16 <= D; j += 16)
            _mm512_storeu_ps(out + j, _mm512_fmadd_ps(w, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(vp + j))),
                                                      _mm512_loadu_ps(out + j)));
#endif
        for (; j < D; j++) out[j] += weight * (float)vp[j];
    }
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

typedef struct {
    const model_weights *m;
    int64_t n, n_out, longest;
    const int32_t *slots, *positions, *out_rows;
    float *hidden, *logits, *out_hidden;
    kv_t *const *keys, *const *values;
    const int64_t *capacity;
    float *normed, *qkv, *attended, *gate_up, *act_scale, *act_sum, *act_wide, *scores;
    int8_t *codes;
    barrier_t barrier;
    atomic_int go; /* set once the team's size is known */
    int count;
} call_t;

static void forward_part(call_t *c, int me) {
    const model_weights *m = c->m;
    const int64_t H = m->hidden, D = m->head_dim, heads = m->heads, kvh = m->kv_heads, I = m->inter, n = c->n;
    const int64_t qkv_width = (heads + 2 * kvh) * D;
    const int32_t *slots = c->slots, *positions = c->positions;
    float *hidden = c->hidden, *normed = c->normed, *qkv = c->qkv, *attended = c->attended, *gate_up = c->gate_up;
    team_t team_v = {me, c->count, &c->barrier}, *team = &team_v;
    float *score = c->scores + me * c->longest;
    qact x_h = {c->codes, c->act_scale, c->act_sum, c->act_wide, H};
    int64_t first, last;
    for (int64_t l = 0; l < m->layers; l++) {
        const layer_weights *w = &m->layer[l];
        kv_t *K = c->keys[l], *V = c->values[l];
        int64_t cap = c->capacity[l];
        norm_quantize(team, hidden, n, H, w->input_norm, m->eps, normed, &x_h, NULL);
        project(team, &w->qkv, &x_h, n, qkv, qkv_width, 0, w->qkv_bias);
        /* rotate q and k (x * cos + roll(x, D/2) * signed sin), write k and v into the cache */
        share(team, n, &first, &last);
        for (int64_t i = first; i < last; i++) {
            const float *cs = m->rope_cos + (int64_t)positions[i] * D, *sn = m->rope_sin + (int64_t)positions[i] * D;
            float *row = qkv + i * qkv_width;
            float turned[1024];
            for (int64_t h = 0; h < heads + kvh; h++) {
                float *v = row + h * D;
                for (int64_t j = 0; j < D; j++) turned[j] = v[j] * cs[j] + v[(j + D / 2) % D] * sn[j];
                memcpy(v, turned, sizeof(float) * D);
            }
            for (int64_t g = 0; g < kvh; g++) {
                int64_t at = (((int64_t)slots[i] * kvh + g) * cap + positions[i]) * D;
                to_half(row + (heads + g) * D, K + at, D);
                to_half(row + (heads + kvh + g) * D, V + at, D);
            }
        }
        sync_team(team);
        /* attention of each (token, head) over its slot's positions 0..position; jobs dealt round-robin */
        for (int64_t job = me; job < n * heads; job += c->count) {
            int64_t i = job / heads, h = job % heads, g = h / (heads / kvh);
            attend(qkv + i * qkv_width + h * D, K + ((int64_t)slots[i] * kvh + g) * cap * D,
                   V + ((int64_t)slots[i] * kvh + g) * cap * D, positions[i] + 1, D, m->attn_scale, score,
                   attended + i * heads * D + h * D);
        }
        sync_team(team);
        qact x_o = {c->codes, c->act_scale, c->act_sum, c->act_wide, heads * D};
        share(team, n, &first, &last);
        for (int64_t i = first; i < last; i++)
            quantize_token(attended + i * heads * D, &x_o, i);
        sync_team(team);
        project(team, &w->o, &x_o, n, hidden, H, 1, NULL);
        norm_quantize(team, hidden, n, H, w->post_norm, m->eps, normed, &x_h, NULL);
        project(team, &w->gate_up, &x_h, n, gate_up, 2 * I, 0, NULL);
        qact x_i = {c->codes, c->act_scale, c->act_sum, c->act_wide, I};
        share(team, n, &first, &last);
        for (int64_t i = first; i < last; i++) { /* SiLU(gate) * up, quantized for the down projection */
            float *gu = gate_up + i * 2 * I, *o = normed + i * I;
            for (int64_t j = 0; j < I; j++) o[j] = gu[j] / (1.f + expf(-gu[j])) * gu[I + j];
            quantize_token(o, &x_i, i);
        }
        sync_team(team);
        project(team, &w->down, &x_i, n, hidden, H, 1, NULL);
    }
    norm_quantize(team, hidden, c->n_out, H, m->final_norm, m->eps, normed, &x_h, c->out_rows);
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

/* Returns 0, or -1 when scratch memory could not be allocated. */
int sluice_native_forward(const model_weights *m, int64_t n, const int32_t *slots, const int32_t *positions,
                          float *hidden, kv_t *const *keys, kv_t *const *values, const int64_t *capacity,
                          int64_t n_out, const int32_t *out_rows, float *logits, float *out_hidden, int threads) {
    const int64_t H = m->hidden, D = m->head_dim, heads = m->heads, kvh = m->kv_heads, I = m->inter;
    const int64_t widest = max64(max64(H, I), heads * D);
    call_t c = {.m = m, .n = n, .n_out = n_out, .slots = slots, .positions = positions, .out_rows = out_rows,
                .hidden = hidden, .logits = logits, .out_hidden = out_hidden, .keys = keys, .values = values,
                .capacity = capacity};
    for (int64_t i = 0; i < n; i++) c.longest = max64(c.longest, positions[i] + 1);
    c.count = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    c.normed = malloc(sizeof(float) * n * widest);
    c.qkv = malloc(sizeof(float) * n * (heads + 2 * kvh) * D);
    c.attended = malloc(sizeof(float) * n * heads * D);
    c.gate_up = malloc(sizeof(float) * n * 2 * I);
    c.codes = malloc(n * widest);
    c.act_scale = malloc(sizeof(float) * n * (widest / GROUP));
    c.act_sum = malloc(sizeof(float) * n * (widest / GROUP));
    c.act_wide = malloc(sizeof(float) * n * (widest / GROUP) * 8);
    c.scores = malloc(sizeof(float) * c.count * c.longest);
    atomic_init(&c.barrier.arrived, 0);
    atomic_init(&c.barrier.generation, 0);
    atomic_init(&c.go, 0);
    int failed = !c.normed || !c.qkv || !c.attended || !c.gate_up || !c.codes || !c.act_scale || !c.act_sum || !c.act_wide || !c.scores;
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
    free(c.normed); free(c.qkv); free(c.attended); free(c.gate_up); free(c.codes); free(c.act_scale); free(c.act_sum); free(c.act_wide);
    free(c.scores);
    return failed ? -1 : 0;
}
