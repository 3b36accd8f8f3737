#!/usr/bin/env bash
# The one-command GPU check: on a lent GPU machine, in the repository's root,
#
#     bash scripts/gpu/gpu_check.sh            # writes $OUT/gpu_report.md, gpu_report.json,
#                                          # gpu_logs.tar.gz (every stage's log and JSON),
#                                          # gpu_check.log (this script's console)
#
# Stages, the most valuable first, each under its own `timeout` and cut to what is left of the
# budget; a stage that fails or times out is recorded and the next one runs; the report is
# rewritten after every stage, so a call killed at its limit still brings one back:
#
#   machine        nvidia-smi, Python, torch, CUDA, nvcc (scripts/gpu/gpu_machine.py)
#   horovod_build  Horovod 0.28.1 with NCCL from .gpu_bundle/ (scripts/gpu/gpu_bundle.sh made it
#                  here): started in the background at once (nice 19, make -j$GPU_CHECK_HOROVOD_JOBS),
#                  waited for before horovod_run
#   build          the extension: pip install --no-build-isolation --no-deps -e . (then
#                  setup.py build_ext --inplace if that fails)
#   tests          pytest -n over the CUDA tests (stage_tests lists the files; interrupted
#                  with SIGINT at its box: the counts so far are kept)
#   ddp_e2e        ResNet-50 under DDP at P = 1, every scheme x float32 / fp16+GradScaler /
#                  bf16, host syncs per step, profiler traces of one float32 step of dense and
#                  gTop-k 0.001 (trace_*.json.gz; scripts/gpu/gpu_e2e.py)
#   baseline       ddp_e2e and step_memory (d = 25.6M) on GPU_CHECK_BASELINE's Python, when it is
#                  set (e2e_baseline.json, step_baseline.json)
#   step_memory    SparseStep per scheme at d = 25.6M and 1e9: time vs the fused kernel, peak
#                  memory, exact / sketch / granularity (scripts/gpu/gpu_step.py)
#   profile        where the time goes: the top-k kernel's and each step's device kernels beside
#                  its wall time (scripts/gpu/gpu_profile.py)
#   bench_topk     python -m gtopk_hvd.bench topk --device cuda
#   bench_select   python -m gtopk_hvd.bench select --device cuda
#   bench_memory   python -m gtopk_hvd.bench memory --states cuda
#   horovod_run    gtopk_hvd's torch DistributedOptimizer under Horovod, float32 and the AMP
#                  recipe (scripts/gpu/gpu_horovod.py)
#
# Then scripts/gpu/gpu_report.py: every figure beside its target. Environment:
#   OUT                      where the report goes (default results/tmp/gpu_check)
#   GPU_CHECK_DEVICE=cpu     a dry run on a machine without a GPU: tiny sizes, no builds (the
#                            extension already built is used), the bundle only unpacked and patched
#   GPU_CHECK_BUDGET_S       the script's own deadline in seconds (default 480: 8 minutes,
#                            inside the device's call limit of 600)
#   GPU_CHECK_PYTHON         the Python (default python3)
#   GPU_CHECK_BUNDLE         the bundle folder (default .gpu_bundle)
#   GPU_CHECK_HOROVOD_JOBS   make jobs of the background Horovod build (default 8)
#   GPU_CHECK_STAGES         only these stages, e.g. "machine build tests" (default: all but the
#                            Horovod ones, whose compile would load the CPUs while the timed
#                            stages run; Horovod in a call of its own:
#                            "machine build horovod_build horovod_run")
#   GPU_CHECK_PREBUILT=1     use the extension carried in gtopk_hvd/ (built elsewhere for this
#                            machine's Python, e.g. `GTOPK_NATIVE=0 CXXFLAGS=-march=x86-64-v4
#                            CUDAARCHS=90-real python3.12 setup.py build_ext --inplace`) when it
#                            imports with its CUDA kernels; otherwise build as usual
#   GPU_CHECK_FULL_TESTS=1   the tests stage includes the full-sort references at d = 2^24
#   GPU_CHECK_TEST_FILES     the tests stage's files instead of its list (space-separated)
#   GPU_CHECK_TEST_K         and a pytest -k expression choosing among their tests
#   GPU_CHECK_TESTS_BOX_S    the tests stage's time box in seconds (default 180)
#   GPU_CHECK_E2E_ARGS       more arguments for scripts/gpu/gpu_e2e.py (e.g. "--schemes dense
#                            gtopk-0.001 --precisions bfloat16-amp")
#   GPU_CHECK_BASELINE       a folder holding another commit's gtopk_hvd/ (e.g. `git archive
#                            <commit> gtopk_hvd | tar -x -C <folder>`): the baseline stage then
#                            runs ddp_e2e's and step_memory's measurements (the latter at
#                            d = 25.6M) on that Python with this build's extension copied in, so
#                            before and after share one machine and one call
#   GPU_CHECK_WORK           the work folder (default: a new /tmp/gpu_check.XXXXXX)
# docs/gpu.md has the device call.
set -uo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO_ROOT" || exit 1
DEVICE="${GPU_CHECK_DEVICE:-cuda}"
PY="${GPU_CHECK_PYTHON:-python3}"
BUDGET="${GPU_CHECK_BUDGET_S:-480}"
OUT_DIR="${OUT:-$REPO_ROOT/results/tmp/gpu_check}"
BUNDLE="${GPU_CHECK_BUNDLE:-$REPO_ROOT/.gpu_bundle}"
HOROVOD_JOBS="${GPU_CHECK_HOROVOD_JOBS:-8}"
STEP_REPEATS=15  # timed steps of each SparseStep figure (step_memory and the baseline)
STAGES="${GPU_CHECK_STAGES:-machine build tests ddp_e2e step_memory baseline profile bench_topk bench_select bench_memory}"
JOBS="$(nproc)"
BASE="${GPU_CHECK_WORK:-$(mktemp -d /tmp/gpu_check.XXXXXX)}"
FIG="$BASE/figures"         # what the report reads (and gpu_logs.tar.gz carries back)
HVD_DIR="$BASE/horovod"     # the Horovod build (not carried back)
REPORT_RESERVE=15           # seconds kept for the last report
START=$SECONDS
mkdir -p "$OUT_DIR" "$FIG/logs" "$HVD_DIR"
exec > >(tee -a "$OUT_DIR/gpu_check.log") 2>&1
export DEVICE PY FIG HVD_DIR BUNDLE JOBS HOROVOD_JOBS REPO_ROOT STEP_REPEATS
export PYTHONUNBUFFERED=1 PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"
case "$DEVICE" in cuda|cpu) ;; *) echo "GPU_CHECK_DEVICE must be cuda or cpu" >&2; exit 2;; esac

COMMIT="$(git rev-parse HEAD 2>/dev/null || cat "$BUNDLE/commit.txt" 2>/dev/null || echo unknown)"
STARTED="$(date -u +%Y-%m-%dT%H:%M:%SZ)"

# -- bookkeeping --------------------------------------------------------------------------

elapsed() { echo $((SECONDS - START)); }
remaining() { echo $((BUDGET - (SECONDS - START) - REPORT_RESERVE)); }
wanted() { [[ " $STAGES " == *" $1 "* ]]; }

record_stage() {  # name status rc seconds box note
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "${6//$'\t'/ }" >>"$FIG/stages.tsv"
}

last_line() {  # the last non-empty line of a stage's log, for the stages table
    grep -v '^[[:space:]]*$' "$FIG/logs/$1.log" 2>/dev/null | tail -n 1 | cut -c1-240 | tr -d '|'
}

write_report() {
    printf '{"commit": "%s", "started": "%s", "device": "%s", "budget_s": %s, "elapsed_s": %s, "overlap_note": "%s"}\n' \
        "$COMMIT" "$STARTED" "$DEVICE" "$BUDGET" "$(elapsed)" "$OVERLAP_NOTE" >"$FIG/meta.json"
    "$PY" scripts/gpu/gpu_report.py "$FIG" --md "$OUT_DIR/gpu_report.md" --json "$OUT_DIR/gpu_report.json" \
        >"$FIG/logs/report.log" 2>&1 || echo "   (the report writer failed: $FIG/logs/report.log)"
    tar -czf "$OUT_DIR/gpu_logs.tar.gz" -C "$FIG" . 2>/dev/null
}

# run_stage NAME BOX_S [--signal SIG] COMMAND...: the command under `timeout` (its whole process
# group), its output in logs/NAME.log; exit 99 means "skipped" (the log's last line says why).
run_stage() {
    local name=$1 box=$2 signal=TERM
    shift 2
    if [[ $1 == --signal ]]; then signal=$2; shift 2; fi
    wanted "$name" || return 0
    local left
    left=$(remaining)
    if (( left < 10 )); then
        record_stage "$name" skipped "" 0 "$box" "no time left in the ${BUDGET} s budget"
        write_report
        return 0
    fi
    (( box > left )) && box=$left
    echo "== [$(elapsed) s] $name (time box $box s)"
    local began=$SECONDS rc status
    timeout -s "$signal" -k 20 "$box" "$@" >"$FIG/logs/$name.log" 2>&1
    rc=$?
    case $rc in
        0) status=ok ;;
        99) status=skipped ;;
        124|137) status=timeout ;;
        *) status=failed ;;
    esac
    record_stage "$name" "$status" "$rc" $((SECONDS - began)) "$box" "$(last_line "$name")"
    tail -n 4 "$FIG/logs/$name.log" | sed 's/^/   /'
    echo "   -> $status (exit $rc, $((SECONDS - began)) s)"
    write_report
}

# -- stages (exported: `timeout` runs them in a fresh bash) ------------------------------------

stage_machine() {
    "$PY" scripts/gpu/gpu_machine.py machine "$FIG/machine.json"
}

nccl_home() {
    "$PY" scripts/gpu/gpu_machine.py nccl-home
}

stage_horovod_build() {
    set -e
    local sdist="$BUNDLE/horovod-0.28.1.tar.gz"
    if [[ ! -f $sdist ]]; then
        echo "no Horovod sdist in $BUNDLE: run scripts/gpu/gpu_bundle.sh on the development machine and carry .gpu_bundle"
        return 1
    fi
    rm -rf "$HVD_DIR/src" "$HVD_DIR/deps" && mkdir -p "$HVD_DIR/src"
    tar -xzf "$sdist" -C "$HVD_DIR/src"
    "$PY" scripts/ci/patch_horovod.py "$HVD_DIR/src/horovod-0.28.1"
    # Horovod's setup imports cffi (and cffi pycparser); nothing can be fetched there.
    local as_there=()  # a dry run's Python need not be the 3.12 the wheels are for
    [[ $DEVICE == cpu ]] && as_there=(--only-binary=:all: --python-version 3.12 --implementation cp
                                      --platform manylinux2014_x86_64)
    "$PY" -m pip install -q --no-index --no-deps --no-compile "${as_there[@]}" \
        --target "$HVD_DIR/deps" "$BUNDLE"/cffi-*.whl "$BUNDLE"/pycparser-*.whl
    if [[ $DEVICE == cpu ]]; then
        echo "dry run: the sdist unpacked and patched, cffi and pycparser installed; no compile"
        return 99
    fi
    local nccl
    nccl=$(nccl_home)
    echo "NCCL: $nccl"
    [[ -f $nccl/include/nccl.h ]] || echo "warning: no $nccl/include/nccl.h"
    [[ -e $nccl/lib/libnccl.so ]] || ln -s libnccl.so.2 "$nccl/lib/libnccl.so"
    cd "$HVD_DIR/src/horovod-0.28.1"
    env PYTHONPATH="$HVD_DIR/deps:$PYTHONPATH" MAKEFLAGS="-j$HOROVOD_JOBS" \
        CXXFLAGS="-include cstdint -include string -include stdexcept -include memory -include limits -include functional -include algorithm" \
        HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME="$nccl" HOROVOD_NCCL_LINK=SHARED \
        HOROVOD_BUILD_CUDA_CC_LIST=90 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1 \
        HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        CMAKE_POLICY_VERSION_MINIMUM=3.5 \
        "$PY" -m pip wheel --no-build-isolation --no-deps -w "$HVD_DIR/wheel" .
    ls -la "$HVD_DIR"/wheel/horovod-*.whl
}

stage_build() {
    if [[ $DEVICE == cpu ]]; then
        echo "dry run: no build; the extension already built in gtopk_hvd/ is used"
    elif [[ ${GPU_CHECK_PREBUILT:-0} == 1 ]] &&
            "$PY" -c "from gtopk_hvd import ops; assert ops.cuda_built" 2>&1; then
        echo "GPU_CHECK_PREBUILT=1: the carried extension imports with its CUDA kernels; no build"
    else
        # this GPU's architecture only (CMake's default builds two, which doubles the build)
        local arch
        arch="$("$PY" -c "import torch; print('%d%d-real' % torch.cuda.get_device_capability())" \
            2>/dev/null)" || arch=""
        export CUDAARCHS="${CUDAARCHS:-$arch}"
        echo "CUDAARCHS=${CUDAARCHS:-unset, the CMake default}"
        if ! GTOPK_BUILD_JOBS=$JOBS "$PY" -m pip install --no-build-isolation --no-deps -e .; then
            echo "pip install -e . failed; trying setup.py build_ext --inplace"
            GTOPK_BUILD_JOBS=$JOBS "$PY" setup.py build_ext --inplace || return
        fi
    fi
    "$PY" scripts/gpu/gpu_machine.py build "$FIG/build.json"
}

e2e_arguments() {  # name of the JSON file: gpu_e2e.py's arguments for this device mode
    local extra=()
    read -r -a extra <<<"${GPU_CHECK_E2E_ARGS:-}"
    if [[ $DEVICE == cpu ]]; then
        echo --device cpu --model tiny --batch 8 --steps 3 --warmup 1 --syncs "${extra[@]}" \
            --json "$FIG/$1"
    else
        echo --syncs --rounds 5 --steps 6 "${extra[@]}" --json "$FIG/$1"
    fi
}

stage_ddp_e2e() {
    local arguments=()
    read -r -a arguments <<<"$(e2e_arguments e2e.json)"
    "$PY" scripts/gpu/gpu_e2e.py "${arguments[@]}" --trace dense gtopk-0.001
    ls -l "$FIG"/trace_*.json.gz 2>/dev/null || true  # one float32 step each, under 8 MB
}

stage_baseline() {
    local baseline=${GPU_CHECK_BASELINE:-} arguments=() built
    if [[ -z $baseline || ! -d $baseline/gtopk_hvd ]]; then
        echo "no GPU_CHECK_BASELINE folder with a gtopk_hvd/ in it: nothing to compare with"
        return 99
    fi
    built=$("$PY" -c "import gtopk_hvd._C as c; print(c.__file__)") || return
    cp "$built" "$baseline/gtopk_hvd/" || return
    read -r -a arguments <<<"$(e2e_arguments e2e_baseline.json)"
    cd "$baseline" || return  # so that neither the working directory nor an editable install
    export PYTHONPATH="$baseline"  # of this tree comes before the baseline's package
    "$PY" -c "import gtopk_hvd, sys; print('baseline package:', gtopk_hvd.__file__)
sys.exit(not gtopk_hvd.__file__.startswith('$baseline'))" || return
    "$PY" "$REPO_ROOT/scripts/gpu/gpu_e2e.py" "${arguments[@]}" || return
    read -r -a arguments <<<"$(step_arguments step_baseline.json)"
    [[ $DEVICE == cuda ]] && arguments+=(--sizes 25.6e6)
    "$PY" "$REPO_ROOT/scripts/gpu/gpu_step.py" "${arguments[@]}" --no-granularity
}

step_arguments() {  # name of the JSON file: gpu_step.py's arguments for this device mode
    if [[ $DEVICE == cpu ]]; then
        echo --device cpu --sizes 2e5 --steps 2 --json "$FIG/$1"
    else
        echo --steps "$STEP_REPEATS" --json "$FIG/$1"
    fi
}

stage_step_memory() {
    local arguments=()
    read -r -a arguments <<<"$(step_arguments step.json)"
    "$PY" scripts/gpu/gpu_step.py "${arguments[@]}"
}

stage_profile() {
    if [[ $DEVICE == cpu ]]; then
        "$PY" scripts/gpu/gpu_profile.py --device cpu --topk-d 2e5 --step-d 2e5 --repeats 2 \
            --json "$FIG/profile.json"
    else
        "$PY" scripts/gpu/gpu_profile.py --json "$FIG/profile.json"
    fi
}

stage_bench_memory() {
    if ! "$PY" -m gtopk_hvd.bench memory -h >"$FIG/logs/bench_memory_help.txt" 2>&1; then
        echo "python -m gtopk_hvd.bench memory is not in this tree; the peak memory per scheme is step_memory's"
        return 99
    fi
    local args=(--states cuda)  # the host states are measured on the development machine
    [[ $DEVICE == cpu ]] && args=(--states numpy --parameters 200000 --steps 2)
    grep -q -- '--json' "$FIG/logs/bench_memory_help.txt" && args+=(--json "$FIG/bench_memory.json")
    "$PY" -m gtopk_hvd.bench memory "${args[@]}"
}

stage_bench_topk() {
    if [[ $DEVICE == cpu ]]; then
        "$PY" -m gtopk_hvd.bench topk --device cpu --sizes 1e5 --densities 0.001 --json "$FIG/topk.json"
    else
        "$PY" -m gtopk_hvd.bench topk --device cuda --sizes 1e7 1e8 1e9 --densities 0.001 0.01 \
            --json "$FIG/topk.json"
    fi
}

stage_bench_select() {
    if [[ $DEVICE == cpu ]]; then
        "$PY" -m gtopk_hvd.bench select --device cpu --sizes 1e5 --workers 1 --json "$FIG/select.json"
    else
        "$PY" -m gtopk_hvd.bench select --device cuda --sizes 25.6e6 1e8 --workers 1 16 \
            --json "$FIG/select.json"
    fi
}

stage_horovod_run() {
    if [[ $DEVICE == cpu ]]; then
        if ! "$PY" -c "import horovod.torch" 2>/dev/null; then
            echo "dry run: no Horovod in this Python"
            return 99
        fi
        "$PY" scripts/gpu/gpu_horovod.py --device cpu --model tiny --batch 8 --warmup 1 --steps 2 \
            --amp-steps 12 --json "$FIG/horovod.json"
        return
    fi
    local wheels=("$HVD_DIR"/wheel/horovod-*.whl) wheel nccl
    wheel=${wheels[0]}
    if [[ ! -f $wheel ]]; then
        echo "no Horovod wheel: the horovod_build stage made none (its log: logs/horovod_build.log)"
        return 1
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$HVD_DIR/site" "$wheel" || return
    nccl=$(nccl_home)
    PYTHONPATH="$HVD_DIR/site:$HVD_DIR/deps:$PYTHONPATH" LD_LIBRARY_PATH="$nccl/lib:${LD_LIBRARY_PATH:-}" \
        "$PY" scripts/gpu/gpu_horovod.py --json "$FIG/horovod.json"
}

stage_tests() {
    local files=(tests/ops/test_ops_cuda.py tests/torch/test_ddp_hook_cuda.py
                 tests/reductions/test_device_reduction.py tests/ops/test_count_sketch.py
                 tests/core/test_sparse_state_devices.py tests/ops/test_shared_types.py
                 tests/ops/test_ops.py tests/core/test_union_tensors.py
                 tests/ops/test_threshold_device_path.py tests/core/test_lockstep.py)
    local workers=$(( JOBS > 2 ? JOBS - 2 : 1 ))
    (( workers > 14 )) && workers=14
    local args=(-q -rfE -p no:cacheprovider)
    [[ $DEVICE == cpu ]] && files=(tests/ops/test_shared_types.py)
    "$PY" -c "import xdist" 2>/dev/null && args+=(-n "$workers")
    # worksteal (xdist >= 3.2) rebalances the long full-sort references between workers
    "$PY" -c "import sys, xdist; sys.exit(tuple(map(int, xdist.__version__.split('.')[:2])) < (3, 2))" \
        2>/dev/null && args+=(--dist worksteal)
    # A test blocked in native code (a CUDA or collective call) never returns to Python, where
    # pytest-timeout's default signal would act: faulthandler's watchdog prints every thread's
    # stack at 60 s, and pytest-timeout's thread method ends that worker at 90 s (the test then
    # fails, named), so the stage goes on.
    args+=(-o faulthandler_timeout=60)
    "$PY" -c "import pytest_timeout" 2>/dev/null && args+=(--timeout 90 --timeout-method thread)
    # the full-sort references at d = 2^24 (25-47 s each on an H100) passed on the first GPU run;
    # smaller sizes test the same kernels: GPU_CHECK_FULL_TESTS=1 runs them too
    local filter="not 16777216"
    [[ ${GPU_CHECK_FULL_TESTS:-0} == 1 ]] && filter=""
    if [[ -n ${GPU_CHECK_TEST_K:-} ]]; then
        filter="${filter:+($filter) and }(${GPU_CHECK_TEST_K})"
    fi
    [[ -n $filter ]] && args+=(-k "$filter")
    [[ -n ${GPU_CHECK_TEST_FILES:-} ]] && read -r -a files <<<"$GPU_CHECK_TEST_FILES"
    rm -f "$FIG/test_figures.jsonl"  # what tests measure on the GPU (tests/helpers/figures.py)
    GTOPK_TEST_FIGURES="$FIG/test_figures.jsonl" "$PY" -m pytest "${args[@]}" "${files[@]}"
}

export -f stage_machine nccl_home stage_horovod_build stage_build e2e_arguments stage_ddp_e2e \
    stage_baseline step_arguments \
    stage_step_memory stage_profile stage_bench_memory stage_bench_topk stage_bench_select stage_horovod_run \
    stage_tests

# -- the background Horovod build --------------------------------------------------------------

OVERLAP_NOTE="Horovod was not built in this run"
HVD_PID=""
HVD_BEGAN=$SECONDS
start_horovod_build() {
    wanted horovod_build || return 0
    OVERLAP_NOTE="Horovod builds in the background (nice 19, make -j$HOROVOD_JOBS) from t = $(elapsed) s while the stages before horovod_run run; its duration is in the stages table"
    HVD_BEGAN=$SECONDS
    echo "== [$(elapsed) s] horovod_build started in the background (log: logs/horovod_build.log)"
    ( nice -n 19 timeout -k 20 $((BUDGET - 120)) bash -c stage_horovod_build \
        >"$FIG/logs/horovod_build.log" 2>&1
      echo $? >"$HVD_DIR/build.rc" ) &
    HVD_PID=$!
}

finish_horovod_build() {
    wanted horovod_build || return 0
    [[ -n $HVD_PID ]] || return 0
    while [[ ! -f $HVD_DIR/build.rc ]] && (( $(remaining) > 30 )); do sleep 2; done
    local rc status
    if [[ -f $HVD_DIR/build.rc ]]; then
        rc=$(cat "$HVD_DIR/build.rc")
        case $rc in 0) status=ok ;; 99) status=skipped ;; 124|137) status=timeout ;; *) status=failed ;; esac
    else
        rc=""; status=timeout
        kill -- "$HVD_PID" 2>/dev/null
    fi
    wait "$HVD_PID" 2>/dev/null
    record_stage horovod_build "$status" "$rc" $((SECONDS - HVD_BEGAN)) $((BUDGET - 120)) \
        "$(last_line horovod_build)"
    echo "== [$(elapsed) s] horovod_build -> $status (exit $rc, $((SECONDS - HVD_BEGAN)) s)"
    write_report
}

# -- the run -------------------------------------------------------------------------------

echo "gpu_check: device mode $DEVICE, budget $BUDGET s, report in $OUT_DIR, work in $BASE"
run_stage machine 30 bash -c stage_machine
start_horovod_build
run_stage build 240 bash -c stage_build
run_stage tests "${GPU_CHECK_TESTS_BOX_S:-180}" --signal INT bash -c stage_tests
run_stage ddp_e2e 150 bash -c stage_ddp_e2e
run_stage step_memory 100 bash -c stage_step_memory
run_stage baseline 170 bash -c stage_baseline
run_stage profile 60 bash -c stage_profile
run_stage bench_topk 40 bash -c stage_bench_topk
run_stage bench_select 30 bash -c stage_bench_select
run_stage bench_memory 30 bash -c stage_bench_memory
finish_horovod_build
run_stage horovod_run 120 bash -c stage_horovod_run
write_report
echo "gpu_check: done in $(elapsed) s; report: $OUT_DIR/gpu_report.md"
grep -E '^Targets:' "$OUT_DIR/gpu_report.md" || true
