/* e^x of 16 floats for the native sources (forward.c's attention, logit_stats.c's logsumexp). */
#ifndef SLUICE_EXP16_H
#define SLUICE_EXP16_H
#if defined(__AVX512F__)
#include <immintrin.h>

/* e^x of 16 values (here x <= 0: scores less their peak): 2^n e^r with n = round(x / ln 2) and e^r by its
 * Taylor series to r^6 on |r| <= ln 2 / 2 (error ~1e-7 relative), 2^n applied by scalef. The scalar expf of
 * libm took most of a long-context attention's time. */
static inline __m512 exp16(__m512 x) {
    /* e^-104 is below float's smallest: 0 either way; max returns its second operand where one is NaN, so a
     * NaN score stays NaN (and the row's logits with it) */
    x = _mm512_max_ps(_mm512_set1_ps(-104.f), x);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x); /* ln 2 in two parts: exact n * hi */
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723212e-6f), r);
    __m512 p = _mm512_set1_ps(1.f / 720.f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(p, n);
}
#endif
#endif
