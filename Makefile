# The two commands the README promises: `make run` and `make test`.
CARGO ?= cargo

.PHONY: run test setup build bench-engine fmt lint

## Install what is missing on this machine (system packages; the Rust toolchain is assumed).
setup:
	@./scripts/setup.sh

build: setup
	$(CARGO) build --release --workspace

## The main job. Until the NBD server lands (issue 4) this runs the engine benchmark on its
## embedded default: memory-backed cache and backing devices, 1 and 2 writer threads.
run: build
	./target/release/logcache bench engine

## Everything CI checks: formatting, lints, and the whole test suite.
test: setup
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) test --workspace

bench-engine: build
	./target/release/logcache bench engine --seconds 10

fmt:
	$(CARGO) fmt --all
