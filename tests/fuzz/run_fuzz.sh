#!/usr/bin/env bash
# make fuzz: fuzz the compiled body reader against the Python one for FUZZ_SECONDS (default 300).
#
# 1. atheris, from the [fuzz] extra of pyproject.toml, when it is not installed yet;
# 2. the reader built under ASan + UBSan into build/fuzz (tests/fuzz/build_asan.py), the installed
#    one untouched, and tests/fuzz/cov_shim.c, which lets atheris's coverage past gcc's libasan;
# 3. atheris over tests/fuzz/corpus (seeds, read only) and build/fuzz/corpus (what it finds),
#    with gcc's libasan preloaded (and libstdc++, whose exceptions ASan must see from the start). A difference or a crash stops it and leaves the input in
#    build/fuzz/artifacts/; `python tests/fuzz/fuzz_reader.py --replay FILE` says what differs.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
SECONDS_TO_RUN=${FUZZ_SECONDS:-300}
OUT=build/fuzz

if ! "$PY" -c 'import atheris' 2>/dev/null; then
    reqs=$("$PY" -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['fuzz'])")
    "$PY" -m pip install -q --disable-pip-version-check $reqs
fi
command -v gcc >/dev/null || { echo "Error: make fuzz needs gcc (apt-get install gcc)" >&2; exit 2; }
reader=$("$PY" tests/fuzz/build_asan.py "$OUT")
gcc -shared -fPIC -O1 -o "$OUT/cov_shim.so" tests/fuzz/cov_shim.c -ldl
core=$("$PY" -c "import atheris, glob, os; print(glob.glob(os.path.join(os.path.dirname(atheris.__file__), 'core_with_libfuzzer*.so'))[0])")
mkdir -p "$OUT/corpus" "$OUT/artifacts"

echo "fuzzing the compiled reader for ${SECONDS_TO_RUN}s (ASan+UBSan build: $reader)"
env LD_PRELOAD="$OUT/cov_shim.so:$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libstdc++.so.6)" ATHERIS_CORE="$core" \
    ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0:abort_on_error=0 PYTHONMALLOC=malloc \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    LOADGEN_FUZZ_READER_SO="$reader" \
    "$PY" tests/fuzz/fuzz_reader.py -max_total_time="$SECONDS_TO_RUN" -max_len=2048 \
    -dict=tests/fuzz/reader.dict -artifact_prefix="$OUT/artifacts/" -print_final_stats=1 \
    "$OUT/corpus" tests/fuzz/corpus 2>&1 | grep -v '^INFO: Instrumenting'
status=${PIPESTATUS[0]}
if [ "$status" -ne 0 ]; then
    echo "fuzz: the readers differ or the C reader crashed; the input is in $OUT/artifacts/ (replay it with: $PY tests/fuzz/fuzz_reader.py --replay FILE)" >&2
fi
exit "$status"
