"""Fault injection: many elastic runs, each with one worker or node killed (SIGKILL) at a random
step and place, under Elastic Horovod and under torchrun's restarts.

    python scripts/studies/faults.py --trials 24 --out results/faults

Trial i (seed + i picks its step, place and victim) alternates the launchers:

- horovodrun --gloo, 4 one-slot hosts (localhost, 127.0.0.1, the host name, its address),
  --min-np 3 --max-np 4, blacklist cooldown 1-2 s: `examples/elastic_torch.py`, a random worker
  killed at a random step, either after its backward pass (the others are inside the sparse
  step: "reduction") or instead of its commit (the others are inside `state.commit()`);
- horovodrun-keras (only when asked, `--launchers`): the same with `examples/elastic_keras.py`
  (model.fit, gtopk_hvd's KerasState; TF_USE_LEGACY_KERAS from the environment picks tf-keras);
- torchrun, two nodes of 2 workers (c10d rendezvous on loopback, --nnodes 1:2): the second
  node's `examples/elastic_ddp.py` dies (agent and worker) at a random step, after the
  optimizer's step ("step"), inside backward ("reduction": the others are inside the hook's
  sparse reductions) or inside a checkpoint's commit ("commit").

Each trial ends as "recovered" (the job exits 0 and prints its RESULT line, which the example
prints only after every worker checked that the replicas are identical), "error" (a non-zero
exit) or "hung" (past --timeout, killed). Also recorded: the steps done again (the step the
victim died at minus the step the survivors resumed from) and the seconds from the kill to the
first step after it. Writes <out>/trials.csv and <out>/summary.md (the table by launcher and
place).
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
QUIET = {"OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3",
         "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # pytorch/pytorch#135712
PLACES = {"horovodrun": ("reduction", "commit"), "horovodrun-keras": ("reduction", "commit"),
          "torchrun": ("step", "reduction", "commit")}
EXAMPLES = {"horovodrun": "elastic_torch.py", "horovodrun-keras": "elastic_keras.py"}


@dataclass
class Trial:
    trial: int
    launcher: str
    place: str
    victim: int  # horovodrun: the rank killed; torchrun: the node (1: the second one)
    kill_at: int
    outcome: str = ""
    final_workers: int = 0
    steps_redone: int = -1
    recovery_s: float = -1.0
    seconds: float = 0.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=40, help="steps of each run")
    parser.add_argument("--timeout", type=float, default=300, help="seconds before 'hung'")
    parser.add_argument("--launchers", nargs="+", choices=list(PLACES),
                        default=["horovodrun", "torchrun"], help="trials alternate these")
    parser.add_argument("--out", type=Path, default=REPO / "results" / "faults")
    return parser.parse_args()


def local_hosts() -> list[str]:
    names = ["localhost", "127.0.0.1", socket.gethostname()]
    names += [a for a in subprocess.run(["hostname", "-I"], capture_output=True,
                                        text=True).stdout.split() if ":" not in a][:1]
    return list(dict.fromkeys(names))[:4]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(command: list[str], log: Path) -> subprocess.Popen:
    with log.open("w") as sink:
        return subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT,
                                env={**os.environ, **QUIET}, start_new_session=True)


def finish(processes: list[subprocess.Popen], deadline: float, workdir: Path) -> int | None:
    """The first process's exit status, None past the deadline; then every process of the
    trial is gone (torchrun's workers live in sessions of their own: killed by their paths)."""
    status = None
    try:
        status = processes[0].wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    subprocess.run(["pkill", "-9", "-f", str(workdir)], check=False)
    return status


def run_horovod(trial: Trial, steps: int, workdir: Path, deadline: float) -> str:
    hosts = local_hosts()
    if len(hosts) < 4:
        raise SystemExit(f"needs 4 local host names, this machine has {hosts}")
    discovery = workdir / "hosts.sh"
    discovery.write_text("#!/bin/sh\n" + "".join(f"echo {host}:1\n" for host in hosts))
    discovery.chmod(0o755)
    command = [str(BIN / "horovodrun"), "--gloo", "-np", "4", "--min-np", "3", "--max-np", "4",
               "--host-discovery-script", str(discovery), "--blacklist-cooldown-range", "1", "2",
               sys.executable, str(REPO / "examples" / EXAMPLES[trial.launcher]),
               "--steps", str(steps), "--compute-ms", "50", "--marker", str(workdir / "killed"),
               "--kill-rank", str(trial.victim), "--kill-at", str(trial.kill_at),
               "--kill-phase", trial.place]
    log = workdir / "horovodrun.log"
    status = finish([start(command, log)], deadline, workdir)
    return classify(trial, status, log.read_text())


def run_torchrun(trial: Trial, steps: int, workdir: Path, deadline: float) -> str:
    port = free_port()
    common = [str(BIN / "torchrun"), "--nnodes", "1:2", "--nproc_per_node", "2",
              "--max-restarts", "5", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"faults{port}",
              "--rdzv-conf", "last_call_timeout=2,join_timeout=60",
              str(REPO / "examples" / "elastic_ddp.py"), "--checkpoints", str(workdir / "ckpt"),
              "--steps", str(steps), "--compute-ms", "50", "--marker", str(workdir / "killed")]
    survivor = start(common, workdir / "survivor.log")
    time.sleep(1)  # the survivor hosts the rendezvous
    doomed = start([*common, "--die-at", str(trial.kill_at), "--die-phase", trial.place],
                   workdir / "doomed.log")
    status = finish([survivor, doomed], deadline, workdir)
    return classify(trial, status, (workdir / "survivor.log").read_text())


def classify(trial: Trial, status: int | None, output: str) -> str:
    """Fills the trial's outcome and measurements from the surviving rank 0's output."""
    result = re.search(r"RESULT \S+ .*workers=(\d+)", output)
    trial.outcome = ("hung" if status is None else
                     "recovered" if status == 0 and result else "error")
    if result:
        trial.final_workers = int(result.group(1))
    recovery = re.search(r"RECOVERY (?:rank=\d+|size \d+) seconds=([\d.]+)", output)
    if recovery:
        trial.recovery_s = float(recovery.group(1))
    printed = [int(s) for s in re.findall(r"^(?:\[\d+\]<stdout>:)?step (\d+) size", output,
                                          re.MULTILINE)]
    # The first time the step count goes back (or stays): the survivors resumed there.
    for before, after in zip(printed, printed[1:]):
        if after <= before:
            trial.steps_redone = before - (after - 1)
            break
    else:
        trial.steps_redone = 0 if trial.outcome == "recovered" else -1
    return output


def summary(trials: list[Trial]) -> str:
    lines = ["| launcher | place | faults | recovered | error | hung | replicas identical | "
             "steps redone (median, max) | kill to next step, s (median, max) |",
             "|---|---|---|---|---|---|---|---|---|"]
    groups = sorted({(t.launcher, t.place) for t in trials})
    for launcher, place in [*groups, ("all", "all")]:
        chosen = [t for t in trials if launcher in ("all", t.launcher)
                  and place in ("all", t.place)]
        recovered = [t for t in chosen if t.outcome == "recovered"]
        redone = [t.steps_redone for t in recovered]
        seconds = [t.recovery_s for t in recovered if t.recovery_s >= 0]
        lines.append(
            f"| {launcher} | {place} | {len(chosen)} | {len(recovered)} | "
            f"{sum(t.outcome == 'error' for t in chosen)} | "
            f"{sum(t.outcome == 'hung' for t in chosen)} | {len(recovered)} of {len(recovered)} | "
            f"{_median_max(redone, '{:g}')} | {_median_max(seconds, '{:.1f}')} |")
    return "\n".join(lines) + "\n"


def _median_max(values: list[float], form: str) -> str:
    if not values:
        return "-"
    return f"{form.format(statistics.median(values))}, {form.format(max(values))}"


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    trials = []
    for index in range(args.trials):
        rng = random.Random(args.seed + index)
        launcher = args.launchers[index % len(args.launchers)]
        trial = Trial(trial=index, launcher=launcher, place=rng.choice(PLACES[launcher]),
                      victim=1 if launcher == "torchrun" else rng.randrange(4),
                      kill_at=rng.randrange(3, args.steps - 10))
        began = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"faults{index}-") as workdir:
            runner = run_torchrun if launcher == "torchrun" else run_horovod
            output = runner(trial, args.steps, Path(workdir), began + args.timeout)
            if trial.outcome != "recovered":
                (args.out / f"trial-{index}.log").write_text(output[-20000:])
        trial.seconds = round(time.monotonic() - began, 1)
        trials.append(trial)
        print(" ".join(f"{k}={v}" for k, v in asdict(trial).items()), flush=True)
    with (args.out / "trials.csv").open("w", newline="") as sink:
        writer = csv.DictWriter(sink, fieldnames=list(asdict(trials[0])))
        writer.writeheader()
        writer.writerows(asdict(t) for t in trials)
    table = summary(trials)
    (args.out / "summary.md").write_text(
        f"# Fault injection: {len(trials)} trials (`python scripts/studies/faults.py --trials "
        f"{args.trials} --seed {args.seed} --steps {args.steps} --launchers "
        f"{' '.join(args.launchers)}`)\n\n{table}")
    print(table)


if __name__ == "__main__":
    main()
