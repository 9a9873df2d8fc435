#!/usr/bin/env bash
# Compile every CUDA source for sm_90 (compile only: CI has nvcc but no GPU), so a
# syntax error in a kernel fails CI instead of the first GPU run.
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mapfile -t sources < <(git ls-files '*.cu'; git ls-files --others --exclude-standard '*.cu')
# Kernels embedded in Python strings (cupy.RawKernel sources of the GPU test programs and
# benchmarks) are CUDA sources too.
mkdir -p "$out/embedded"
mapfile -t pyfiles < <(git ls-files '*.py'; git ls-files --others --exclude-standard '*.py')
mapfile -t embedded < <(python3 .ci/extract_cuda.py "$out/embedded" "${pyfiles[@]}" | cut -f1)
sources+=("${embedded[@]}")
if [ ${#sources[@]} -eq 0 ]; then echo "compile_cuda: no CUDA sources"; exit 0; fi
for src in "${sources[@]}"; do
  "$NVCC" -arch=sm_90 -std=c++17 --cubin -o "$out/$(basename "$src" .cu).cubin" "$src"
  echo "compile_cuda: ok $src"
done
