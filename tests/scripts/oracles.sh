# oracles.sh: sourced by the script tests. Each check skips the test (exit
# 77, meson's code for a skipped test) when an independent oracle is missing
# on this machine, with the command that installs it.

# require_python PY MODULE...: PY can import every MODULE.
require_python() {
  local py=$1; shift
  local mods
  mods=$(IFS=,; echo "$*")
  if ! "$py" -c "import $mods" 2>/dev/null; then
    echo "SKIP: $py lacks $mods (Debian: apt-get install python3-torchvision python3-onnx)"
    exit 77
  fi
}

# require_ort DIR: node is installed and DIR (tools/ort) has onnxruntime-node.
require_ort() {
  if ! command -v node >/dev/null 2>&1; then
    echo "SKIP: node is not installed"
    exit 77
  fi
  if ! (cd "$1" && node -e "require('onnxruntime-node')") >/dev/null 2>&1; then
    echo "SKIP: onnxruntime-node is missing; run: (cd tools/ort && ONNXRUNTIME_NODE_INSTALL=skip npm ci)"
    exit 77
  fi
}
