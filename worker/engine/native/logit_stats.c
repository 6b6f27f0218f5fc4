/* What choosing a token needs of each row of a step's scores, in C passes over the row instead of torch's
 * several (worker/decoding/logit_stats.py): the index of the row's largest score, and the log of the sum of the
 * exponentials of its logprob scores, whose difference with the chosen token's score is that token's logprob.
 * At Gemma 3's 262,144-token vocabulary torch's logsumexp and NumPy's argmax took ~6 ms of a 16-row decode step.
 *
 * argmax as NumPy's and torch's: the first of equal maxima, and a NaN counts as the maximum (the first NaN).
 * logsumexp as torch's: m + log(sum(e^(x - m))) with m the row's largest value, taken as 0 where it is infinite,
 * so a row of -inf gives -inf, a +inf gives +inf, a NaN gives NaN. The exponentials are exp16.h's (a polynomial,
 * ~1e-7 relative), summed in 16 lanes: within a few float roundings of torch's. A row's results depend on that
 * row alone, so its logprobs do not depend on the batch.
 */
#include <math.h>
#include <stdint.h>
#include "exp16.h"

/* the row's largest value (NaN if it holds one) */
static float peak(const float *x, int64_t cols) {
    float top = -INFINITY;
    int64_t j = 0;
#if defined(__AVX512F__)
    __m512 most = _mm512_set1_ps(-INFINITY);
    __mmask16 nan = 0;
    for (; j + 16 <= cols; j += 16) {
        const __m512 v = _mm512_loadu_ps(x + j);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        most = _mm512_max_ps(most, v);
    }
    if (nan) return NAN;
    top = _mm512_reduce_max_ps(most);
#endif
    for (; j < cols; j++) {
        if (isnan(x[j])) return NAN;
        top = x[j] > top ? x[j] : top;
    }
    return top;
}

/* the first index holding `value` (the first NaN where `value` is NaN); the row holds it */
static int64_t first_index(const float *x, int64_t cols, float value) {
    const int is_nan = isnan(value);
    int64_t j = 0;
#if defined(__AVX512F__)
    const __m512 wanted = _mm512_set1_ps(value);
    for (; j + 16 <= cols; j += 16) {
        const __m512 v = _mm512_loadu_ps(x + j);
        const __mmask16 hit = is_nan ? _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) : _mm512_cmp_ps_mask(v, wanted, _CMP_EQ_OQ);
        if (hit) return j + __builtin_ctz(hit);
    }
#endif
    for (; j < cols; j++)
        if (is_nan ? isnan(x[j]) : x[j] == value) return j;
    return 0; /* not reached */
}

static float log_sum_exp(const float *x, int64_t cols, float top) {
    if (isnan(top) || top == INFINITY) return top;
    const float shift = top == -INFINITY ? 0.f : top;
    float total = 0.f;
    int64_t j = 0;
#if defined(__AVX512F__)
    __m512 sum = _mm512_setzero_ps();
    const __m512 m = _mm512_set1_ps(shift);
    for (; j + 16 <= cols; j += 16) sum = _mm512_add_ps(sum, exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), m)));
    total = _mm512_reduce_add_ps(sum);
#endif
    for (; j < cols; j++) total += expf(x[j] - shift);
    return logf(total) + shift;
}

/* For each of `rows` rows (`stride` floats apart, `cols` > 0): best[r] = the first maximum of scores' row, lse[r]
 * = the logsumexp of logprob_scores' row (the same rows or others of the same shape). */
void sluice_logit_stats(const float *scores, const float *logprob_scores, int64_t rows, int64_t cols,
                        int64_t stride, int64_t *best, float *lse) {
    for (int64_t r = 0; r < rows; r++) {
        const float *s = scores + r * stride, *l = logprob_scores + r * stride;
        const float top = peak(s, cols);
        best[r] = first_index(s, cols, top);
        lse[r] = log_sum_exp(l, cols, l == s ? top : peak(l, cols));
    }
}
