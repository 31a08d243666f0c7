#!/usr/bin/env bash
# CMAKE_ARGS for building llama-cpp-python (the `llama-cpp` peer of `dcoco bench`) for this CPU.
#
# Every SIMD extension this CPU has, named one by one instead of GGML_NATIVE, so that the AMX path
# stays out: on an Intel Xeon with AMX (2 cores, llama-cpp-python 0.3.36) a native build segfaults
# in its first batched decode of the Q4_1 GGUF (llama.cpp reports the same crash in
# ggml_backend_amx_mul_mat), while one token at a time runs. Decoding one token uses the AVX paths
# either way.
set -euo pipefail
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
args="-DGGML_NATIVE=OFF"
add() { if grep -qw "$1" <<<"$flags"; then args="$args -DGGML_$2=ON"; fi; }
add avx AVX
add avx2 AVX2
add fma FMA
add f16c F16C
add bmi2 BMI2
add avx_vnni AVX_VNNI
add avx512f AVX512
add avx512vbmi AVX512_VBMI
add avx512_vnni AVX512_VNNI
add avx512_bf16 AVX512_BF16
echo "$args"
