# The two commands of the README: `make test` (CPU suite; builds everything) and `make demo`.
# Both do all the set-up on a fresh Debian machine (scripts/deps installs what is missing).

BUILD ?= build
JOBS ?= $(shell nproc)
# The build carries the small "ci" AOT bundle (Llama-3-8B shapes, bf16, sm_90a: seconds to
# build), so the tests and the installed examples prove the ahead-of-time path; `make wheel
# CMAKE_FLAGS="-DCINFER_AOT=ON"` (on a fresh build folder) bundles the whole default set.
CMAKE_FLAGS ?= -DCINFER_AOT=ON -DCINFER_AOT_SET=ci -DCINFER_AOT_ARCHS=sm_90a

.PHONY: all deps build test test-sanitize test-gpu demo install wheel format clean

all: build

deps:
	@scripts/deps

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCINFER_WERROR=ON $(CMAKE_FLAGS) \
	  $(if $(CINFER_DEPS_DIR),-DCINFER_DEPS_DIR=$(CINFER_DEPS_DIR))

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# CPU tests here; GPU tests report as skipped without a device (scripts/gpu-check runs them).
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The CPU tests again in a separate build with AddressSanitizer and UBSan on every target (UBSan's
# default checks and float-to-integer overflow, which -fsanitize=undefined leaves out in GCC; no
# AOT bundle, no Python or install check: see tests/CMakeLists.txt); any report fails its test.
SANITIZE_BUILD ?= build-sanitize
$(SANITIZE_BUILD)/CMakeCache.txt:
	cmake -S . -B $(SANITIZE_BUILD) -DCINFER_WERROR=ON -DCINFER_AOT=OFF \
	  -DCINFER_SANITIZE=address,undefined,float-cast-overflow \
	  $(if $(CINFER_DEPS_DIR),-DCINFER_DEPS_DIR=$(CINFER_DEPS_DIR))

test-sanitize: deps $(SANITIZE_BUILD)/CMakeCache.txt
	cmake --build $(SANITIZE_BUILD) -j $(JOBS)
	cd $(SANITIZE_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
	  ctest --output-on-failure -L cpu -j $(JOBS)

test-gpu: build
	cd $(BUILD) && ctest --output-on-failure -L gpu

# A short serving replay (64 steps of continuous batching over the Azure trace), checked against the
# CPU reference; without a GPU: the schedule on the host, and its kernels for sm_90a taken from the AOT
# bundle or compiled.
demo: build
	$(BUILD)/cinfer bench serve --check --steps 64 --requests 256 --layers 2

# make install [PREFIX=/usr/local]: library, header, tool, pkg-config file, CMake package.
PREFIX ?= /usr/local
install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

# make wheel: dist/cinfer-*.whl, the Python package carrying libcinfer.so and the build's
# libcinfer.aot (the ci set by default; the default set with CMAKE_FLAGS=-DCINFER_AOT=ON).
wheel: build
	cp -L $(BUILD)/libcinfer.so python/cinfer/libcinfer.so
	if [ -f $(BUILD)/libcinfer.aot ]; then cp $(BUILD)/libcinfer.aot python/cinfer/; fi
	python3 -m pip wheel -q --no-deps -w dist ./python
	rm -f python/cinfer/libcinfer.so python/cinfer/libcinfer.aot

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD)
