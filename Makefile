# A thin wrapper over meson: setup installs missing Debian packages, build
# configures once and then lets ninja skip what is up to date.
BUILD ?= build
# nvcc lives outside PATH on Debian; meson builds the CUDA kernels when it
# finds it and the CPU-only build otherwise.
export PATH := $(PATH):/usr/local/cuda/bin
PY := /usr/bin/python3

.PHONY: all setup setup-test build demo test soak bench asan fuzz install image clean

all: build

setup:
	@sh deploy/setup.sh

setup-test:
	@sh deploy/setup.sh test

# The fuzzer (an ASan + UBSan program of its own, built by clang) is left to
# make asan's build, which builds and runs it, and to make fuzz's.
$(BUILD)/build.ninja:
	meson setup $(BUILD) -Dfuzz=disabled

build: setup $(BUILD)/build.ninja
	ninja -C $(BUILD)

demo: build
	$(BUILD)/deploy/pslaunch deploy/examples/local.json

# MALLOC_PERTURB_=0: meson fills every malloc'd and freed block of a test
# with a random byte unless told otherwise; that cost a training job a fifth
# of its CPU time (2.1 s against 2.5 s of wall, 4.1 s against 5.1 s of CPU
# for the demo's two epochs), and make test is CPU-bound. make asan keeps
# the check: ASan's allocator fills new blocks itself and reports any use
# of a freed one.
test: build setup-test
	MALLOC_PERTURB_=0 meson test -C $(BUILD) --print-errorlogs --num-processes 2; \
	  rc=$$?; $(PY) tests/summary.py $(BUILD); exit $$rc

# The long fault runs (docs/faults.md; CONTRIBUTING.md, "The soak"): the
# load test at full size (64 clients pushing and pulling against 2 shards for
# 60 s) and 8 graceful restarts of random shards under load, 13 reshards
# (1 to 4 shards) each killed once mid-way and run again with known pushes
# between them (docs/reshard.md), 10 live reshards (psctl reshard --stop)
# under two pushing clients with a shard killed in each, 8 live moves
# (psctl reshard, a bucket a batch) with a shard killed mid-move in each,
# then every fault test SOAK_ROUNDS times over.
SOAK_ROUNDS ?= 3
soak: build setup-test
	PSD_SOAK=1 $(PY) tests/integration/test_faults.py $(BUILD) LoadTest RestartLoadTest
	PSD_SOAK=1 $(PY) tests/integration/test_reshard.py $(BUILD) ReshardCounterTest
	PSD_SOAK=1 $(PY) tests/integration/test_relayout.py $(BUILD) \
	  RelayoutTest.test_live_reshards_with_kills_under_pushers \
	  RelayoutTest.test_live_moves_with_kills_under_pushers
	for i in $$(seq $(SOAK_ROUNDS)); do \
	  echo "soak round $$i of $(SOAK_ROUNDS)"; \
	  $(PY) tests/integration/test_faults.py $(BUILD); rc=$$?; \
	  [ $$rc = 0 ] || [ $$rc = 77 ] || exit 1; \
	done

bench: build setup-test
	$(PY) tests/bench/bench.py $(BUILD)

# Binaries, systemd units, sysusers file, man pages and example specs under
# meson's prefix (/usr/local unless configured otherwise); see
# docs/operating.md for what to run after it.
install: build
	meson install -C $(BUILD)

# psd's container image, the manifests' psd:latest (docs/kubernetes.md, "The
# image"): a Debian 12 base made by mmdebstrap from Debian's packages, kept
# in $(BUILD)/image so that a second run reuses it, psd built there without
# CUDA, and deploy/container/Containerfile over both, built by podman.
# integration-image runs the job in its containers.
IMAGE ?= psd:latest
image: setup-test
	sh deploy/container/build-image.sh $(BUILD)/image $(IMAGE)

# The whole suite under AddressSanitizer + UBSan (c-ares' own leak suppressed),
# built at -O1 with debug info (-O0 made every process 15% slower), two at a
# time as make test; the example and fault jobs train one epoch and the
# examples' figures are not asserted (PSD_SANITIZED=1, CONTRIBUTING.md). The suites
# that load libpsclient into python3 or a program of their own get the
# sanitizers' runtime preloaded (tests/meson.build). ASAN_TESTS names some
# suites to run alone (make asan ASAN_TESTS="integration-python unit/table").
# .ci/run runs it after make test.
ASAN_TESTS ?=
asan: setup setup-test
	[ -f $(BUILD)-asan/build.ninja ] || meson setup $(BUILD)-asan -Dcuda=disabled \
	  -Db_sanitize=address,undefined -Ddebug=true -Doptimization=1
	ninja -C $(BUILD)-asan
	LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp GRPC_DNS_RESOLVER=native \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  PSD_SANITIZED=1 meson test -C $(BUILD)-asan --print-errorlogs --num-processes 2 \
	  --timeout-multiplier 3 $(ASAN_TESTS); \
	  rc=$$?; $(PY) tests/summary.py $(BUILD)-asan; exit $$rc

# The libFuzzer target over every call's decoding and dispatch
# (CONTRIBUTING.md, "Fuzzing"), built in $(BUILD)-fuzz (only the fuzzer and
# its seed writer): replays tests/fuzz/corpus and regressions, then fuzzes for
# FUZZ_SECONDS; new inputs collect in $(BUILD)-fuzz/tests/fuzz/work, a crash's
# input in .../work/artifacts. FUZZ_MERGE=1 minimizes what it found into
# tests/fuzz/corpus (to commit).
FUZZ_SECONDS ?= 60
FUZZ_BUILD := $(BUILD)-fuzz
fuzz: setup setup-test
	[ -f $(FUZZ_BUILD)/build.ninja ] || meson setup $(FUZZ_BUILD) -Dcuda=disabled \
	  -Dfuzz=enabled
	ninja -C $(FUZZ_BUILD) tests/fuzz/fuzz-service tests/fuzz/fuzz-seeds
	$(PY) tests/fuzz/run_fuzz.py --fuzzer $(FUZZ_BUILD)/tests/fuzz/fuzz-service \
	  --seeds $(FUZZ_BUILD)/tests/fuzz/fuzz-seeds --corpus tests/fuzz/corpus \
	  --regressions tests/fuzz/regressions --work $(FUZZ_BUILD)/tests/fuzz/work \
	  --seconds $(FUZZ_SECONDS) $(if $(FUZZ_MERGE),--merge,)

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-fuzz
