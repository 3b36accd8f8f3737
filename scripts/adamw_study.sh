#!/usr/bin/env bash
# AdamW on sparse updates, measured: the GPT-style decoder (examples/pytorch_transformer.py) in
# the simulated cluster, dense AdamW against each sparse scheme with the gradient sparsified
# before AdamW (--sparsify gradient, what the optimizers do) and with each worker's own AdamW
# step sparsified instead (--sparsify update). One history JSON per run under results/adamw/
# (or $1), then the table (scripts/adamw_table.py). --sparsify preconditioned: the gradient
# divided by AdamW's second moment, frozen after 50 dense steps. Sequential: 4 to 11 minutes a
# run on one core at the sizes below (P = 8); ONLY=<name> runs one; WORKERS=32 (names end in
# -p32) runs the grid at P = 32, GRID=p32 only the cells that decide there. SEED=<n> sets the
# seed (default 42, the example's); put another seed's runs in their own folder ($1), as the
# planner reads one dense run per P from a folder.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-results/adamw}"
WORKERS="${WORKERS:-8}"
STEPS="${STEPS:-600}"
mkdir -p "$OUT"
COMMON=(--workers "$WORKERS" --global-batch 32 --vocab-size 5000 --size 128 --layers 2
        --heads 4 --bptt 64 --max-steps "$STEPS" --eval-every 100 --warmup-steps 50
        --lr 2e-3 --seed "${SEED:-42}" --quiet)
SUFFIX=""; [[ $WORKERS != 8 ]] && SUFFIX="-p$WORKERS"
run() {  # name, then the run's own options
    local name=$1$SUFFIX; shift
    [[ -f $OUT/$name.json ]] && return 0
    [[ -n ${ONLY:-} && $ONLY != "$name" ]] && return 0
    .venv/bin/python examples/simulated_cluster.py transformer "${COMMON[@]}" "$@" \
        --history "$OUT/$name.json.tmp" | grep RESULT | tee "$OUT/$name.result"
    mv "$OUT/$name.json.tmp" "$OUT/$name.json"
}
run dense --compression none
if [[ ${GRID:-} == p32 ]]; then
    for scheme in topk oktopk gtopk; do
        run "$scheme-0.01-preconditioned-dense100" --compression "$scheme" --density 0.01 \
            --sparsify preconditioned --dense-steps 100
    done
    for scheme in topk oktopk; do
        run "$scheme-0.01-preconditioned-dense100-epochs2" --compression "$scheme" \
            --density 0.01 --sparsify preconditioned --dense-steps 100 --epochs 2 --max-steps 1014
    done
    run topk-0.01-gradient --compression topk --density 0.01 --sparsify gradient
    # Fewer bytes than Top-k 0.01 with more entries: Ok-Topk at 5x the density (2.5x fewer
    # bytes), exact gTop-k at Top-k 0.01's bytes (5.2x its k at P = 32).
    run oktopk-0.05-preconditioned-dense100-epochs2 --compression oktopk --density 0.05 \
        --sparsify preconditioned --dense-steps 100 --epochs 2 --max-steps 1014
    run gtopk-exact-0.052-preconditioned-dense100-epochs2 --compression gtopk-exact \
        --density 0.052 --sparsify preconditioned --dense-steps 100 --epochs 2 --max-steps 1014
    # The dense start's share of the time: 25 and 50 dense steps (the learning-rate warm-up's
    # half and whole); fewer bytes: Ok-Topk at 0.03.
    for dense in 25 50; do
        run "oktopk-0.05-preconditioned-dense$dense-epochs2" --compression oktopk --density 0.05 \
            --sparsify preconditioned --dense-steps "$dense" --epochs 2 --max-steps 1014
    done
    for dense in 50 100; do
        run "oktopk-0.03-preconditioned-dense$dense-epochs2" --compression oktopk --density 0.03 \
            --sparsify preconditioned --dense-steps "$dense" --epochs 2 --max-steps 1014
    done
    run topk-0.01-preconditioned-dense50-epochs2 --compression topk --density 0.01 \
        --sparsify preconditioned --dense-steps 50 --epochs 2 --max-steps 1014
    # The schedule's length: the cosine over 800 or 700 steps instead of two epochs' 1,014.
    for steps in 800 700; do
        run "oktopk-0.05-preconditioned-dense50-steps$steps" --compression oktopk --density 0.05 \
            --sparsify preconditioned --dense-steps 50 --epochs 2 --max-steps "$steps"
    done
    # AdamW's first moment in the exchange (--momentum-correction), with DGC's masking of the
    # velocity where sent, and without it (1-bit Adam's unbroken momentum).
    for density in 0.05 0.01; do
        run "oktopk-$density-preconditioned-momentum-dense100-epochs2" --compression oktopk \
            --density "$density" --sparsify preconditioned --momentum-correction \
            --dense-steps 100 --epochs 2 --max-steps 1014
        run "oktopk-$density-preconditioned-momentum-unmasked-dense100-epochs2" \
            --compression oktopk --density "$density" --sparsify preconditioned \
            --momentum-correction --no-momentum-masking --dense-steps 100 --epochs 2 \
            --max-steps 1014
    done
    exit 0
fi
for density in 0.01 0.001; do
    for sparsify in gradient update preconditioned; do
        run "gtopk-$density-$sparsify" --compression gtopk --density "$density" --sparsify "$sparsify"
    done
done
for sparsify in gradient update preconditioned; do
    run "topk-0.01-$sparsify" --compression topk --density 0.01 --sparsify "$sparsify"
done
run topk-0.001-preconditioned --compression topk --density 0.001 --sparsify preconditioned
for density in 0.01 0.001; do
    run "oktopk-$density-preconditioned" --compression oktopk --density "$density" \
        --sparsify preconditioned
done
# What the preconditioned rule's settings do: a longer dense start, twice the learning rate.
for dense in 100 150; do
    run "topk-0.01-preconditioned-dense$dense" --compression topk --density 0.01 \
        --sparsify preconditioned --dense-steps "$dense"
done
run topk-0.01-preconditioned-dense100-lr4e-3 --compression topk --density 0.01 \
    --sparsify preconditioned --dense-steps 100 --lr 4e-3
# Longer: two epochs (the schedule over 1,014 steps), to see whether it reaches dense's final.
for scheme in topk oktopk; do
    run "$scheme-0.01-preconditioned-dense100-epochs2" --compression "$scheme" --density 0.01 \
        --sparsify preconditioned --dense-steps 100 --epochs 2 --max-steps 1014
done
