#!/usr/bin/env bash
# setup.sh: makes a fresh Debian 12 machine ready to build and test Teq, then
# builds it. Idempotent: installs only missing packages, configures a build
# directory only once. Run as root (or with sudo available).
#
#   tools/setup.sh            the build packages, then an optimized build in build/
#   tools/setup.sh --test     also what the tests need (PyTorch, ONNX, Node,
#                             ONNX Runtime from npm) and a sanitizer build in build-asan/
set -euo pipefail
cd "$(dirname "$0")/.."

want_tests=0
[ "${1:-}" = "--test" ] && want_tests=1

build_pkgs=(gcc pkg-config meson ninja-build protobuf-c-compiler libprotobuf-c-dev
            libonnx-dev libopenblas-dev libz3-dev libgmp-dev libsqlite3-dev)
# python3-pil draws the page of text fetch_npm.py feeds the trained models
test_pkgs=(libonnx-testdata python3-torchvision python3-onnx python3-pil sqlite3 gnuplot-nox)
# A machine may already have Node from elsewhere; Debian's is fine too.
command -v node >/dev/null || test_pkgs+=(nodejs)
command -v npm >/dev/null || test_pkgs+=(npm)

pkgs=("${build_pkgs[@]}")
[ $want_tests = 1 ] && pkgs+=("${test_pkgs[@]}")

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" != 0 ] && SUDO=sudo
  $SUDO apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi

# ONNX Runtime for Node is the independent oracle of the tests and the
# benchmarks. Its post-install step would fetch a CUDA provider from outside
# the npm registry, so it is skipped: the CPU library ships in the package.
if [ $want_tests = 1 ] && [ ! -d tools/ort/node_modules/onnxruntime-node ]; then
  echo "setup: installing onnxruntime-node" >&2
  (cd tools/ort && ONNXRUNTIME_NODE_INSTALL=skip npm ci --no-audit --no-fund >&2)
fi

if [ ! -f build/build.ninja ]; then
  tools/build/meson-setup.sh build --buildtype=release -Db_ndebug=false >&2
fi
ninja -C build >&2

if [ $want_tests = 1 ]; then
  if [ ! -f build-asan/build.ninja ]; then
    tools/build/meson-setup.sh build-asan -Db_sanitize=address,undefined -Db_lundef=false >&2
  fi
  ninja -C build-asan >&2
fi
