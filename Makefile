# llama-sparq: one-command set-up, tests and demo.
#
#   make test    install everything into .venv (first time: ~10 min on 2 cores), run the test suite
#   make demo    install, fetch Gemma 3 270M, generate with the Python Llama and with llama-cli
#   make install build the fork (persistent build/ folder, ccache when present) and install the package
#
# Variables: PYTHON (the interpreter that creates .venv), PYTEST_ARGS, JOBS.

PYTHON      ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
PIP         := $(PY) -m pip --disable-pip-version-check
PYTEST_ARGS ?=
JOBS        ?= $(shell nproc 2>/dev/null || echo 2)

# ccache (when installed): relative paths, so a fresh clone elsewhere reuses the cache
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

.PHONY: all install deps deps-system test test-fast demo upstream bench-op clean distclean

all: install

$(VENV)/.deps: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "scikit-build-core>=0.10" "numpy>=1.20" "pytest>=7" "gguf>=0.10" "cffi>=1.15" \
	    "diskcache>=5.6.1" "jinja2>=2.11.3" "typing-extensions>=4.5.0" "matplotlib>=3.5" "tqdm>=4"
	@# llama-cpp-python's Python layer (llama_cpp) now comes with our wheel, from the pinned sdist:
	@# a separately installed llama-cpp-python would own the same files
	@if $(PIP) show -q llama-cpp-python >/dev/null 2>&1; then $(PIP) uninstall -y -q llama-cpp-python; fi
	@touch $@

deps: $(VENV)/.deps

# Debian packages the build and tests use, installed when missing (needs root and apt):
# ccache (faster rebuilds), the aarch64 cross compiler and qemu-user (NEON tests)
SYSTEM_TOOLS := ccache aarch64-linux-gnu-g++ qemu-aarch64
SYSTEM_PKGS  := ccache gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user
deps-system:
	@missing=""; for t in $(SYSTEM_TOOLS); do command -v $$t >/dev/null || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages for:$$missing"; \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSTEM_PKGS) >/dev/null; \
	  else echo "warning: not root or no apt-get; install $(SYSTEM_PKGS) yourself (the NEON tests need them)"; fi; \
	fi

install: deps
	@command -v ccache >/dev/null || echo "note: ccache not found; rebuilds from scratch are slower (make deps-system installs it)"
	CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(PIP) install -q --no-build-isolation --no-deps .
	$(PY) -c "import llama_sparq; print(llama_sparq.check_library())"

test: deps-system install
	$(PY) -m pytest tests $(PYTEST_ARGS)

# everything but the tests that need Gemma 3 270M
test-fast: install
	$(PY) -m pytest tests -m "not real_model" $(PYTEST_ARGS)

demo: install
	$(PY) scripts/demo.py

# fetch + patch the pinned upstream only (prints the tree)
upstream:
	$(PYTHON) scripts/upstream.py prepare

bench-op: install
	$(PY) bench/op_bench.py

clean:
	rm -rf build

distclean: clean
	rm -rf .upstream $(VENV)
