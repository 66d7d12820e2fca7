#!/bin/bash
# One device session for the PyCUDA backend (issue 4): kernel and backend tests, `vla-edge verify`
# against HuggingFace on tiny / llama-tiny / the Qwen2.5-1.5B-shaped random model (bf16 and fp32),
# then the cycle benchmark. Logs go to $OUT (at most 8 files come back).
#   STAGES="tests verify-small verify-1.5b-bf16 bench verify-1.5b-fp32" (default: all, in that order), from the repo root after
#   `source .whl/on-device.sh`. verify-small covers VERIFY_MODELS (default "tiny llama-tiny") x VERIFY_DTYPES
#   (default "fp32 bf16"); BENCH_ARGS go to the benchmark.
set -o pipefail
OUT=${OUT:-out/gpu_session}
mkdir -p "$OUT"
STAGES=${STAGES:-"tests verify-small verify-1.5b-bf16 bench verify-1.5b-fp32"}
MODELS=${MODELS:-/tmp/vla_models}
PY=${PY:-python3}
status=0

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/machine.txt"

verify() {   # model_dir dtype hf_device
    echo "== verify $1 $2" | tee -a "$OUT/verify.log"
    $PY -m vla_edge_ros.cli verify --model "$1" --backend pycuda --dtype "$2" --hf-device "$3" 2>&1 \
        | grep -v "INFO\|Loading weights" | tee -a "$OUT/verify.log" || status=1
}

make_model() {   # kind dir [args]
    [ -f "$2/config.json" ] || $PY -m vla_edge_ros.cli make-model "$1" --out "$2" "${@:3}" > /dev/null 2>&1 \
        || { echo "make-model $1 failed"; status=1; }
}

for stage in $STAGES; do
    SECONDS=0
    case $stage in
    tests)
        echo "== kernel tests (VLA_EDGE_CUDA_SYNC=1: a fault names its kernel)"
        VLA_EDGE_CUDA_SYNC=1 $PY -m pytest test/test_cuda_kernels.py -q -rs 2>&1 | tee "$OUT/tests.log" | tail -3 || status=1
        echo "== backend tests"
        $PY -m pytest test/test_cuda_backend.py -q -rs 2>&1 | tee -a "$OUT/tests.log" | tail -15 || status=1 ;;
    verify-small)
        for m in ${VERIFY_MODELS:-tiny llama-tiny}; do
            make_model $m "$MODELS/$m"
            for dt in ${VERIFY_DTYPES:-fp32 bf16}; do verify "$MODELS/$m" $dt cuda; done
        done ;;
    verify-1.5b-bf16|verify-1.5b-fp32)
        make_model qwen2.5-1.5b-random "$MODELS/qwen15" --dtype bf16
        verify "$MODELS/qwen15" "${stage##*-}" cuda ;;
    bench)
        echo "== bench"
        $PY -m vla_edge_ros.bench.pycuda_cycle --json "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 | grep -v " INFO " \
            | tee "$OUT/bench.log" || status=1 ;;
    *) echo "unknown stage $stage"; status=1 ;;
    esac
    echo "== stage $stage: ${SECONDS}s"
done
exit $status
