#!/usr/bin/env bash
# The compiled chat chunk path's differential tests (every adapter's chunks in C against the Python
# path, raw reads included) run against ASan + UBSan builds of loadgen/engine/_chat.c and
# _reader.c: hypothesis's generated and hostile lines then also check the C code for memory and
# undefined-behaviour errors, which a difference in results alone would not show. Part of
# `make fuzz`; the installed modules are untouched: the tests run in a copy of the tree under
# build/fuzz/tree whose engine holds the sanitized builds.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"  # the tests run from the copy's root
OUT=build/fuzz
TREE=$OUT/tree
TESTS=(tests/unit/test_compiled_chat_diff.py tests/unit/test_compiled_agent_apis_diff.py
       tests/unit/test_compiled_sglang_diff.py tests/unit/test_compiled_raw_reads_diff.py)

command -v gcc >/dev/null || { echo "Error: the sanitized tests need gcc (apt-get install gcc)" >&2; exit 2; }
rm -rf "$TREE"
mkdir -p "$TREE"
cp -r loadgen targets workloads analysis tests pyproject.toml "$TREE"/
find "$TREE" -name '*.so' -delete
"$PY" tests/fuzz/build_asan.py "$TREE/loadgen/engine" _reader _chat >/dev/null
echo "the compiled chat path's differential tests against ASan+UBSan builds ($TREE/loadgen/engine)"
# -s: a sanitizer's report goes to the terminal, not into pytest's capture (which an abort loses).
cd "$TREE"
env LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)" \
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$PY" -m pytest -q -s -p no:cacheprovider "${TESTS[@]}"
