# Two commands on a fresh machine with Python 3.11 and pip:
#   make train   # venv + install, then train on the demo data (generated on first use)
#   make test    # venv + install, then the test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install train test clean-data

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned: an unpinned torch would pull a multi-GB CUDA build
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

train: $(STAMP)
	$(PY) train.py experiment=demo $(ARGS)

test: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q $(ARGS)

clean-data:
	rm -rf data/demo data/features
