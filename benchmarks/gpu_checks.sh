#!/usr/bin/env bash
# The GPU checks of a session lent a CUDA machine (issues 36 and 48), in one call: the CUDA tests, then
# bench_speed's whole-model and attention-alone tables (bf16, 12 layers, eval-mode training steps), then
# the same with sparse keys, without and with padding (the last quarter of each input), then the memory
# one attention call holds for its backward (bench_attention_memory.py), then the training steps with
# every model compiled (fullgraph, CUDA graphs), then profile_attention.py's profile of the 12-layer training
# steps, dense and LSG (blocks of 170 and 128, sdpa and flex_attention), with one table per length of where
# each step's time goes (issue 69), then bench_t5.py's LSG-T5 against LongT5 (issue 50, bf16), then
# bench_modernbert.py's LSG-ModernBERT against ModernBERT with SDPA (issue 66, base size, bf16).
#
#   bash benchmarks/gpu_checks.sh OUTPUT_FOLDER
#
# A lent machine has no network and an older transformers: wheels in .gpu-wheels/ (for example
# `pip download transformers==5.23.0 --no-deps -d .gpu-wheels`) are installed into /tmp/site first.
# Logs, the device and the results sections (RESULTS-GPU.md, to paste into benchmarks/RESULTS.md)
# land in OUTPUT_FOLDER. TEST_SECONDS, BENCH_SECONDS, PADDED_SECONDS (each of its two runs), MEMORY_SECONDS (each of its two),
# COMPILED_SECONDS, PROFILE_SECONDS, T5_SECONDS and MODERNBERT_SECONDS bound the eight steps (0 leaves a step out);
# BENCH_LENGTHS and BENCH_MODELS narrow the benchmark, PADDED_LENGTHS the sparse and padded one,
# COMPILED_LENGTHS and COMPILED_MODELS the compiled one, PROFILE_LENGTHS the profile, T5_LENGTHS bench_t5,
# MODERNBERT_LENGTHS bench_modernbert (both models; LSG alone at twice the longest).
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

step() {  # step SECONDS NAME: whether to run the step (SECONDS > 0), announced
    [ "$1" -gt 0 ] && echo "== $2"
}

if step "${TEST_SECONDS:-180}" tests/test_gpu.py; then
    timeout "${TEST_SECONDS:-180}" python3 -m pytest tests/test_gpu.py -q -n 8 -p no:cacheprovider -rfE 2>&1 \
        | tee "$out/test_gpu.log" | grep -v Warning | tail -30
fi

read -r -a lengths <<<"${BENCH_LENGTHS:-4096 16384 32768}"
# the conversion default's blocks of 170 beside blocks that divide the length and align with flex's tiles (issue 69)
models=(identity dense longformer bigbird "lsg local 170/0 g1" "lsg local 128/0 g1" "lsg local 256/0 g1")
if [ -n "${BENCH_MODELS:-}" ]; then IFS=',' read -r -a models <<<"$BENCH_MODELS"; fi
if step "${BENCH_SECONDS:-300}" "benchmarks/bench_speed.py"; then
    timeout "${BENCH_SECONDS:-300}" python3 benchmarks/bench_speed.py --device cuda --eval --lengths "${lengths[@]}" \
        --models "${models[@]}" --results GPU --results-file "$out/RESULTS-GPU.md" 2>&1 | tee "$out/bench.log"
fi

read -r -a padded_lengths <<<"${PADDED_LENGTHS:-16384}"
if step "${PADDED_SECONDS:-150}" "benchmarks/bench_speed.py, sparse keys, without and with padding"; then
    for padding in 0 0.25; do
        timeout "${PADDED_SECONDS:-150}" python3 benchmarks/bench_speed.py --device cuda --eval --padding "$padding" \
            --lengths "${padded_lengths[@]}" --models "lsg local 170/0 g1" "lsg pooling 128/128 f4 g1" --skip-memory \
            --results "GPU, padding $padding" --results-file "$out/RESULTS-GPU-padding.md" 2>&1 | grep -v Warning \
            | tee "$out/bench-padding-$padding.log"
    done
fi

if step "${MEMORY_SECONDS:-60}" benchmarks/bench_attention_memory.py; then
    timeout "${MEMORY_SECONDS:-60}" python3 benchmarks/bench_attention_memory.py --device cuda --dtype bfloat16 \
        --lengths "${lengths[@]}" --backends sdpa flex_attention 2>&1 | grep -v Warning | tee "$out/memory.md"
    # what flex_attention's call holds beyond dense's (1.26x in the last lease), storage by storage
    timeout "${MEMORY_SECONDS:-60}" python3 benchmarks/bench_attention_memory.py --device cuda --dtype bfloat16 \
        --lengths 4096 --backends flex_attention --detail 2>&1 | grep -v Warning | tee "$out/memory-detail.md"
fi

read -r -a compiled_lengths <<<"${COMPILED_LENGTHS:-4096 16384 32768}"
compiled_models=(dense "lsg local 170/0 g1")
if [ -n "${COMPILED_MODELS:-}" ]; then IFS=',' read -r -a compiled_models <<<"$COMPILED_MODELS"; fi
if step "${COMPILED_SECONDS:-240}" "benchmarks/bench_speed.py, compiled"; then
    timeout "${COMPILED_SECONDS:-240}" python3 benchmarks/bench_speed.py --device cuda --eval --compile --fullgraph \
        --compile-mode reduce-overhead --backends flex_attention --skip-attention --skip-memory --repeats 5 \
        --lengths "${compiled_lengths[@]}" --models "${compiled_models[@]}" \
        --results "GPU, compiled" --results-file "$out/RESULTS-GPU-compiled.md" 2>&1 | grep -v Warning | tee "$out/bench-compiled.log"
fi

read -r -a profile_lengths <<<"${PROFILE_LENGTHS:-4096 16384}"
if step "${PROFILE_SECONDS:-150}" benchmarks/profile_attention.py; then
    (cd benchmarks && timeout "${PROFILE_SECONDS:-150}" python3 profile_attention.py --lengths "${profile_lengths[@]}" \
        --what model --settings "lsg local 170/0 g1" "lsg local 128/0 g1" --rows 10 2>&1 | grep -v '^USDT' \
        | tee "$out/profile.md")
fi

read -r -a t5_lengths <<<"${T5_LENGTHS:-4096 16384}"
if step "${T5_SECONDS:-150}" "benchmarks/bench_t5.py"; then
    timeout "${T5_SECONDS:-150}" python3 benchmarks/bench_t5.py --device cuda --dtype bfloat16 --lengths "${t5_lengths[@]}" \
        --repeats 3 --skip-scaling --results "GPU, LSG-T5 against LongT5" --results-file "$out/RESULTS-GPU-t5.md" 2>&1 \
        | grep -v Warning | tee "$out/bench-t5.log"
fi

read -r -a modernbert_lengths <<<"${MODERNBERT_LENGTHS:-8192 16384 32768}"
if step "${MODERNBERT_SECONDS:-180}" "benchmarks/bench_modernbert.py"; then
    # its own --budget, 20 s inside the timeout, leaves it the time to write its tables (what did not fit: "not run")
    timeout "${MODERNBERT_SECONDS:-180}" python3 benchmarks/bench_modernbert.py --device cuda --dtype bfloat16 --sizes base \
        --lengths "${modernbert_lengths[@]}" --lsg-lengths $((2 * ${modernbert_lengths[-1]})) --repeats 3 \
        --budget $((${MODERNBERT_SECONDS:-180} - 20)) --results "GPU, LSG-ModernBERT against ModernBERT (sdpa)" \
        --results-file "$out/RESULTS-GPU-modernbert.md" 2>&1 | grep -v Warning | tee "$out/bench-modernbert.log"
fi
