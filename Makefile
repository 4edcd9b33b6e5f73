# darknet-py: `make demo` and `make test` work on a fresh machine.
# Uses the active virtualenv if there is one, else creates .venv here.
SHELL := /bin/bash
ifdef VIRTUAL_ENV
PYTHON := $(VIRTUAL_ENV)/bin/python
else
PYTHON := .venv/bin/python
endif
# GPU targets run on the device as it is: the python3 on the PATH, nothing installed.
GPU_PYTHON ?= python3
NVCC ?= nvcc

.PHONY: install test demo gpu-test bench bench-cpu kernels-check lint dist clean

.venv/bin/python:
	python3 -m venv .venv

.installed: pyproject.toml | $(PYTHON)
	$(PYTHON) -m pip install -q -e '.[dev]'
	@touch .installed

install: .installed

# Every kernel must compile for Hopper with warnings as errors (gemm_wgmma*.cu for sm_90a
# too), one nvcc per core; files unchanged since they last passed are not compiled again
# (scripts/kernels_check.py; --all compiles every one). A notice where nvcc is absent.
kernels-check: install
	$(PYTHON) scripts/kernels_check.py --nvcc $(NVCC)

test: install kernels-check
	$(PYTHON) -m pytest -q -m "not gpu"

demo: install
	$(PYTHON) -m darknet_py.demo

# ruff's lint rules and formatting (pyproject.toml's [tool.ruff]) over the whole checkout.
lint: install
	$(PYTHON) -m ruff check . && $(PYTHON) -m ruff format --check .

# A wheel in dist/ (pip install dist/darknet_cfg_runner-*.whl), checked to carry every
# CUDA kernel, its binary for sm_80/86/89/90 (gemm_wgmma.cu: sm_90a) with their manifest (prebuilt.py: no nvcc
# needed on those GPUs) and every bundled cfg: the CUDA backend and the demo read them.
dist: install
	rm -rf dist build darknet_py/kernels_bin
	$(PYTHON) -m darknet_py.backends.prebuilt
	$(PYTHON) -m pip wheel -q --no-deps -w dist .
	$(PYTHON) -m darknet_py.backends.prebuilt --check-wheel dist/*.whl
	@ls dist/*.whl

# GPU_TEST_JOBS=4 make gpu-test: the test files in 4 processes sharing the GPU
# (scripts/gpu_test.sh).
gpu-test:
	GPU_PYTHON=$(GPU_PYTHON) bash scripts/gpu_test.sh

# Kernels, whole networks, then training end to end against the C Darknet and beside
# PyTorch (bench/run.py's default subjects; `python3 bench/run.py --list` names the others).
# Dated sections are appended to bench/RESULTS.md, figures merged into bench/results.json.
bench:
	$(GPU_PYTHON) bench/run.py

# CPU inference against OpenCV 4's DNN module (OpenCV 5 dropped the Darknet importer), in
# a virtualenv of its own; writes its section of bench/RESULTS.md.
OPENCV4_VENV := bench/.venv-opencv4

$(OPENCV4_VENV)/.installed:
	python3 -m venv $(OPENCV4_VENV)
	$(OPENCV4_VENV)/bin/pip install -q 'opencv-python-headless<5' numpy
	@touch $@

bench-cpu: install $(OPENCV4_VENV)/.installed
	$(PYTHON) bench/run.py cpu

clean:
	rm -rf .installed build dist *.egg-info demo-run .pytest_cache darknet_py/kernels_bin
