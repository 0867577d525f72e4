#!/usr/bin/env bash
# The GPU checks of a session lent a CUDA machine (issue 36), in one call: the CUDA tests, then
# bench_speed's whole-model and attention-alone tables (bf16, 12 layers, eval-mode training steps),
# then profile_attention.py's per-op profile of the attention alone and its flex kernel variants.
#
#   bash benchmarks/gpu_checks.sh OUTPUT_FOLDER
#
# A lent machine has no network and an older transformers: wheels in .gpu-wheels/ (for example
# `pip download transformers==5.23.0 --no-deps -d .gpu-wheels`) are installed into /tmp/site first.
# Logs, the device and the results section (RESULTS-GPU.md, to paste into benchmarks/RESULTS.md)
# land in OUTPUT_FOLDER. TEST_SECONDS, BENCH_SECONDS and PROFILE_SECONDS bound the three steps;
# BENCH_LENGTHS and BENCH_MODELS narrow the benchmark, PROFILE_LENGTHS the profile.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:?give an output folder}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
if compgen -G ".gpu-wheels/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu-wheels/*.whl || exit 1
    export PYTHONPATH="/tmp/site:$PWD"
fi
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} | tee "$out/device.txt"

echo "== tests/test_gpu.py"
timeout "${TEST_SECONDS:-180}" python3 -m pytest tests/test_gpu.py -q -n 8 -p no:cacheprovider -rfE 2>&1 \
    | tee "$out/test_gpu.log" | tail -30

echo "== benchmarks/bench_speed.py"
read -r -a lengths <<<"${BENCH_LENGTHS:-4096 16384 32768}"
models=(identity dense longformer bigbird "lsg local 170/0 g1")
if [ -n "${BENCH_MODELS:-}" ]; then IFS=',' read -r -a models <<<"$BENCH_MODELS"; fi
timeout "${BENCH_SECONDS:-400}" python3 benchmarks/bench_speed.py --device cuda --eval --lengths "${lengths[@]}" \
    --models "${models[@]}" --results GPU --results-file "$out/RESULTS-GPU.md" 2>&1 | tee "$out/bench.log"

echo "== benchmarks/profile_attention.py"
read -r -a profile_lengths <<<"${PROFILE_LENGTHS:-16384}"
(cd benchmarks && timeout "${PROFILE_SECONDS:-120}" python3 profile_attention.py --lengths "${profile_lengths[@]}" \
    --what attention flex-kernel 2>&1 | grep -v '^USDT' | tee "$out/profile.md")
