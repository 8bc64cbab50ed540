#!/usr/bin/env bash
# Installs what is missing, builds Tandem and runs every test suite CI runs:
#   1. release build: unit, reference (torch parity), conformance (tokenizer ids vs the npm
#      @lenml/tokenizers oracle; needs node and the npm registry), integration and deploy tests
#      (Dockerfile lint, kustomize overlays against the Kubernetes schemas, promtool, a real
#      Prometheus scraping `tandem serve`)
#   2. ASan+UBSan build: unit tests
#   3. clang ThreadSanitizer build, with clang's -Wthread-safety as errors (the locking
#      annotations are checked): unit tests under TSan, and the tandem binary compiled
#   4. libFuzzer build (clang): each fuzz target for TANDEM_FUZZ_SECONDS (default 30)
# The release build compiles the CUDA backend where nvcc is found (TANDEM_CUDA=AUTO) and runs its
# host-side tests; CUDA kernel tests skip without a GPU. The sanitizer builds leave CUDA out.
# Usage: scripts/test.sh [--quick]   (--quick skips the sanitizer and fuzz passes)
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache: paths relative to the checkout, so a fresh clone (CI) reuses what an earlier build of
# any checkout compiled, debug builds included.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1

# The tests' temporary files (models, logs, fuzz scratch) go under one directory of this run's,
# removed at the end: what a crashed or killed test left behind goes with it, so a machine
# that runs the suites again and again does not fill /tmp. A failed run outside CI keeps it to
# look at.
test_tmp=$(mktemp -d "${TMPDIR:-/tmp}/tandem-test.XXXXXX")
export TMPDIR="$test_tmp"
finish() {
  local status=$?
  if [ "$status" = 0 ] || [ "${CI:-}" = true ]; then
    rm -rf "$test_tmp"
  else
    echo "the tests' temporary files are kept in $test_tmp"
  fi
  return "$status"
}
trap finish EXIT

quick=0
[ "${1:-}" = "--quick" ] && quick=1
jobs=$(nproc)
fuzz_seconds=${TANDEM_FUZZ_SECONDS:-30}

echo "== release build"
scripts/build.sh build
echo "== release tests"
ctest --test-dir build -j "$jobs" --output-on-failure --timeout 900

[ "$quick" = 1 ] && exit 0

echo "== ASan+UBSan build (unit tests)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_SANITIZE=ON \
  -DTANDEM_BUILD_BENCH=OFF -DTANDEM_CUDA=OFF >/dev/null
ninja -C build-asan unit_tests
echo "== ASan+UBSan unit tests"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan -L unit -j "$jobs" --output-on-failure --timeout 900

echo "== clang ThreadSanitizer build (-Wthread-safety as errors)"
CC=clang CXX=clang++ cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTANDEM_TSAN=ON -DTANDEM_BUILD_BENCH=OFF -DTANDEM_CUDA=OFF >/dev/null
ninja -C build-tsan unit_tests tandem
echo "== ThreadSanitizer unit tests"
# Debian's libraries are not built with TSan: see tests/tsan.supp and tests/tsan/.
TSAN_OPTIONS="halt_on_error=1 ignore_noninstrumented_modules=1 suppressions=$PWD/tests/tsan.supp" \
  ctest --test-dir build-tsan -L unit -j "$jobs" --output-on-failure --timeout 900

echo "== fuzz (${fuzz_seconds}s per target)"
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTANDEM_FUZZ=ON -DTANDEM_BUILD_TESTS=OFF -DTANDEM_BUILD_BENCH=OFF -DTANDEM_CUDA=OFF \
  -DTANDEM_FUZZ_SECONDS="$fuzz_seconds" >/dev/null
ninja -C build-fuzz fuzz_targets
ctest --test-dir build-fuzz -L fuzz -j "$jobs" --output-on-failure
echo "== all test suites passed"
