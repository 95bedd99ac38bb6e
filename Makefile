# Two commands on a fresh machine with Python 3.11 and pip:
#   make train   # venv + install, then train on the demo data (generated on first use)
#   make test    # venv + install, then the test suite
#   make test-fast  # the suite without the slow, browser and GPU tests (under 2 minutes on 2 cores)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install train test test-fast serve clean-data

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

test-fast: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not slow and not browser and not gpu" $(ARGS)

clean-data:
	rm -rf data/demo data/features

# The web app on the demo data: trains the demo fusion and text models first when they are missing.
SERVE_DIR := logs/serve_demo
$(SERVE_DIR)/fusion/checkpoints/last.ckpt: | $(STAMP)
	$(PY) train.py experiment=demo trainer.max_epochs=3 evaluation.bootstrap=0 logger=none \
	  hydra.run.dir=$(SERVE_DIR)/fusion
$(SERVE_DIR)/text/checkpoints/last.ckpt: | $(STAMP)
	$(PY) -c "from empathic_fusion.text.synthetic import make_text_table as t; import os; os.makedirs('$(SERVE_DIR)', exist_ok=True); t(40, 3, seed=0, persona_effect=True).to_csv('$(SERVE_DIR)/text_table.csv', index=False)"
	$(PY) train.py data=text_csv model=text_regressor data.path=$(SERVE_DIR)/text_table.csv data.text_columns=[text] \
	  data.label_columns=[cognitive,emotional,behavioral] data.group_column=writer \
	  data.persona_columns=[gender,empathic_concern] data.cv_folds=2 model.robustness.n_texts=0 logger=none \
	  modality=t \
	  hydra.run.dir=$(SERVE_DIR)/text

serve: $(SERVE_DIR)/fusion/checkpoints/last.ckpt $(SERVE_DIR)/text/checkpoints/last.ckpt
	$(PY) serve.py ckpt_path=$(SERVE_DIR)/fusion/checkpoints/last.ckpt text_ckpt_path=$(SERVE_DIR)/text/checkpoints/last.ckpt $(ARGS)
