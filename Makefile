# The two commands of the README: `make run` and `make test`. Everything else is a helper.
JOBS ?= $(shell nproc)
PYTHON ?= /usr/bin/python3
CMAKE_FLAGS ?=
SAN_FLAGS = -DDL_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug
ASAN = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
TSAN = -fsanitize=thread -fno-omit-frame-pointer
export ASAN_OPTIONS = detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS = print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS = halt_on_error=1:second_deadlock_stack=1

.PHONY: all deps test-deps build run test test-release test-asan test-tsan test-python device fuzz clean

all: build

deps:
	@sh scripts/install-deps.sh build

test-deps:
	@sh scripts/install-deps.sh test

build: deps
	@cmake -S . -B build -DDL_WERROR=ON $(CMAKE_FLAGS) >/dev/null
	@cmake --build build -j $(JOBS)

run: build
	./build/dlbench --workers 8

test: test-deps
	@$(MAKE) --no-print-directory test-release test-asan test-tsan test-python

test-release:
	@cmake -S . -B build -DDL_WERROR=ON $(CMAKE_FLAGS) >/dev/null
	@cmake --build build -j $(JOBS)
	cd build && ctest --output-on-failure -j $(JOBS)

test-asan:
	@cmake -S . -B build-asan $(SAN_FLAGS) -DDL_WERROR=ON -DCMAKE_C_FLAGS="$(ASAN)" >/dev/null
	@cmake --build build-asan -j $(JOBS)
	cd build-asan && ctest --output-on-failure -j $(JOBS) -LE slow

test-tsan:
	@cmake -S . -B build-tsan $(SAN_FLAGS) -DDL_WERROR=ON -DCMAKE_C_FLAGS="$(TSAN)" >/dev/null
	@cmake --build build-tsan -j $(JOBS)
	cd build-tsan && ctest --output-on-failure -j $(JOBS) -L threads

test-python: build
	cd build && RINGFEED_LIBRARY=$(CURDIR)/build/libringfeed.so DL_DLSHARD=$(CURDIR)/build/dlshard \
	  DL_TEST_SHARDS=$(CURDIR)/build/tests/shards \
	  $(PYTHON) -m pytest -q $(CURDIR)/bindings/python/tests

# Portable binaries for a machine without the -dev packages (the GPU machine): the shared
# libraries ringfeed needs copied into build-device/deps, the CUDA runtime linked statically.
device: deps
	@cmake -S . -B build-device -DDL_BUNDLE_DEPS=ON -DDL_WITH_CUDA=ON -DDL_BUILD_TESTS=ON >/dev/null
	@cmake --build build-device -j $(JOBS)

# Coverage-guided fuzzing of the tar scanner and the decoders (clang's libFuzzer), FUZZ_SECONDS each,
# starting from the third-party corpora. Not part of `make test`, which replays those inputs.
FUZZ_SECONDS ?= 60
TESTDATA ?= $(CURDIR)/../shared/testdata
fuzz: test-deps
	@cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DDL_WITH_CUDA=OFF -DDL_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug \
	  -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link,address,undefined" >/dev/null
	@cmake --build build-fuzz -j $(JOBS) --target fuzz_tar fuzz_decode fuzz_rfs
	mkdir -p build-fuzz/corpus-tar build-fuzz/corpus-decode build-fuzz/corpus-rfs
	DL_LOG_LEVEL=0 ./build-fuzz/tests/fuzz_rfs -max_total_time=$(FUZZ_SECONDS) build-fuzz/corpus-rfs \
	  $(wildcard build/tests/shards/rfs)
	DL_LOG_LEVEL=0 ./build-fuzz/tests/fuzz_tar -max_total_time=$(FUZZ_SECONDS) -max_len=1048576 \
	  build-fuzz/corpus-tar $(TESTDATA)/webdataset
	DL_LOG_LEVEL=0 ./build-fuzz/tests/fuzz_decode -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=4096 \
	  build-fuzz/corpus-decode $(TESTDATA)/jpeg-decoder $(TESTDATA)/pngsuite $(TESTDATA)/libspng-crashers

clean:
	rm -rf build build-asan build-tsan build-device build-fuzz
