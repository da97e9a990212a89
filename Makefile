# The two commands the README promises: `make run` and `make test`.
CARGO ?= cargo
# Where cargo puts its output (the environment's CARGO_TARGET_DIR, if set).
CARGO_TARGET_DIR ?= target
LOGCACHE_BIN = $(CARGO_TARGET_DIR)/release/logcache

.PHONY: run test setup build bench-engine fmt lint

## Install what is missing on this machine (system packages; the Rust toolchain is assumed).
setup:
	@./scripts/setup.sh

build: setup
	$(CARGO) build --release --workspace

## The main job: serve a cached disk over NBD on the embedded default (./logcache-data: a 1 GiB
## cache in front of an 8 GiB backing file, both sparse), until Ctrl-C.
run: build
	./target/release/logcache serve

## Everything CI checks: formatting, lints, the whole test suite, then a short run of the
## SIGKILL verifier (docs/RELIABILITY.md): its checker on made-up contents, a self-test (it must
## report the unflushed writes a kill loses when told they were flushed), and 10 kill cycles.
test: setup
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) test --workspace
	$(CARGO) build --release -p logcache
	/usr/bin/python3 reliability/kill_verify.py --check-checker >/dev/null
	/usr/bin/python3 reliability/kill_verify.py --bin $(LOGCACHE_BIN) --self-test --cycles 10 --region-mib 32 --max-reports 0
	/usr/bin/python3 reliability/kill_verify.py --bin $(LOGCACHE_BIN) --cycles 10

bench-engine: build
	./target/release/logcache bench engine --seconds 10

fmt:
	$(CARGO) fmt --all
