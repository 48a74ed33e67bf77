# Thin wrapper: `make train` trains the embedded default, `make test` runs the suite.
# Both install missing Debian packages first (scripts/deps.sh).
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: all build train test clean deps
all: build

deps:
	@bash scripts/deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

train: build
	./$(BUILD)/moe train --out runs/default --force

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD)
