#!/usr/bin/env bash
# Creates the project's virtual environment in .venv (or $VENV) and installs jfa into it, editable.
#
# - On a machine whose python3 already has a CUDA build of torch and triton (the H200 box: torch 2.11+cu130,
#   triton 3.6.0, no network), the venv sees the system packages and nothing is downloaded or replaced.
# - Elsewhere (the CPU development and CI machines) it installs torch 2.13.0 (the CPU wheel) and
#   triton 3.6.0, the version the GPU machine has, plus the test and bench extras.
set -euo pipefail
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
if "$PY" -c "import sys, torch, triton; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "setup: CUDA torch found system-wide; making $VENV with system site packages"
  "$PY" -m venv --system-site-packages "$VENV"
  # python3 may itself be a venv (the H200 image's is /opt/torch/.venv): --system-site-packages then sees
  # only the base interpreter's packages, so point the new venv at the site-packages that hold torch too.
  site=$("$PY" -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
  "$VENV/bin/python" -c "import torch" 2>/dev/null || \
    echo "$site" > "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_system_torch.pth"
  "$VENV/bin/pip" install -q --no-deps --no-build-isolation --no-index -e .
else
  echo "setup: no CUDA torch; installing torch 2.13.0 (CPU) and triton 3.6.0 into $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip >/dev/null 2>&1 || true
  "$VENV/bin/pip" install -q "torch==2.13.0" "triton==3.6.0"
  "$VENV/bin/pip" install -q -e ".[test,bench]"
fi
touch "$VENV/.installed"
