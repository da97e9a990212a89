# The two commands the README promises: `make run` and `make test`.
CARGO ?= cargo
# Where cargo puts its output (the environment's CARGO_TARGET_DIR, if set).
CARGO_TARGET_DIR ?= target
LOGCACHE_BIN = $(CARGO_TARGET_DIR)/release/logcache

.PHONY: run test setup build install bench-engine bench-smoke bench-quick bench-full fmt lint

## Install what is missing on this machine (system packages; the Rust toolchain is assumed).
setup:
	@./scripts/setup.sh

build: setup
	$(CARGO) build --release --workspace

## The main job: serve a cached disk over NBD on the embedded default (./logcache-data: a 1 GiB
## cache in front of an 8 GiB backing file, both sparse), until Ctrl-C.
run: build
	./target/release/logcache serve

## Put `logcache` on PATH (cargo's bin directory, ~/.cargo/bin), so the README's `logcache ...`
## commands work as written from any directory.
install:
	$(CARGO) install --locked --path crates/cli

## Everything CI checks: formatting, lints, the whole test suite, then a short run of the
## SIGKILL verifier (docs/RELIABILITY.md): its checker on made-up contents, a self-test (it must
## report the unflushed writes a kill loses when told they were flushed), and 10 kill cycles
## with TRIM, write-zeroes and write-around in the load (docs/RELIABILITY.md, "Process crashes").
test: setup
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) test --workspace
	$(CARGO) build --release -p logcache
	WARMUP_S=2 MAX_LAT_MS=15000 LOGCACHE_BIN=$(LOGCACHE_BIN) ./scripts/soak-load.sh 8 64 64 1G
	/usr/bin/python3 reliability/kill_verify.py --check-checker >/dev/null
	/usr/bin/python3 reliability/kill_verify.py --bin $(LOGCACHE_BIN) --self-test --cycles 10 --region-mib 32 --max-reports 0
	/usr/bin/python3 reliability/kill_verify.py --bin $(LOGCACHE_BIN) --cycles 10
	$(MAKE) bench-smoke

## The benchmark harness (bench/run; see bench/README.md). bench-smoke runs every experiment at
## tiny sizes into a temp dir and checks that each produced well-formed rows (docs/ untouched);
## bench-quick (about 12 minutes) and bench-full regenerate docs/BENCHMARKS.md and bench/results/.
bench-smoke: setup
	$(CARGO) build --release -p logcache -p logcache-bench
	./bench/run --smoke --no-build

bench-quick: setup
	$(CARGO) build --release -p logcache -p logcache-bench
	./bench/run --quick --no-build

bench-full: setup
	$(CARGO) build --release -p logcache -p logcache-bench
	./bench/run --full --no-build

bench-engine: build
	./target/release/logcache-bench engine --seconds 10

fmt:
	$(CARGO) fmt --all
