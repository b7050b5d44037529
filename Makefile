# vmlet. The README's two set-up commands for a fresh Debian 12 machine are `make demo`
# and `make test`; .ci/run calls `make test`.
SHELL := /bin/bash

.PHONY: demo dist manifests test test-k8s test-matrix unit mutants fuzz e2e smoke critest bench bench-start bench-exec bench-net bench-density lint stack-up stack-down

## demo: boot a container in a VM with ctr against the embedded defaults, then tear down.
demo:
	scripts/demo

## dist: the release tarball dist/vmlet-VERSION-x86_64.tar.gz (programs, guest image, man
## pages, completions, containerd snippets, RuntimeClass, DaemonSet; MANIFEST.json, a CycloneDX
## SBOM sbom.cdx.json, SHA256SUMS)
## and the installer image dist/vmlet-installer-VERSION.oci.tar.
dist:
	scripts/dist

## manifests: deploy/*.yaml against the Kubernetes API types (scripts/check-manifests).
manifests:
	scripts/check-manifests

## test: everything: lint, unit tests, the private stack, end-to-end tests, critest,
## benchmarks on containerd 2.2, then the smoke tests on containerd 1.7 and 1.6.
test:
	scripts/with-stack-lock scripts/test-all

## test-k8s: the Kubernetes cluster tests alone: the kubectl scenarios, and Kubernetes' whole conformance selection for runc and vmlet (docs/conformance.md; make test runs the quick one).
test-k8s:
	scripts/install-deps
	scripts/with-stack-lock scripts/test-k8s

## test-matrix: the release on Debian 13 with its backports' QEMU 11 and libvirt 12, then every end-to-end test and critest on containerd 2.2, 1.7 and 1.6 (not in CI; VMLET_MATRIX_SERIES="1.7 1.6" narrows the series, VMLET_MATRIX_BACKPORTS=0 leaves out Debian 13).
test-matrix:
	scripts/install-deps
	scripts/with-stack-lock scripts/test-matrix

unit:
	scripts/install-deps
	cargo test --workspace --locked

## mutants: mutation testing of the task service's lifecycle rules against the shim's unit tests (cargo-mutants; ~20 min, not in CI).
mutants:
	scripts/mutants

## fuzz: each cargo-fuzz target for VMLET_FUZZ_SECONDS (default 30).
fuzz:
	scripts/fuzz

## lint: rustfmt, clippy with warnings as errors, cargo-deny (licenses, sources, duplicate versions), and every path the docs and manifests name (scripts/check-paths).
lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --locked -- -D warnings
	scripts/deny
	scripts/check-paths

## e2e / smoke / critest / bench / bench-*: against a stack that is already up (eval "$$(scripts/stack up)").
e2e:
	scripts/e2e

## smoke: the subset every containerd series must pass (ctr, a CRI pod, exec, logs, port-forward).
smoke:
	scripts/e2e smoke

## critest: the CRI validation suite for runc and vmlet; vmlet must pass what runc passes (docs/conformance.md).
critest:
	scripts/critest

## bench: every benchmark, then one table of their figures beside their baselines and targets.
bench:
	scripts/bench

bench-start:
	cargo run --locked --release -p vmlet-integration --bin bench-start

bench-exec:
	cargo run --locked --release -p vmlet-integration --bin bench-exec

bench-net:
	cargo run --locked --release -p vmlet-integration --bin bench-net

## bench-density: 20 idle pods created 4 at a time, an exec into each, memory per pod.
bench-density:
	cargo run --locked --release -p vmlet-integration --bin bench-density

stack-up:
	scripts/stack up

stack-down:
	scripts/stack down
