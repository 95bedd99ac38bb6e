#!/usr/bin/env bash
# Every GPU measurement of the project in one run of at most 9 minutes on one H100 (GPU_CHECK_BUDGET seconds,
# default 540), each part with its own time limit inside that budget, so a lent GPU machine is used in one
# call (../shared/GPU_CHECKLIST.md; docs/scaling.md). The step timings run first, alone on the machine, in
# under 4 minutes (models_vs_mmsa and step_overhead: eager and graphed, per precision, with the kernel
# counts), so a second call can rerun them after a fix; then the grid and the paper's grid sweep end to end
# (benchmarks/sweep_cost.py); then the GPU tests, train.py and the
# text sweep side by side; then a profiler trace of a step with the time left. Each part's results and logs
# are copied to $OUT as soon as it ends, so a call stopped at its limit still brings back what finished.
#
#   python benchmarks/gpu_pack.py          # here: what a bare GPU machine lacks, in .gpu_pack/ (under 64 MiB)
#   bash benchmarks/gpu_check.sh           # there, from the checkout's root, with .gpu_pack/ beside it
#
# Writes docs/results/gpu/gpu_check.md (the GPU tests, train.py on the GPU, the fine-tuned text recipe's
# fold sweep with each fold's seconds against its 60 s target, what could not run and why; the sweep alone
# also in docs/results/gpu/gpu_check_text.md) and the GPU results of models_vs_mmsa, step_overhead and grid
# (docs/results/gpu/*.md); with $OUT set (the device tool's output folder) they are copied there too,
# with the logs. GPU_CHECK_DEVICE=cpu runs the same steps on a CPU at toy sizes, to try the script (its
# results go to $GPU_CHECK_WORK/results, not into docs/).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEVICE=${GPU_CHECK_DEVICE:-cuda}
RESULTS=${GPU_CHECK_RESULTS:-docs/results/gpu}   # GPU results, beside the CPU ones in docs/results (not remade by make results)
LOGS=logs/gpu_check
WORK=${GPU_CHECK_WORK:-/tmp/empathic_gpu_check}
rm -rf "$LOGS"   # this check's logs only: a run folder left by an earlier check would be resumed, its results reported
mkdir -p "$LOGS" "$WORK"
SUMMARY=$LOGS/summary.md
: > "$SUMMARY"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

# restored there only: a restore here (a CPU try) would leave its unpacked folders in the pack, which then
# outgrows what one call may carry
if [ -d .gpu_pack ] && [ "$DEVICE" = cuda ]; then
  PACK_ENV=$($PY benchmarks/gpu_pack.py --restore) || { echo "restoring .gpu_pack failed"; exit 1; }
  eval "$PACK_ENV"
  [ -f .gpu_pack/commit ] && export EMPATHIC_FUSION_COMMIT=$(cat .gpu_pack/commit)
fi
if [ "$DEVICE" = cuda ]; then
  # runs at once: 1, 2 and 4 TFN runs, each with 250 steps for a steady-state window of 200 or more
  TRAINER=trainer=gpu; GRID="--fraction 0.05 --compare-fraction 0 --models tfn --concurrent 1,2,4 --steps 250"
  SWEEP_COST="--fraction 0.05 --seeds 1"   # train.py -m experiment=es_story_share, every cell once, one epoch
  # the timings: 32-true with TF32 and bf16-mixed, eager and graphed (model.compile=true: GPU_CHECK_PARTS=compiled)
  STEPS="--rounds 1 --steps 20 --warmup 5 --sizes paper --graphed"
  MMSA="--steps 20 --warmup 5 --precisions 32-tf32,bf16-mixed --modes eager,graphed"; STORE="0.01, 20"
  FULL_STORE="1.0, 200"; ONE_EPOCH=trainer.max_epochs=1   # the whole corpus's frames and windows, 200 sessions
  PROFILE="--steps 10 --warmup 8"
  # the recipe as shipped (conf/model/text_finetune.yaml: 5 inner folds, 3 epochs, 6 fine-tunings per fold) on
  # folds 0-2 one after another, so each fold's seconds are its own: the target is 60 s per fold
  SWEEP="data.cv_fold=0,1,2 hydra.launcher.n_jobs=1"
else
  TRAINER="trainer=cpu trainer.max_epochs=1"; GRID="--fraction 0.001 --sessions 4 --compare-fraction 0 --models tfn --concurrent 1,2 --steps 2 --allow-busy"
  SWEEP_COST="--fraction 0.002 --sessions 4 --models tfn,mean --subsets t,v+a+t --seeds 1 --allow-busy"
  STEPS="--rounds 1 --steps 2 --warmup 1 --sizes tiny --graphed --allow-busy"
  MMSA="--steps 1 --warmup 0 --batch-size 4 --frames 8 --modes eager,graphed --allow-busy"
  PROFILE="--steps 2 --warmup 1 --batch-size 4 --frames 8 --models tfn --allow-busy"
  RESULTS=$WORK/results; STORE="0.002, 10"; FULL_STORE="0.002, 4"; ONE_EPOCH=""; SWEEP="data.cv_fold=0,1 hydra.launcher.n_jobs=2 data.max_rows=200 trainer.max_epochs=2 model.net.experts.2.inner_folds=2 model.net.experts.2.epochs=1 model.net.experts.2.trainable_layers=1"
fi

mkdir -p "$RESULTS"
BUDGET=${GPU_CHECK_BUDGET:-540}   # seconds for the whole check: a device call may run 600
REPORT_SECONDS=20                 # kept back for the report and the copy to $OUT

# GPU_CHECK_PARTS picks parts (default all but compiled): tests train text full mmsa steps grid mps sweep profile compiled; GPU_CHECK_TEXT adds overrides to
# the text sweep (the report shows the command and says which folds took 60 s or less) and GPU_CHECK_TEXT_LIMIT
# sets its time limit (default 240 s: 3 folds of 60 s and a minute of start-up; cut to the budget left);
# GPU_CHECK_RESULTS writes the results elsewhere (a partial rerun beside a full one)
PARTS=" ${GPU_CHECK_PARTS:-tests train text full mmsa steps grid mps sweep profile} "
SWEEP="$SWEEP ${GPU_CHECK_TEXT:-}"
wanted() { [[ "$PARTS" == *" $1 "* ]]; }

# ship: the results and logs so far to $OUT (the device tool's output folder), after every part
ship() {
  [ -n "${OUT:-}" ] || return 0
  find "$RESULTS" -maxdepth 1 -name '*.md' -newer "$LOGS/header.md" -exec cp {} "$OUT"/ \;   # this check's files only
  # written aside, then renamed: parts side by side may ship at once
  tar czf "$OUT/logs.$BASHPID.tgz" --exclude='*.ckpt' "$LOGS" 2>/dev/null && mv -f "$OUT/logs.$BASHPID.tgz" "$OUT/gpu_check_logs.tar.gz"
  return 0
}

# within SECONDS: the smaller of SECONDS and what the budget has left (less the report's share), at least 1
within() {
  local left=$((BUDGET - REPORT_SECONDS - SECONDS))
  [ "$1" -lt "$left" ] && left=$1
  [ "$left" -lt 1 ] && left=1
  echo "$left"
}

# part NAME SECONDS COMMAND...: run with a time limit (cut to the budget left), log to $LOGS/NAME.log, a line
# in the summary, then ship
part() {
  local name=$1 limit; limit=$(within "$2"); shift 2
  local began=$SECONDS
  timeout --kill-after=10 "$limit" "$@" > "$LOGS/$name.log" 2>&1
  local status=$?
  local outcome="passed"
  [ $status -eq 124 ] || [ $status -eq 137 ] && outcome="stopped at its ${limit} s limit"
  [ $status -ne 0 ] && [ "$outcome" = passed ] && outcome="failed (exit status $status)"
  echo "| $name | $outcome | $((SECONDS - began)) s |" >> "$SUMMARY"
  echo "$name: $outcome ($((SECONDS - began)) s)"
  ship
  return $status
}

{
  echo "# GPU check"; echo
  echo "- machine: $($PY -c 'import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "| torch", torch.__version__, "| CUDA", torch.version.cuda)') | $(nproc) CPU cores | Python $($PY -c 'import platform; print(platform.python_version())')"
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "- commit: $($PY -c 'import sys; sys.path.insert(0, "benchmarks"); from results import commit; print(commit())')"
  echo "- command: \`$(env | grep -E '^GPU_CHECK_(PARTS|TEXT|TEXT_LIMIT|DEVICE|BUDGET)=' | sort | sed -E 's/=(.*)/="\1"/' | tr '\n' ' ')bash benchmarks/gpu_check.sh\`"; echo
  echo "| part | outcome | seconds |"; echo "|---|---|---|"
} > "$LOGS/header.md"

# The synthetic store train.py reads below (a store in the real format; grid.py writes its own).
$PY -c "import sys; sys.path.insert(0, '.'); from benchmarks.grid import write_synthetic; \
write_synthetic(__import__('pathlib').Path('$WORK/store'), $STORE, {'face': 1451, 'audio': 65, 'text': 384})" \
  > "$LOGS/store.log" 2>&1

# 1. Step timings, one at a time and first, while nothing else runs, in under 4 minutes: our nets (eager and graphed)
#    against MMSA's per precision with the kernel counts, and the step through the Trainer (eager, graphed) from a
#    store; model.compile=true on request (its compilation alone takes minutes). Then the grid.
MMSA_DIR=.gpu_pack/mmsa; [ -d "$MMSA_DIR" ] || MMSA_DIR=../shared/anchors/mmsa
wanted mmsa && part models_vs_mmsa 110 $PY benchmarks/models_vs_mmsa.py --device $DEVICE $MMSA --mmsa $MMSA_DIR \
  --out $RESULTS/models_vs_mmsa.md
wanted steps && part step_overhead 110 $PY benchmarks/step_overhead.py --device $DEVICE $STEPS --out $RESULTS/step_overhead.md
wanted compiled && part step_overhead_compiled 150 $PY benchmarks/step_overhead.py --device $DEVICE $STEPS --compile \
  --compile-models tfn --out $RESULTS/step_overhead_compiled.md
wanted grid && part grid 150 $PY benchmarks/grid.py --device $DEVICE $GRID --work "$WORK" --out $RESULTS/grid.md
# the same runs at once under NVIDIA's Multi-Process Service (docs/scaling.md), its daemon started for this part
# only and stopped after it, also when the part is stopped at its limit
grid_mps() {
  command -v nvidia-cuda-mps-control > /dev/null || { echo "nvidia-cuda-mps-control is not on this machine"; return 1; }
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d || return 1
  $PY benchmarks/grid.py --device $DEVICE $GRID --work "$WORK" --out $RESULTS/grid_mps.md
}
export CUDA_MPS_PIPE_DIRECTORY=$WORK/mps_pipe CUDA_MPS_LOG_DIRECTORY=$WORK/mps_log
export -f grid_mps; export PY DEVICE GRID RESULTS   # bash -c sees exported names only
if wanted mps && [ "$DEVICE" = cuda ]; then
  part grid_mps 150 bash -c grid_mps
  echo quit | nvidia-cuda-mps-control > /dev/null 2>&1
fi
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
wanted sweep && part sweep_cost 100 $PY benchmarks/sweep_cost.py --device $DEVICE $SWEEP_COST --work "$WORK/sweep_cost" \
  --out $RESULTS/sweep_cost.md

# 2. Not timed, side by side in the time left: the GPU tests, train.py on the GPU (LF-LSTM v+a+t as the demo trains, TFN v+t)
#    on a synthetic store in the real format, and the fine-tuned text recipe's fold sweep on EmpatheticExchanges
#    (hydra/launcher=shared_device; on the GPU one fold at a time, each timed against its 60 s target).
DATA="data=empathic_stories data.dataset_dir=$WORK/store/dataset data.store_dir=$WORK/store/store logger=csv"
GPU_TESTS=$(grep -l "mark.gpu" tests/test_*.py | tr '\n' ' ')
wanted tests && part pytest_gpu 170 $PY -m pytest -v -m gpu -n 3 -p no:cacheprovider $GPU_TESTS &
TABLE=$PWD/.gpu_pack/text/EmpatheticExchanges_5ES.csv; [ -f "$TABLE" ] || TABLE=$PWD/../shared/data/empathetic_exchanges/EmpatheticExchanges_5ES.csv
SWEEP_DIR=$LOGS/text_finetune_sweep
echo "train.py -m experiment=text_empathetic_exchanges_finetune $TRAINER hydra/launcher=shared_device $SWEEP" > "$LOGS/text_command.txt"
wanted text && part text_finetune_sweep ${GPU_CHECK_TEXT_LIMIT:-240} $PY train.py -m experiment=text_empathetic_exchanges_finetune $TRAINER \
  data.path=$TABLE hydra/launcher=shared_device $SWEEP model.robustness.n_texts=0 logger=csv \
  hydra.sweep.dir=$SWEEP_DIR &
# a store of the whole corpus's size (synthetic, in the store's format) written there, then one short epoch of
# train.py: its log says whether the frame arrays were placed in the GPU's memory
full_corpus() {
  $PY - <<EOF || return 1
import sys, time, pathlib
sys.path.insert(0, ".")
from benchmarks.grid import disk_gb, write_synthetic
began, work = time.perf_counter(), pathlib.Path("$WORK/full")
write_synthetic(work, $FULL_STORE, {"face": 1451, "audio": 65, "text": 384})
print(f"synthetic store ($FULL_STORE: fraction of EmpathicStories++, sessions): {disk_gb(work / 'store' / 'sessions'):.2f} GB "
      f"on disk, written in {time.perf_counter() - began:.0f} s")
EOF
  $PY train.py $TRAINER data=empathic_stories data.dataset_dir=$WORK/full/dataset data.store_dir=$WORK/full/store \
    logger=csv evaluation=lean $ONE_EPOCH trainer.limit_train_batches=20 trainer.limit_val_batches=2 \
    trainer.limit_test_batches=5 hydra.run.dir=$LOGS/train_full_corpus
}
export -f full_corpus; export PY WORK TRAINER FULL_STORE ONE_EPOCH LOGS
wanted full && part train_full_corpus 240 bash -c full_corpus &
if wanted train; then
  part train_lf_lstm 100 $PY train.py $TRAINER $DATA hydra.run.dir=$LOGS/train_lf_lstm
  part train_tfn_v+t 70 $PY train.py $TRAINER $DATA model=tfn modality=v+t hydra.run.dir=$LOGS/train_tfn
  part train_tfn_step_graph 70 $PY train.py $TRAINER $DATA model=tfn model.step_graph=true \
    hydra.run.dir=$LOGS/train_tfn_step_graph
fi
wait
# a part stopped at its limit may leave worker processes (a launcher's) on the GPU: none may outlive the check
if command -v nvidia-smi > /dev/null; then
  for pid in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
fi

# 3. With the time left, alone again: a torch.profiler trace of a few steps, eager and graphed (kernels, device time,
#    the device's idle share).
wanted profile && part step_profile 60 $PY benchmarks/step_profile.py --device $DEVICE $PROFILE --out $RESULTS/step_profile.md

# The report: the parts, then what each produced.
$PY benchmarks/gpu_check_report.py "$LOGS" "$RESULTS/gpu_check.md" > "$LOGS/report.log" 2>&1 || cat "$LOGS/report.log"

ship
cat "$RESULTS/gpu_check.md"
