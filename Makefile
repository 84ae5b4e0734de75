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

# The third-party corpora the tests read (PngSuite, libjpeg-turbo's and Pillow's images, WebDataset
# and MDS shards, ...), one variable for CMake and pytest alike: DL_TESTDATA if set, else
# ../shared/testdata beside the checkout, else what `make testdata` fetched into the user's cache.
TESTDATA_CACHE := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ringfeed/testdata
DL_TESTDATA ?= $(firstword $(wildcard $(abspath $(CURDIR)/../shared/testdata)) \
  $(patsubst %/.complete,%,$(wildcard $(TESTDATA_CACHE)/.complete)))
export DL_TESTDATA
TESTDATA_FLAG = -DDL_TESTDATA=$(or $(DL_TESTDATA),$(CURDIR)/build/no-testdata)
# Each stage's JUnit report, for make test's last line.
REPORTS = build/ctest.xml build-asan/ctest.xml build-asan/pytest.xml build-tsan/ctest.xml build/pytest.xml

.PHONY: all deps test-deps build run test test-release test-asan test-tsan test-python device fuzz soak clean wheel \
  testdata

# Builds the CMake tree $(1) quietly: what the compiler says goes to $(1)/build.log, shown when the
# build fails (warnings are errors here, so they show too).
define build_quietly
	@echo "building $(1) (the compiler's output: $(1)/build.log)"
	@cmake --build $(1) -j $(JOBS) >$(1)/build.log 2>&1 || { tail -60 $(1)/build.log; echo "make: building $(1) failed; the whole log: $(1)/build.log"; exit 1; }
endef

all: build

deps:
	@sh scripts/install-deps.sh build

test-deps:
	@sh scripts/install-deps.sh test

build: deps
	@cmake -S . -B build -DDL_WERROR=ON $(CMAKE_FLAGS) >/dev/null
	$(call build_quietly,build)

# The loader as a user first meets it: its defaults (workers=auto) over dlbench's synthetic set.
run: build
	./build/dlbench

# Every stage runs, also after one fails; the last line counts them all and says why tests skipped.
test: test-deps
	@rm -f $(REPORTS)
	@echo "make test: third-party corpora: $(or $(DL_TESTDATA),none found (make testdata fetches them))"
	@status=0; for stage in test-release test-asan test-tsan test-python; do \
	  $(MAKE) --no-print-directory $$stage || status=1; done; \
	$(PYTHON) scripts/test-summary.py $(REPORTS) || status=1; exit $$status

# The third-party corpora, from their origins at pinned commits, checked against
# tests/testdata/MANIFEST.tsv, into the user's cache (where make test looks after DL_TESTDATA and
# ../shared/testdata).
testdata:
	$(PYTHON) scripts/fetch-testdata.py $(TESTDATA_CACHE)

test-release:
	@cmake -S . -B build -DDL_WERROR=ON $(TESTDATA_FLAG) $(CMAKE_FLAGS) >/dev/null
	$(call build_quietly,build)
	cd build && ctest --output-on-failure -j $(JOBS) --output-junit $(CURDIR)/build/ctest.xml

test-asan:
	@cmake -S . -B build-asan $(SAN_FLAGS) -DDL_WERROR=ON $(TESTDATA_FLAG) -DCMAKE_C_FLAGS="$(ASAN)" >/dev/null
	$(call build_quietly,build-asan)
	cd build-asan && ctest --output-on-failure -j $(JOBS) -LE slow --output-junit $(CURDIR)/build-asan/ctest.xml
	@# The remote sources (servers, retries, the shard cache's threads and locks) under ASan+UBSan.
	cd build && DL_DLSHARD=$(CURDIR)/build-asan/dlshard DL_TEST_SHARDS=$(CURDIR)/build/tests/shards \
	  XDG_CACHE_HOME=$(CURDIR)/build/tests/cache \
	  $(PYTHON) -m pytest -q -p no:cacheprovider -m "not binding" --junitxml=$(CURDIR)/build-asan/pytest.xml \
	  $(CURDIR)/tests/remote/test_http.py \
	  $(CURDIR)/tests/remote/test_cache.py $(CURDIR)/tests/remote/test_s3.py $(CURDIR)/tests/remote/test_hub.py \
	  $(CURDIR)/tests/remote/test_mds_remote.py

test-tsan:
	@cmake -S . -B build-tsan $(SAN_FLAGS) -DDL_WERROR=ON $(TESTDATA_FLAG) -DCMAKE_C_FLAGS="$(TSAN)" >/dev/null
	$(call build_quietly,build-tsan)
	cd build-tsan && ctest --output-on-failure -j $(JOBS) -L threads --output-junit $(CURDIR)/build-tsan/ctest.xml

test-python: build
	@# Index caches of the tests' temporary shards go to the build folder, as under ctest, not to
	@# the user's cache.
	cd build && RINGFEED_LIBRARY=$(CURDIR)/build/libringfeed.so DL_DLSHARD=$(CURDIR)/build/dlshard \
	  DL_DLBENCH=$(CURDIR)/build/dlbench DL_TEST_SHARDS=$(CURDIR)/build/tests/shards XDG_CACHE_HOME=$(CURDIR)/build/tests/cache \
	  $(PYTHON) -m pytest -q --junitxml=$(CURDIR)/build/pytest.xml $(CURDIR)/bindings/python/tests $(CURDIR)/tests/remote

# The Python wheel, into dist/, with no pip (the build backend needs only the standard library):
# then `pip install dist/ringfeed-*.whl` anywhere, offline.
wheel: deps
	$(PYTHON) bindings/python/build_backend/ringfeed_build.py dist

# Long soak, SOAK_EPOCHS epochs (and as many loaders in turn) from C and from Python, sampling
# memory, descriptors, threads and pinned bytes; make test runs a short one.
SOAK_EPOCHS ?= 50
soak: test-deps build
	./build/tests/soak --epochs $(SOAK_EPOCHS)
	cd build && RINGFEED_LIBRARY=$(CURDIR)/build/libringfeed.so \
	  $(PYTHON) $(CURDIR)/bindings/python/tests/soak.py --epochs $(SOAK_EPOCHS) | tail -3
	cd build && if $(PYTHON) -c "import torch" 2>/dev/null; then RINGFEED_LIBRARY=$(CURDIR)/build/libringfeed.so \
	  $(PYTHON) $(CURDIR)/bindings/python/tests/soak.py --epochs $(SOAK_EPOCHS) --framework torch | tail -1; fi

# Portable binaries for a machine without the -dev packages (the GPU machine): the shared
# libraries ringfeed needs copied into build-device/deps, the CUDA runtime linked statically.
device: deps
	@cmake -S . -B build-device -DDL_BUNDLE_DEPS=ON -DDL_WITH_CUDA=ON -DDL_BUILD_TESTS=ON >/dev/null
	@cmake --build build-device -j $(JOBS)

# Coverage-guided fuzzing of every parser (clang's libFuzzer), FUZZ_SECONDS each, starting from the
# seeds in tests/fuzz/corpus and the third-party corpora. Not part of `make test`, which replays
# those inputs. New finds stay in build-fuzz/corpus-TARGET.
FUZZ_SECONDS ?= 60
TESTDATA ?= $(CURDIR)/../shared/testdata
FUZZ_TARGETS = options token npy fields braces rfidx hubtree mds rfs tar decode
fuzz_seeds_rfs = $(wildcard build/tests/shards/rfs)
fuzz_seeds_tar = tests/fuzz/corpus/tar $(TESTDATA)/webdataset
fuzz_seeds_decode = tests/fuzz/corpus/decode $(TESTDATA)/jpeg-decoder $(TESTDATA)/pngsuite $(TESTDATA)/libspng-crashers
fuzz_seeds_fields = tests/fuzz/corpus/fields $(TESTDATA)/zstd $(TESTDATA)/mds
fuzz: test-deps
	@cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DDL_WITH_CUDA=OFF -DDL_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug \
	  -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link,address,undefined" >/dev/null
	@cmake --build build-fuzz -j $(JOBS) $(addprefix --target fuzz_,$(FUZZ_TARGETS))
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p build-fuzz/corpus-$$t; \
	  case $$t in rfs) seeds="$(fuzz_seeds_rfs)";; tar) seeds="$(fuzz_seeds_tar)";; \
	    decode) seeds="$(fuzz_seeds_decode)";; fields) seeds="$(fuzz_seeds_fields)";; \
	    *) seeds=tests/fuzz/corpus/$$t;; esac; \
	  present=""; for d in $$seeds; do [ -e "$$d" ] && present="$$present $$d"; done; \
	  DL_LOG_LEVEL=0 ./build-fuzz/tests/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -max_len=1048576 \
	    -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix=build-fuzz/ build-fuzz/corpus-$$t $$present >build-fuzz/fuzz_$$t.log 2>&1 \
	    || { tail -40 build-fuzz/fuzz_$$t.log; echo "fuzz_$$t failed: build-fuzz/fuzz_$$t.log"; exit 1; }; \
	  echo "fuzz_$$t: $$(grep -o 'number_of_executed_units: *[0-9]*' build-fuzz/fuzz_$$t.log | grep -o '[0-9]*$$') runs in $(FUZZ_SECONDS) s, no crash"; \
	done

clean:
	rm -rf build build-asan build-tsan build-device build-fuzz
