#!/usr/bin/env bash
# AdamW on sparse updates, measured: the GPT-style decoder (examples/pytorch_transformer.py) in
# the simulated cluster, dense AdamW against each sparse scheme with the gradient sparsified
# before AdamW (--sparsify gradient, what the optimizers do) and with each worker's own AdamW
# step sparsified instead (--sparsify update). One history JSON per run under results/adamw/
# (or $1), then the table (scripts/studies/adamw_table.py). --sparsify preconditioned: the gradient
# divided by AdamW's second moment, frozen after 50 dense steps. Sequential: 4 to 11 minutes a
# run on one core at the sizes below (P = 8); ONLY=<name> runs one; WORKERS=32 (names end in
# -p32) runs the grid at P = 32, GRID=p32 only the cells that decide there. SEED=<n> sets the
# seed (default 42, the example's); put another seed's runs in their own folder ($1), as the
# planner reads one dense run per P from a folder.
# GRID=per-worker: at PER_WORKER sequences a worker (default 8; the global batch grows with P),
# two epochs for every run, dense swept over LRS (default 2e-3 4e-3) and the cells that decide
# at that rate (LR, default the sweep's best): DDP's bf16 and PowerSGD, Top-k 0.01, Ok-Topk 0.01
# and 0.05 with the frozen variance, and over four epochs the best two (P = 8: Ok-Topk 0.05 and
# PowerSGD rank 4; other P: Top-k 0.01 and PowerSGD rank 4; default folder
# results/adamw/per_worker<PER_WORKER>).
set -euo pipefail
cd "$(dirname "$0")/../.."
PER_WORKER="${PER_WORKER:-8}"
if [[ ${GRID:-} == per-worker ]]; then
    OUT="${1:-results/adamw/per_worker$PER_WORKER}"
else
    OUT="${1:-results/adamw}"
fi
WORKERS="${WORKERS:-8}"
STEPS="${STEPS:-600}"
mkdir -p "$OUT"
COMMON=(--workers "$WORKERS" --global-batch 32 --vocab-size 5000 --size 128 --layers 2
        --heads 4 --bptt 64 --max-steps "$STEPS" --eval-every 100 --warmup-steps 50
        --lr 2e-3 --seed "${SEED:-42}" --quiet)
SUFFIX=""; [[ $WORKERS != 8 ]] && SUFFIX="-p$WORKERS"
if [[ ${GRID:-} == per-worker ]]; then  # later options win: the batch, epochs and rate
    COMMON+=(--global-batch "$((PER_WORKER * WORKERS))" --epochs 2 --max-steps 0
             --eval-every 50)
    SUFFIX="-p$WORKERS"
fi
run() {  # name, then the run's own options; into $DIR (default $OUT)
    local name=$1$SUFFIX dir=${DIR:-$OUT}; shift
    [[ -f $dir/$name.json ]] && return 0
    [[ -n ${ONLY:-} && $ONLY != "$name" ]] && return 0
    .venv/bin/python examples/simulated_cluster.py transformer "${COMMON[@]}" "$@" \
        --history "$dir/$name.json.tmp" | grep RESULT | tee "$dir/$name.result"
    mv "$dir/$name.json.tmp" "$dir/$name.json"
}
final() {  # the last validation perplexity of a run's history
    .venv/bin/python -c "import json, sys; print(json.load(open(sys.argv[1]))['evaluations'][-1]['valid_perplexity'])" "$1"
}
if [[ ${GRID:-} == per-worker ]]; then
    mkdir -p "$OUT/sweep"  # the sweep's own folder: the planner reads one dense run per P
    for lr in ${LRS:-2e-3 4e-3}; do
        DIR="$OUT/sweep" run "dense-lr$lr" --compression none --lr "$lr"
    done
    if [[ -z ${LR:-} ]]; then
        LR=$(for lr in ${LRS:-2e-3 4e-3}; do
                 echo "$(final "$OUT/sweep/dense-lr$lr$SUFFIX.json") $lr"; done | sort -g |
             head -1 | cut -d' ' -f2)
    fi
    echo "learning rate: $LR"
    COMMON+=(--lr "$LR")
    [[ -f $OUT/dense$SUFFIX.json ]] || cp "$OUT/sweep/dense-lr$LR$SUFFIX.json" "$OUT/dense$SUFFIX.json"
    run topk-0.01-preconditioned-dense100 --compression topk --density 0.01 \
        --sparsify preconditioned --dense-steps 100
    run oktopk-0.05-preconditioned-dense50 --compression oktopk --density 0.05 \
        --sparsify preconditioned --dense-steps 50
    run bf16 --compression none --baseline bf16
    run powersgd-r2 --compression none --baseline powersgd --powersgd-rank 2
    run oktopk-0.01-preconditioned-dense100 --compression oktopk --density 0.01 \
        --sparsify preconditioned --dense-steps 100
    run powersgd-r1 --compression none --baseline powersgd --powersgd-rank 1
    run powersgd-r4 --compression none --baseline powersgd --powersgd-rank 4
    if [[ $WORKERS == 8 ]]; then  # twice the epochs: do the two best reach dense's final?
        run oktopk-0.05-preconditioned-dense50-epochs4 --compression oktopk --density 0.05 \
            --sparsify preconditioned --dense-steps 50 --epochs 4
        run powersgd-r4-epochs4 --compression none --baseline powersgd --powersgd-rank 4 \
            --epochs 4
    else  # P = 32: the closest sparse run and PowerSGD rank 4, over four epochs
        run topk-0.01-preconditioned-dense100-epochs4 --compression topk --density 0.01 \
            --sparsify preconditioned --dense-steps 100 --epochs 4
        run powersgd-r4-epochs4 --compression none --baseline powersgd --powersgd-rank 4 \
            --epochs 4
    fi
    exit 0
fi
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
