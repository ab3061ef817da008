#!/usr/bin/env bash
# The GPU check of docs/SCALE.md, for one GPU with no network (the lent H200; about 5 minutes):
# installs the wheels carried in .whl/ (bash perf/gpu_wheels.sh downloads them) into /tmp/site, checks every
# import the check needs, then runs a few `tepo` steps of the native loop (HF engine, bf16; with and without the shared
# prefix) and of `--engine trl` on a randomly initialised model of the Qwen2.5-0.5B shape with ~512-token prompts and
# prints step seconds and tokens/s of each (later flags override: e.g. --shape 1.5b --prompt-tokens 0).
#   bash perf/gpu_check.sh [extra flags of perf/gpu_check.py]
# Results: gpu_check.json in $OUT (the device tool's output folder) or the current folder.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/site"   # after the machine's own packages: its torch / transformers win
fi
python3 - <<'PY'
import importlib, sys
missing = []
for name in ("torch", "transformers", "accelerate", "peft", "trl", "datasets", "mlflow", "sqlalchemy", "alembic",
             "yaml", "rich", "filelock", "bench.engines.native.loop", "bench.engines.trl.run"):
    try:
        importlib.import_module(name)
    except Exception as e:  # noqa: BLE001
        missing.append(f"{name}: {type(e).__name__}: {e}")
for name in ("torch", "transformers", "trl", "pyarrow"):
    m = sys.modules.get(name)
    print(f"{name} {getattr(m, '__version__', 'missing')}", end="; ")
print(f"cuda {sys.modules['torch'].cuda.is_available()}")
if missing:
    sys.exit("gpu_check: cannot import what the check needs (carry the wheels: bash perf/gpu_wheels.sh):\n  "
             + "\n  ".join(missing))
PY
# the Qwen2.5-0.5B shape, prompts of ~512 tokens (a few-shot prefix), shared prefix on / off, and TRL
python3 perf/gpu_check.py --shape 0.5b --prompt-tokens 512 --only full_chunked,full_unshared,trl_full --steps 3 \
  --out "${OUT:-.}/gpu_check.json" "$@"
