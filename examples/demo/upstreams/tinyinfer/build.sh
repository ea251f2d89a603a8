#!/usr/bin/env bash
# tinyinfer's own build: compiles tinyinfer/_C in place (like DeepInfer's build.sh).
set -euo pipefail
: "${TINYINFER_ACCELERATOR:?set TINYINFER_ACCELERATOR=nvidia}"
if [ "$TINYINFER_ACCELERATOR" != nvidia ]; then
  echo "build.sh: only TINYINFER_ACCELERATOR=nvidia is supported" >&2
  exit 2
fi
cd "$(dirname "$0")"
python setup.py build_ext --inplace
