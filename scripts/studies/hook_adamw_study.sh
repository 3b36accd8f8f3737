#!/usr/bin/env bash
# AdamW's frozen second moment through the DDP hook (examples/ddp_transformer.py, torchrun)
# against the torch DistributedOptimizer (examples/pytorch_transformer.py, mpirun) and dense
# DDP, on docs/adamw.md's study configuration (scripts/studies/adamw_study.sh's model, corpus and
# schedule; global batch 32 split over WORKERS), one epoch. Each run's RESULT line goes to
# $OUT/<name>.result, its history to $OUT/<name>.json; a finished run is not run again.
#     WORKERS=4 bash scripts/studies/hook_adamw_study.sh [OUT]       (default results/hook_adamw)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${1:-results/hook_adamw}"
WORKERS="${WORKERS:-4}"
STEPS="${STEPS:-507}"
mkdir -p "$OUT"
COMMON=(--batch-size $((32 / WORKERS)) --vocab-size 5000 --size 128 --layers 2 --heads 4
        --bptt 64 --max-steps "$STEPS" --eval-every 100 --warmup-steps 50 --lr 2e-3
        --seed "${SEED:-42}" --quiet)
export OMP_NUM_THREADS=1 PYTHONPATH="$PWD/tests"
run() {  # name, launcher (torchrun|mpirun), example, then the run's own options
    local name="$1-p$WORKERS" launcher=$2 example=$3; shift 3
    [[ -f $OUT/$name.result ]] && return 0
    if [[ $launcher == torchrun ]]; then
        command=(.venv/bin/torchrun --standalone --nproc_per_node "$WORKERS" "$example")
    else
        command=(mpirun --allow-run-as-root --oversubscribe -np "$WORKERS" -x OMP_NUM_THREADS
                 -x PYTHONPATH .venv/bin/python "$example")
    fi
    "${command[@]}" "${COMMON[@]}" "$@" --history "$OUT/$name.json" | grep RESULT \
        | tee "$OUT/$name.result.tmp"
    mv "$OUT/$name.result.tmp" "$OUT/$name.result"
}
run ddp-dense torchrun examples/ddp_transformer.py --compression none
for scheme in topk gtopk; do
    run "hook-$scheme-0.01-gradient" torchrun examples/ddp_transformer.py \
        --compression "$scheme" --density 0.01 --sparsify gradient
    run "hook-$scheme-0.01-preconditioned-dense100" torchrun examples/ddp_transformer.py \
        --compression "$scheme" --density 0.01 --sparsify preconditioned --dense-steps 100
    run "optimizer-$scheme-0.01-preconditioned-dense100" mpirun examples/pytorch_transformer.py \
        --compression "$scheme" --density 0.01 --sparsify preconditioned --dense-steps 100
done
