# loadgen: the two commands a newcomer runs are `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup demo test test-fast lint bench soak clean llama-server browser fuzz

setup: $(STAMP)

# Re-installs only when pyproject.toml changed; a second `make setup` is a no-op.
# The install builds the compiled reader (setup.py, loadgen/engine/_reader.c and _chat.c) and the
# capture relay's pump (loadgen/capture/_relay.c) where a C compiler works; without one the install
# still works, on the Python reader and relay, and says so.
$(STAMP): pyproject.toml setup.py loadgen/engine/_reader.c loadgen/engine/_chat.c loadgen/engine/_reader_api.h loadgen/capture/_relay.c
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev,routers]'
	@$(BIN)/python -c 'import loadgen.engine._reader, loadgen.engine._chat, loadgen.capture._relay' 2>/dev/null || echo "loadgen: C reader not built (no working C compiler; pip install -v -e . says why); using the Python reader and relay"
	@touch $(STAMP)

demo: setup
	$(BIN)/loadgen demo

# llama.cpp's llama-server and the SmolLM2 model, built/fetched once per machine into
# $${LOADGEN_CACHE:-~/.cache/loadgen} (4-10 min the first time, milliseconds after).
llama-server:
	@bash scripts/llama-server.sh ensure >/dev/null

# Debian's headless chromium for the web UI and HTML report tests (installed once).
browser:
	@bash scripts/ensure-chromium.sh

test: setup llama-server browser
	$(BIN)/ruff check .
	LOADGEN_REQUIRE_LLAMA=1 LOADGEN_REQUIRE_BROWSER=1 $(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check .

bench: setup
	@for f in bench/*.py; do [ $$f = bench/soak.py ] && continue; [ $$f = bench/sse_server.py ] && continue; echo "== $$f"; $(BIN)/python $$f || exit 1; done

# 30 minutes at a steady rate: memory, file descriptors and lost records (docs/soak.md)
soak: setup
	$(BIN)/python bench/soak.py

# The compiled chat path's differential tests against ASan+UBSan builds, then the compiled body
# reader fuzzed against the Python one (docs/performance.md, "Fuzzing the reader"): an ASan+UBSan
# build in build/fuzz, atheris from the [fuzz] extra; stops at the first difference.
FUZZ_SECONDS ?= 300
fuzz: setup
	PY=$(BIN)/python bash tests/fuzz/sanitized_tests.sh
	FUZZ_SECONDS=$(FUZZ_SECONDS) PY=$(BIN)/python bash tests/fuzz/run_fuzz.sh

clean:
	rm -rf $(VENV) results .pytest_cache .ruff_cache *.egg-info
