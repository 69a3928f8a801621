#!/usr/bin/env bash
# meson-setup.sh: `meson setup DIR ARGS...`, with nvcc run through
# nvcc-deps so that ninja knows which headers each .cu object includes
# (meson before 1.4 gives nvcc no dependency flags). The native file that
# names the wrapper is written into DIR, where meson reads it again when it
# reconfigures. Every script that makes a build directory goes through here.
#
#   tools/build/meson-setup.sh DIR [MESON_SETUP_ARGS...]
set -euo pipefail
dir=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dir"
printf "[binaries]\ncuda = '%s'\n" "$here/nvcc-deps" >"$dir/cuda-native.ini"
exec meson setup "$dir" --native-file "$dir/cuda-native.ini" "$@"
