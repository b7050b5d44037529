# The two set-up commands of the README are `make demo` and `make test`.
SHELL := /bin/bash

.PHONY: test unit
test: unit

unit:
	scripts/install-deps
	cargo test --workspace --locked
