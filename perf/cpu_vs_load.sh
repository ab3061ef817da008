#!/usr/bin/env bash
# How much the machine's load moves time/cpu_s and time/elapsed_s (docs/METRICS.md): the same 4-step `bench train`
# (grpo, built-in model, one torch thread) run alternately on the machine as it is and with one extra busy process
# per core, twice each; prints the last step's wall-clock and CPU seconds (and the CPU seconds of each step) and the
# mean sys/load_avg_1m of every run. About 1 minute of 2 cores.
#   bash perf/cpu_vs_load.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
tmp=$(mktemp -d)
uri="sqlite:///$tmp/mlflow.db"
run() {
  python -m bench.cli train --algo grpo --steps 4 --prompts-per-step 8 --group-size 4 --eval-every 0 \
    --samples-every 0 --checkpoint-every 0 --experiment load --run-name "$1" --output-dir "$tmp/runs" \
    --tracking-uri "$uri" > "$tmp/$1.log" 2>&1
}
for i in 1 2; do
  run "quiet$i"
  busy=()
  for _ in $(seq "$(nproc)"); do python3 -c 'while True: pass' & busy+=($!); done
  sleep 10  # (the load average catches up)
  run "loaded$i"
  kill "${busy[@]}"
  sleep 5
done
python - "$uri" <<'PY'
import sys

from mlflow import MlflowClient

client = MlflowClient(sys.argv[1])
exp = client.get_experiment_by_name("load")
for r in sorted(client.search_runs([exp.experiment_id]), key=lambda r: r.info.start_time):
    def series(key):
        return [v for _, v in sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, key))]
    cpu, wall, load = series("time/cpu_s"), series("time/elapsed_s"), series("sys/load_avg_1m")
    steps = [round(b - a, 2) for a, b in zip([0.0] + cpu, cpu)]
    print(f"{r.info.run_name:8s} wall {wall[-1]:6.2f} s  CPU {cpu[-1]:5.2f} s (steps {steps})  "
          f"mean load {sum(load) / len(load):.2f}")
PY
rm -rf "$tmp"
