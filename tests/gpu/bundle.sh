#!/bin/sh
# Packs what the GPU checks need into .dev/ (git-ignored through
# .git/info/exclude) for a machine with a GPU but without psd's Debian
# libraries: the CUDA suites, kernel_bench, psd, pslaunch and dworker from
# BUILD (a CUDA build: nvcc found at meson setup), the shared libraries they
# load (all but glibc's, libstdc++'s and CUDA's, which that machine has),
# Fashion-MNIST, and check.sh, which runs there (docs/performance.md,
# "On a GPU").
#
# Usage: sh tests/gpu/bundle.sh [BUILD]     (default: build)
set -eu
build=${1:-build}
[ -x "$build/tests/test-kernels-cuda" ] || {
  echo "bundle.sh: $build/tests/test-kernels-cuda is missing: a CUDA build is needed (nvcc at meson setup)" >&2
  exit 2
}
bins="$build/tests/test-kernels-cuda $build/tests/test-model-cuda $build/tests/kernel_bench $build/worker/dworker $build/ps-server/psd $build/deploy/pslaunch"
data=/usr/share/datasets/fashion-mnist
mkdir -p .git/info
grep -qx '/.dev/' .git/info/exclude 2>/dev/null || echo '/.dev/' >>.git/info/exclude
rm -rf .dev && mkdir -p .dev/bin .dev/data .dev/stage/libs
cp $bins .dev/bin/
cp "$data"/*.gz .dev/data/
for b in $bins; do ldd "$b"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -v -E 'cuda|/libc\.so|/libm\.so|/libdl|/libpthread|/librt|/ld-linux|libstdc\+\+|libgcc_s' |
  while read -r l; do cp -L "$l" .dev/stage/libs/; done
tar -C .dev/stage -cJf .dev/libs.tar.xz libs && rm -rf .dev/stage
cp tests/gpu/check.sh .dev/
echo "bundle.sh: .dev/ holds $(du -sh .dev | cut -f1); run there: bash .dev/check.sh (device tool: carry .dev)"
