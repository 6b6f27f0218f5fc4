/* forward.c's vectorized attention, SiLU and GELU against the arithmetic they replace, bit for bit
 * (tests/worker/engine/test_native_exact.py). A draft token's logits must be those of a step of its own, and both
 * those of the code before: so attention over many queries at once (attend_blocks: the tokens of a draft or a prompt
 * chunk and the heads of a kv group) must give each query the bits it gets alone (one query runs the per-key
 * path, dot_half and weigh_values), and expf16 those of the C library's expf. Windows, soft-caps, head sizes with
 * and without a 64-wide part, and expf's special inputs included; the GeGLU's GELU against its scalar form and the
 * tanh form it replaced. Prints "ok" and exits 0, else what differed; prints "skip" where the CPU has no AVX512F
 * (neither function is built there).
 */
#include "forward.c"

#include <stdio.h>

static uint32_t seed = 2024u;
static uint32_t next_random(void) { return seed = seed * 1664525u + 1013904223u; }
static float uniform(void) { return (float)(next_random() >> 8) / (float)(1u << 24) * 2.f - 1.f; }
static int64_t below(int64_t n) { return (int64_t)(next_random() >> 8) % n; }

#if defined(__AVX512F__)
static int same(const float *a, const float *b, int64_t n) { return memcmp(a, b, sizeof(float) * (size_t)n) == 0; }

/* one pass of `count` queries over `positions` keys against each query alone; 0 when they differ */
static int attention_case(int64_t D, int64_t positions, int count, int64_t window, float softcap, float spread) {
    kv_t *k = malloc(sizeof(kv_t) * positions * D), *v = malloc(sizeof(kv_t) * positions * D);
    float *qs = malloc(sizeof(float) * count * D), *together = malloc(sizeof(float) * count * D);
    float *alone = malloc(sizeof(float) * count * D), *score = malloc(sizeof(float) * ATTEND_QUERIES * positions);
    float *wide = malloc(sizeof(float) * (KEY_BLOCK + VALUE_BLOCK) * D);
    const float *q[ATTEND_QUERIES];
    float *out[ATTEND_QUERIES];
    int64_t from[ATTEND_QUERIES], len[ATTEND_QUERIES];
    for (int64_t j = 0; j < positions * D; j++) {
        k[j] = (kv_t)(uniform() * spread);
        v[j] = (kv_t)uniform();
    }
    for (int i = 0; i < count; i++) {
        for (int64_t j = 0; j < D; j++) qs[i * D + j] = uniform() * spread;
        q[i] = qs + i * D;
        out[i] = together + i * D;
        len[i] = positions - below(positions < 12 ? positions : 12); /* a draft's or a chunk's causal lengths */
        from[i] = window > 0 && len[i] > window ? len[i] - window : 0;
    }
    attend(q, from, len, out, count, k, v, D, 0.125f, softcap, score, positions, wide);
    for (int i = 0; i < count; i++) {
        float *mine = alone + i * D;
        attend(&q[i], &from[i], &len[i], &mine, 1, k, v, D, 0.125f, softcap, score, positions, wide);
    }
    const int ok = same(together, alone, count * D);
    if (!ok)
        printf("attention differs: D=%ld positions=%ld count=%d window=%ld softcap=%g\n", (long)D, (long)positions,
               count, (long)window, softcap);
    free(k); free(v); free(qs); free(together); free(alone); free(score); free(wide);
    return ok;
}

static int expf_matches(float x) {
    float in[16], out[16];
    for (int j = 0; j < 16; j++) in[j] = j == 5 ? x : -0.5f; /* a special lane among ordinary ones, and alone */
    _mm512_storeu_ps(out, expf16(_mm512_loadu_ps(in)));
    const float want = expf(x);
    uint32_t got_bits, want_bits;
    memcpy(&got_bits, &out[5], 4);
    memcpy(&want_bits, &want, 4);
    if (got_bits == want_bits || (isnan(want) && isnan(out[5]))) return 1;
    printf("expf(%a): %a, the C library's %a\n", x, out[5], want);
    return 0;
}
#endif

int main(void) {
#if !defined(__AVX512F__)
    printf("skip\n");
    return 0;
#else
    int ok = 1;
    const int64_t sizes[] = {64, 128, 80, 16, 256};
    for (int s = 0; s < 5; s++)
        for (int trial = 0; trial < 12; trial++) {
            const int64_t positions = 1 + below(trial < 6 ? 40 : 700);
            const int count = 2 + (int)below(ATTEND_QUERIES - 1);
            ok &= attention_case(sizes[s], positions, count, trial % 3 == 1 ? 1 + below(50) : 0,
                                 trial % 4 == 2 ? 30.f : 0.f, trial % 5 == 0 ? 12.f : 1.f);
        }
    for (uint64_t bits = 0; bits < (1ull << 32); bits += 4093) { /* every exponent, a spread of mantissas */
        uint32_t b = (uint32_t)bits;
        float x;
        memcpy(&x, &b, 4);
        ok &= expf_matches(x);
    }
    const float edges[] = {0.f, -0.f, INFINITY, -INFINITY, NAN, 88.f, -88.f, 0x1.62e42ep6f, 0x1.62e430p6f,
                           -0x1.9fe368p6f, -0x1.9fe36ap6f, -0x1.9d1d9ep6f, -0x1.9d1da0p6f, 0x1p-149f, -0x1p-149f,
                           87.99999f, -87.99999f, 1e-8f, -103.5f, -104.f};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) ok &= expf_matches(edges[i]);
    float gate[100], up[100], fast[100];
    for (int j = 0; j < 100; j++) {
        gate[j] = uniform() * (j % 7 == 0 ? 120.f : 6.f);
        up[j] = uniform();
    }
    silu_gate(gate, up, fast, 100);
    for (int j = 0; j < 100; j++) {
        const float slow = gate[j] / (1.f + expf(-gate[j])) * up[j];
        if (memcmp(&slow, &fast[j], 4)) {
            printf("silu differs at %d: %a, scalar %a\n", j, fast[j], slow);
            ok = 0;
        }
    }
    float gelu[100];
    gelu_gate(gate, up, gelu, 100); /* 96 values vectorized, the last 4 by the scalar tail */
    for (int j = 0; j < 100; j++) {
        const float x = gate[j], slow = x / (1.f + expf(-2.f * 0.7978845608028654f * (x + x * x * (x * 0.044715f))));
        /* and what it replaces, 0.5 x (1 + tanh u): the same function, a rounding apart */
        const double u = 0.7978845608028654 * ((double)x + 0.044715 * (double)x * x * x);
        const double tanh_form = 0.5 * x * (1.0 + tanh(u)) * up[j];
        if (memcmp(&(float){slow * up[j]}, &gelu[j], 4) || fabs(gelu[j] - tanh_form) > 1e-6 * fabs(tanh_form) + 1e-30) {
            printf("gelu differs at %d: %a, scalar %a, tanh form %a\n", j, gelu[j], slow * up[j], tanh_form);
            ok = 0;
        }
    }
    printf(ok ? "ok\n" : "failed\n");
    return !ok;
#endif
}
