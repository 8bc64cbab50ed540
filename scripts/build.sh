#!/usr/bin/env bash
# Installs what is missing and builds Tandem (Release, Ninja). The one build recipe: CI
# (scripts/test.sh), the demo (scripts/demo.sh) and the container images (deploy/docker/) all
# build through it.
# Usage: scripts/build.sh [BUILD_DIR [CMAKE_ARG ... [-- NINJA_TARGET ...]]]
#   scripts/build.sh                                   # build/, every target
#   scripts/build.sh /out -DTANDEM_BUILD_TESTS=OFF -- tandem
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache: paths relative to the checkout, so a fresh clone (CI) reuses what an earlier build of
# any checkout compiled, debug builds included.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1

build_dir=${1:-build}
[ $# -gt 0 ] && shift
cmake_args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  cmake_args+=("$1")
  shift
done
[ $# -gt 0 ] && shift  # the "--"

scripts/install-deps.sh
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cmake_args[@]}" >/dev/null
ninja -C "$build_dir" "$@"
