# The two commands of the README: `make test` (CPU suite; builds everything) and `make demo`.
# Both do all the set-up on a fresh Debian machine (scripts/deps installs what is missing).

BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps build test test-gpu demo install format clean

all: build

deps:
	@scripts/deps

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCINFER_WERROR=ON $(CMAKE_FLAGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# CPU tests here; GPU tests report as skipped without a device (scripts/gpu-check runs them).
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-gpu: build
	cd $(BUILD) && ctest --output-on-failure -L gpu

demo: build
	$(BUILD)/cinfer demo

# make install [PREFIX=/usr/local]: library, header, tool, pkg-config file, CMake package.
PREFIX ?= /usr/local
install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD)
