# l4lab: thin verbs over scripts/ and the Python tools. `make demo` and `make test` do all set-up.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
ARCH  := $(shell uname -m)

BPF_SRC := $(wildcard bpf/*.bpf.c)
BPF_OBJ := $(patsubst bpf/%.bpf.c,build/bpf/%.o,$(BPF_SRC))
BPF_HDR := $(wildcard bpf/include/*.h)
BPF_CFLAGS := -O2 -g -target bpf -Wall -Werror -Wno-unused-function \
	-I bpf/include -I/usr/include/$(ARCH)-linux-gnu

.PHONY: all deps deps-all bench bpf native abi abi-check check lint lock demo test test-install soak \
	test-vagrant test-vagrant-smoke vagrant-box clean

all: bpf native

deps:
	@bash scripts/setup.sh

# Every optional feature too (qemu + a Debian kernel, FRR, BCC, Chromium, tshark): all suites run.
deps-all:
	@bash scripts/setup.sh --all

bpf: $(BPF_OBJ) native

# The controller's Maglev fill in C (balancer/maglev.py falls back to Python without it).
native: build/lib/libl4lab_maglev.so

build/lib/libl4lab_maglev.so: balancer/native/maglev_fill.c
	@mkdir -p $(@D)
	clang -O2 -Wall -Werror -shared -fPIC -o $@ $<

build/bpf/%.o: bpf/%.bpf.c $(BPF_HDR)
	@mkdir -p $(@D)
	clang $(BPF_CFLAGS) -c $< -o $@

# Regenerate the committed Python view of the BPF contract from the objects' BTF.
abi: bpf
	$(PY) -m balancer.abigen --write balancer/_abi.py $(BPF_OBJ)

# Fail when the committed balancer/_abi.py differs from what the objects' BTF says.
abi-check: bpf
	$(PY) -m balancer.abigen --check balancer/_abi.py $(BPF_OBJ)

# Regenerate requirements.lock (every venv package, hashed) from pyproject.toml's pins; needs PyPI, minutes.
lock:
	bash scripts/lock.sh

lint:
	$(VENV)/bin/ruff check balancer lab suites reports
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

check: deps abi-check lint

demo: deps bpf
	$(VENV)/bin/l4lab demo

# Every test: two concurrent streams of about equal length (suites/streams.py says why; the second
# stream's output follows the first's), then the benches alone, since they time what they run.
# Stream 1: l4lab's conformance, the datapath and report suites, then the core conformance checks
# against Linux IPVS in a VM. Stream 2: the rest, then one Vagrant smoke (test-vagrant-smoke below),
# after the unit VM that shares its bootstrapped root.
TEST_STREAM_1 := $(PY) -m pytest suites/conformance suites/datapath suites/reports $(PYTEST_ARGS) \
	&& $(VENV)/bin/l4lab conform --dut ipvs --no-report
TEST_STREAM_2 := $(PY) -m pytest suites/ --ignore=suites/conformance --ignore=suites/datapath \
	--ignore=suites/reports --ignore=suites/bench $(PYTEST_ARGS) \
	&& L4LAB_VAGRANT_SMOKE=1 $(PY) -m pytest suites/lab/test_vagrant.py -k smoke -rs -s $(PYTEST_ARGS)

test: deps-all bpf abi-check lint
	$(PY) -m suites.streams --logs build/test-streams '$(TEST_STREAM_1)' '$(TEST_STREAM_2)'
	$(PY) -m pytest suites/bench $(PYTEST_ARGS)

# The package as a user gets it (root, PyPI): `pip install .` into a fresh venv, then that venv's lbctl
# loads the packaged BPF object on a veth from outside the source tree. Minutes, so not in `make test`.
test-install: deps bpf
	L4LAB_INSTALL_TEST=1 $(PY) -m pytest suites/controller/test_cli.py -k fresh_venv -q $(PYTEST_ARGS)

# Fuzz soak (root): SOAK_FRAMES generated frames (1,000,000 by default) through the balancer and both
# decap programs by test run; prints the seed and a FUZZ SUMMARY line, writes a `fuzz` result.
# Replay a run with SOAK_SEED=<seed>. `make test` runs the same test with 100,000 frames.
SOAK_FRAMES ?= 1000000
soak: deps bpf
	L4LAB_FUZZ_FRAMES=$(SOAK_FRAMES) L4LAB_FUZZ_SEED=$(SOAK_SEED) \
		$(PY) -m pytest suites/datapath/test_fuzz.py -k test_fuzz_volume -s -q $(PYTEST_ARGS)

# The local Vagrant box (Debian 12 for libvirt, from Debian's packages; cached under build/vagrant-box).
vagrant-box: deps-all
	$(VENV)/bin/l4lab vagrant-box $(BOX_ARGS)

# The Vagrant lab booted for real (libvirt, TCG where KVM runs no guest): vagrant up of the default
# topology from the local box, the hardware-marked conformance suites over SSH, vagrant destroy.
# Starts and stops libvirtd itself where no init system runs it. Long: see the README.
# The machines boot the box's light init (BOX_INIT=systemd boots systemd).
test-vagrant: deps-all bpf
	$(PY) -m lab.remote.vagrantlab test --topology $(or $(TOPOLOGY),default) --box-init $(or $(BOX_INIT),light) \
		-- $(PYTEST_ARGS)

# One LB and one real from the local box, one DSR request, destroy (the smoke of the above).
test-vagrant-smoke: deps-all bpf
	L4LAB_VAGRANT_SMOKE=1 $(PY) -m pytest suites/lab/test_vagrant.py -k smoke -rs -s $(PYTEST_ARGS)

# Benchmarks (root): NDR/PDR per encap and size beside the floors, micro and controller figures.
bench: deps bpf
	$(VENV)/bin/l4lab bench $(BENCH_ARGS)

clean:
	rm -rf build reports/out
