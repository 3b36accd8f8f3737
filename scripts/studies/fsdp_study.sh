#!/usr/bin/env bash
# The transformer with AdamW under FSDP2 (examples/fsdp_transformer.py, torchrun): FSDP's own
# reduce-scatter against the sparse one at density 0.01 (AdamW on the sparse gradient; Adam's
# second moment frozen after 100 dense steps, each worker clipping its own gradient unit by
# unit, with a float32 and a bfloat16 residual), on scripts/studies/hook_adamw_study.sh's configuration
# (global batch 32 over WORKERS, one epoch), so the figures sit beside the DDP hook's; then
# FSDP's and the frozen sparse run over two and three epochs (each its own cosine schedule). Each run's RESULT line goes to $OUT/<name>.result, its
# history to $OUT/<name>.json; a finished run is not run again.
#     WORKERS=4 bash scripts/studies/fsdp_study.sh [OUT]       (default results/fsdp)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${1:-results/fsdp}"
WORKERS="${WORKERS:-4}"
STEPS="${STEPS:-507}"
DENSITY="${DENSITY:-0.01}"
mkdir -p "$OUT"
COMMON=(--batch-size $((32 / WORKERS)) --vocab-size 5000 --size 128 --layers 2 --heads 4
        --bptt 64 --max-steps "$STEPS" --eval-every 100 --warmup-steps 50 --lr 2e-3
        --seed "${SEED:-42}" --quiet)
export OMP_NUM_THREADS=1 PYTHONPATH="$PWD/tests"
run() {  # name, then the run's own options
    local name="$1-p$WORKERS"; shift
    [[ -f $OUT/$name.result ]] && return 0
    .venv/bin/torchrun --standalone --nproc_per_node "$WORKERS" examples/fsdp_transformer.py \
        "${COMMON[@]}" "$@" --history "$OUT/$name.json" | grep RESULT | tee "$OUT/$name.result.tmp"
    mv "$OUT/$name.result.tmp" "$OUT/$name.result"
}
run fsdp-dense --compression none
run "sparse-$DENSITY-preconditioned-dense100" --compression topk --density "$DENSITY" \
    --sparsify preconditioned --dense-steps 100
run "sparse-$DENSITY-gradient" --compression topk --density "$DENSITY" --sparsify gradient
run "sparse-$DENSITY-preconditioned-dense100-bf16residual" --compression topk \
    --density "$DENSITY" --sparsify preconditioned --dense-steps 100 --residual-dtype bfloat16
for epochs in 2 3; do  # later options win: the run's length and schedule
    LONGER=(--epochs "$epochs" --max-steps 0)
    run "fsdp-dense-${epochs}epochs" --compression none "${LONGER[@]}"
    run "sparse-$DENSITY-preconditioned-dense100-${epochs}epochs" --compression topk \
        --density "$DENSITY" --sparsify preconditioned --dense-steps 100 "${LONGER[@]}"
done
