/* forward.c under AddressSanitizer and UndefinedBehaviorSanitizer (tests/worker/engine/test_native_sanitized.py).
 *
 * A small random model built here in C (every buffer its exact size from malloc, so a read or write one element
 * past any of them is reported): ragged tiles (a vocabulary of 40 rows), 4-bit layers and an 8-bit head, a
 * q/k/v bias on one layer, layers of different capacity, grouped kv heads; the second layer with Gemma 3's parts
 * (q/k norms, output norms, its own rotary table, a window shorter than most calls' context), GeGLU and Gemma 2's
 * soft-capped scores. Calls of every shape the engine makes (decode rows, prefill chunks below and above the token
 * tile and the own-scratch limit, a mixed step, no logits) must return 0 with finite outputs; calls with an index out of range must return BAD_INDEX and
 * leave every cache byte as it was. Prints "ok N" (N calls) and exits 0, else says which call failed.
 */
#include "forward.c"

#include <stdio.h>

enum { LAYERS = 2, HIDDEN = 64, HEADS = 4, KVH = 2, HEAD_DIM = 16, INTER = 96, VOCAB = 40, MAXPOS = 96, SLOTS = 3,
       WINDOW = 5 };
static const int64_t CAPACITY[LAYERS] = {48, 64};

static uint32_t seed = 12345u;
static uint32_t next_random(void) { return seed = seed * 1664525u + 1013904223u; }
static float uniform(void) { return (float)(next_random() >> 8) / (float)(1u << 24) * 2.f - 1.f; }

static void *need(size_t bytes) {
    void *p = malloc(bytes);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static float *floats(int64_t n, float low, float high) {
    float *p = need(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = low + (high - low) * (uniform() + 1.f) / 2.f;
    return p;
}

/* a packed matrix (pack.py's layout): random codes, every scale and minimum a small binary16 value */
static qmat matrix(int64_t rows, int64_t cols, int64_t bits) {
    const int64_t blocks = (rows + TILE_ROWS - 1) / TILE_ROWS, groups = cols / GROUP;
    const int64_t codes = TILE_ROWS * GROUP * bits / 8, group_bytes = codes + SCALE_BYTES;
    uint8_t *tiles = need((size_t)(blocks * groups * group_bytes));
    for (int64_t b = 0; b < blocks * groups; b++) {
        uint8_t *g = tiles + b * group_bytes;
        for (int64_t i = 0; i < codes; i++) g[i] = (uint8_t)next_random();
        for (int64_t i = 0; i < SCALE_BYTES; i += 2) g[codes + i] = 0x1F, g[codes + i + 1] = 0x21; /* ~0.01 */
    }
    return (qmat){tiles, bits, rows, cols};
}

static model_weights model;
static layer_weights layer[LAYERS];
static kv_t *keys[LAYERS], *values[LAYERS];
static int calls;

static int64_t cache_elements(int l) { return (int64_t)SLOTS * KVH * CAPACITY[l] * HEAD_DIM; }

static void build(void) {
    for (int l = 0; l < LAYERS; l++) {
        layer[l] = (layer_weights){matrix((HEADS + 2 * KVH) * HEAD_DIM, HIDDEN, 4), matrix(HIDDEN, HEADS * HEAD_DIM, 4),
                                   matrix(2 * INTER, HIDDEN, 4), matrix(HIDDEN, INTER, 4),
                                   l == 0 ? floats((HEADS + 2 * KVH) * HEAD_DIM, -.1f, .1f) : NULL,
                                   floats(HIDDEN, .5f, 1.5f), floats(HIDDEN, .5f, 1.5f)};
        if (l == 1) { /* Gemma 3's parts: per-head q/k norms, norms of both outputs, its own table, a window */
            layer[l].q_norm = floats(HEAD_DIM, .5f, 1.5f), layer[l].k_norm = floats(HEAD_DIM, .5f, 1.5f);
            layer[l].attn_out_norm = floats(HIDDEN, .5f, 1.5f), layer[l].mlp_out_norm = floats(HIDDEN, .5f, 1.5f);
            layer[l].rope_cos = floats(MAXPOS * HEAD_DIM, -1.f, 1.f), layer[l].rope_sin = floats(MAXPOS * HEAD_DIM, -1.f, 1.f);
            layer[l].window = WINDOW;
        }
        keys[l] = need(sizeof(kv_t) * (size_t)cache_elements(l));
        values[l] = need(sizeof(kv_t) * (size_t)cache_elements(l));
        for (int64_t i = 0; i < cache_elements(l); i++) keys[l][i] = values[l][i] = (kv_t)0.f;
    }
    model = (model_weights){LAYERS, HIDDEN, HEADS, KVH, HEAD_DIM, INTER, MAXPOS, 1e-5f, 0.25f,
                            floats(MAXPOS * HEAD_DIM, -1.f, 1.f), floats(MAXPOS * HEAD_DIM, -1.f, 1.f),
                            floats(HIDDEN, .5f, 1.5f), matrix(VOCAB, HIDDEN, 8), layer, 1, 2.f};
}

static void fail(const char *what) {
    fprintf(stderr, "call %d: %s\n", calls, what);
    exit(1);
}

/* one call; `expect` its status. A refused call must leave the cache exactly as it was. */
static void call(int64_t n, const int32_t *slots, const int32_t *positions, int64_t slot_count, int64_t n_out,
                 const int32_t *out_rows, int want_logits, int want_hidden, int threads, int expect) {
    calls++;
    float *hidden = floats(n > 0 ? n * HIDDEN : 1, -1.f, 1.f);
    float *logits = want_logits ? need(sizeof(float) * (size_t)(n_out * VOCAB + 1)) : NULL;
    float *normed = want_hidden ? need(sizeof(float) * (size_t)(n_out * HIDDEN + 1)) : NULL;
    kv_t *before[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        before[l] = need(sizeof(kv_t) * (size_t)cache_elements(l));
        memcpy(before[l], keys[l], sizeof(kv_t) * (size_t)cache_elements(l));
    }
    int status = sluice_native_forward(&model, n, slots, positions, hidden, keys, values, CAPACITY, slot_count, n_out,
                                       out_rows, logits, normed, threads);
    if (status != expect) {
        fprintf(stderr, "call %d: status %d, expected %d\n", calls, status, expect);
        exit(1);
    }
    if (expect == 0) {
        for (int64_t i = 0; logits && i < n_out * VOCAB; i++)
            if (!isfinite(logits[i])) fail("a logit is not finite");
        for (int64_t i = 0; normed && i < n_out * HIDDEN; i++)
            if (!isfinite(normed[i])) fail("a hidden state is not finite");
    } else {
        for (int l = 0; l < LAYERS; l++)
            if (memcmp(before[l], keys[l], sizeof(kv_t) * (size_t)cache_elements(l))) fail("a refused call wrote");
    }
    for (int l = 0; l < LAYERS; l++) free(before[l]);
    free(hidden);
    free(logits);
    free(normed);
}

static void run(int64_t n, int32_t slot, int32_t start, int threads) { /* a prefill chunk, every row's logits */
    int32_t *slots = need(sizeof(int32_t) * (size_t)n), *positions = need(sizeof(int32_t) * (size_t)n);
    int32_t *rows = need(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) slots[i] = slot, positions[i] = start + (int32_t)i, rows[i] = (int32_t)i;
    call(n, slots, positions, SLOTS, n, rows, 1, 1, threads, 0);
    free(slots);
    free(positions);
    free(rows);
}

int main(void) {
    build();
    run(1, 0, 0, 1);
    run(7, 0, 1, 2);                  /* below a token tile */
    run(20, 1, 0, 3);                 /* above OWN_TOKENS: the team splits the inputs */
    run(40, 2, 8, 4);                 /* to the last position of the smaller layer */
    {                                 /* decode rows of every slot, one at its last position */
        int32_t slots[] = {0, 1, 2}, positions[] = {8, 20, 47}, rows[] = {0, 1, 2};
        call(3, slots, positions, SLOTS, 3, rows, 1, 1, 2, 0);
    }
    {                                 /* a mixed step: two decode rows and 7 positions of another slot, one output */
        int32_t slots[] = {0, 1, 2, 2, 2, 2, 2, 2, 2}, positions[] = {9, 21, 0, 1, 2, 3, 4, 5, 6}, rows[] = {8};
        call(9, slots, positions, SLOTS, 1, rows, 1, 0, 2, 0);
        call(9, slots, positions, SLOTS, 0, rows, 0, 0, 3, 0); /* keys and values only */
    }
    {                                 /* out of range: refused, nothing written */
        int32_t zero[] = {0}, bad_slot[] = {SLOTS}, negative[] = {-1}, far[] = {1 << 30};
        int32_t at_capacity[] = {48}, past_table[] = {MAXPOS}, row_one[] = {1}, two[] = {0, 0};
        call(1, zero, at_capacity, SLOTS, 1, zero, 1, 0, 1, BAD_INDEX);
        call(1, bad_slot, zero, SLOTS, 1, zero, 1, 0, 1, BAD_INDEX);
        call(1, far, zero, SLOTS, 1, zero, 1, 0, 2, BAD_INDEX);
        call(1, negative, zero, SLOTS, 1, zero, 1, 0, 1, BAD_INDEX);
        call(1, zero, negative, SLOTS, 1, zero, 1, 0, 1, BAD_INDEX);
        call(1, zero, past_table, SLOTS, 1, zero, 1, 0, 1, BAD_INDEX);
        call(1, zero, zero, SLOTS, 1, row_one, 1, 0, 1, BAD_INDEX);
        call(1, zero, zero, SLOTS, 2, two, 1, 0, 1, BAD_INDEX);
        call(0, zero, zero, SLOTS, 0, zero, 0, 0, 1, BAD_INDEX);
        call(1, zero, zero, 0, 1, zero, 1, 0, 1, BAD_INDEX);
    }
    printf("ok %d\n", calls);
    return 0;
}
