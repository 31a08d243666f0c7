// AVX-512 helpers shared by the fused kernels (int4_dot.cpp, w4a8_layer.cpp, draft_attention.cpp):
// bf16 <-> fp32 for 16 values and e^x by a polynomial. DCOCO_VECTOR_MATH where AVX-512 F and BW
// are there (widen, exp); DCOCO_VECTOR_BF16 where AVX-512 bf16 is too (narrow, round_bf16).
#pragma once

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>

#include <c10/util/BFloat16.h>

#define DCOCO_VECTOR_MATH 1

namespace dcoco_vector {

// e^x for x in [-88, 88] (clamped outside): 2^n · p(f), x = n·ln2 + f, |f| <= ln2 / 2, p of
// degree 6; relative error ~1e-7, about one fp32 step.
inline __m512 exp(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-88.0f)), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  f = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), f);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

inline __m512 widen(const c10::BFloat16* at) {  // 16 bf16 -> 16 fp32
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

#ifdef __AVX512BF16__
#define DCOCO_VECTOR_BF16 1

inline __m256i narrow(__m512 x) {  // 16 fp32 -> 16 bf16, to nearest even as c10::BFloat16
  return (__m256i)_mm512_cvtneps_pbh(x);
}

inline __m512 round_bf16(__m512 x) {  // x rounded to bf16, kept in fp32
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(narrow(x)), 16));
}
#endif

}  // namespace dcoco_vector

#endif
