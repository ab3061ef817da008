#!/usr/bin/env bash
# Download, here (where the package registries are reachable), the wheels perf/gpu_check.sh installs on a GPU
# machine that has PyTorch, transformers, accelerate, peft, numpy, pandas, pyarrow and no network (the lent H200:
# Python 3.12, x86-64). Writes .whl/ at the repository root (git-ignored); carry it with the check.
# Versions: the ones pobench is tested with (pip list of the project's environment); --no-deps, so each wheel a
# package needs at import time is named here, and the check's first step imports them all.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(
  trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
  mlflow==3.17.2 mlflow-skinny==3.17.2 mlflow-tracing==3.17.2 alembic==1.20.1 SQLAlchemy==2.1.9 Mako==1.4.3
  sqlparse==0.6.1 cachetools==7.3.3 databricks-sdk==0.167.0 google-auth==2.63.0 pyasn1==0.6.3 pyasn1_modules==0.4.2
  rsa==4.7.2 fastapi==0.165.0 starlette==1.10.0 pydantic==2.13.4 pydantic_core==2.46.4 annotated-types==0.7.0
  typing-inspection==0.4.2 opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-proto==1.45.2
  opentelemetry-semantic-conventions==0.66b2 importlib_metadata==9.1.0 python-dotenv==1.2.2 GitPython==3.2.1
  gitdb==4.0.12 smmap==5.0.3 graphene==3.4.3 graphql-core==3.2.8 graphql-relay==3.2.0 uvicorn==0.55.0
  sniffio==1.3.1 protobuf==7.36.2 filelock==4.3.1
)
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
du -sh .whl
