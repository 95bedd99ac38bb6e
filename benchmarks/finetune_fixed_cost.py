"""What a fit of the fine-tuned encoder expert costs beyond its steps, before and after a change, side by side.

    python benchmarks/finetune_fixed_cost.py                    # this machine's CPU, against commit 219e136
    python benchmarks/finetune_fixed_cost.py --ref HEAD --repeats 1 --no-write

FineTunedEncoderExpert.fit (empathic_fusion/models/text/finetuned_expert.py) fine-tunes `inner_folds + 1` copies of
the encoder. Everything a fit does besides the optimisation steps and the held-out predictions (loading the
encoder, tokenising, building nets and batches, copying predictions back) is paid once per fine-tuning or
per batch whatever the table's size: the fixed cost. Each version's fit runs in a fresh process on a small
generated table (empathic_fusion/demo/generated_table.py, `--writers` writers so every inner fold is grouped):
"before" is the fit of `--ref`, its package unpacked with `git archive` into a temporary folder and put first
on PYTHONPATH; "after" is the working tree's. A third process times the steps alone on the working tree: the
same fine-tunings' forward, backward and optimizer steps on the same rows in the same batches, and the same
held-out predictions, on one net loaded before the clock starts, with the texts tokenised before it too.
fixed = the fit's wall time - the steps' time, per repeat; the table gives medians over `--repeats` rounds,
each round running the three processes one after another. Every process builds a SentenceEncoder before
timing (the imports and the folder's facts, which a training run has paid by the time it fits the experts).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# benchmarks/ (results.py), not the checkout: a child process imports empathic_fusion from its PYTHONPATH
sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import Measures, add_output_arguments, quiet_machine_guard, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_REF = "219e136"


def _table(args: argparse.Namespace) -> tuple[list[str], Any, list[str]]:
    """The generated table's texts, standardised targets (N x 1) and writers."""
    import numpy as np

    from empathic_fusion.demo.generated_table import make_text_table

    table = make_text_table(n_writers=args.writers, turns_per_writer=args.turns, seed=0)
    y = table["emotional"].to_numpy(np.float32)[:, None]
    return table["text"].tolist(), (y - y.mean()) / y.std(), table["writer"].tolist()


def _expert(args: argparse.Namespace) -> Any:
    from empathic_fusion.models.text.finetuned_expert import FineTunedEncoderExpert

    expert = FineTunedEncoderExpert(trainable_layers=args.trainable_layers, max_length=args.max_length,
                                    epochs=args.epochs, batch_size=args.batch_size, inner_folds=args.inner_folds,
                                    seed=0)
    expert.expand(["text"], 384)
    return expert


def _warm(args: argparse.Namespace) -> None:
    """What a training run has done before it fits the experts: the imports and the encoder folder's facts."""
    from empathic_fusion.core.sentence_encoder import SentenceEncoder

    SentenceEncoder(None, trainable_layers=args.trainable_layers, max_length=args.max_length)


def child_fit(args: argparse.Namespace) -> dict[str, Any]:
    """One FineTunedEncoderExpert.fit of the version on PYTHONPATH, timed whole."""
    import empathic_fusion

    texts, y, groups = _table(args)
    _warm(args)
    expert = _expert(args)
    start = time.perf_counter()
    expert.fit({"texts": {"text": texts}}, y, groups)
    return {"seconds": time.perf_counter() - start, "package": str(Path(empathic_fusion.__file__).parent)}


def child_steps(args: argparse.Namespace) -> dict[str, Any]:
    """The fit's steps and held-out predictions alone (the working tree's), on one net loaded and texts
    tokenised before the clock starts."""
    import numpy as np

    import empathic_fusion
    from empathic_fusion.models.text.experts import grouped_folds

    texts, y, groups = _table(args)
    _warm(args)
    expert = _expert(args)
    net = expert._new_net(1, expert._spec())
    tokens = net.tokenize({"text": texts})
    folds = grouped_folds(groups, expert.inner_folds, type(expert).__name__)
    runs = [(train, test) for train, test in folds] + [(np.arange(len(texts)), None)]
    start = time.perf_counter()
    for k, (train, test) in enumerate(runs):
        expert._steps(net, tokens, y, train, expert.seed + k)
        if test is not None:
            expert._predict(net, tokens, test)
    seconds = time.perf_counter() - start
    steps = sum(args.epochs * -(-len(train) // args.batch_size) for train, _ in runs)
    return {"seconds": seconds, "steps": steps, "fine_tunings": len(runs), "rows": len(texts),
            "package": str(Path(empathic_fusion.__file__).parent)}


def _child_arguments(args: argparse.Namespace) -> list[str]:
    return [f"--writers={args.writers}", f"--turns={args.turns}", f"--epochs={args.epochs}",
            f"--inner-folds={args.inner_folds}", f"--trainable-layers={args.trainable_layers}",
            f"--max-length={args.max_length}", f"--batch-size={args.batch_size}"]


def run_child(args: argparse.Namespace, mode: str, source: Path) -> dict[str, Any]:
    """A child process (`--child mode`) with `source`'s package first on PYTHONPATH; its JSON result."""
    env = {**os.environ, "PYTHONPATH": str(source), "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", mode, *_child_arguments(args)],
                          cwd=tempfile.gettempdir(), env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the {mode} process on {source} failed (exit status {done.returncode}):\n"
                         f"{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if Path(result["package"]).resolve() != (source / "empathic_fusion").resolve():
        raise SystemExit(f"the {mode} process imported {result['package']}, not {source / 'empathic_fusion'}")
    return result


def unpack(ref: str, into: Path) -> str:
    """`ref`'s empathic_fusion package unpacked into `into`; the full commit hash."""
    commit = subprocess.run(["git", "rev-parse", f"{ref}^{{commit}}"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    archive = subprocess.run(["git", "archive", commit, "empathic_fusion"], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return commit


def report(args: argparse.Namespace, commit: str, rounds: list[dict[str, Any]]) -> str:
    """The table (medians over the rounds) and what was run."""
    steps = rounds[0]["steps"]
    step_seconds = statistics.median(r["steps"]["seconds"] for r in rounds)
    lines = [f"One FineTunedEncoderExpert.fit on a generated table of {steps['rows']} rows ({args.writers} writers x "
             f"{args.turns} texts, `make_text_table`): {args.inner_folds} grouped inner folds + the final fit = "
             f"{steps['fine_tunings']} fine-tunings, {steps['steps']} optimizer steps in all (epochs {args.epochs}, "
             f"batch {args.batch_size}, top {args.trainable_layers} layers of the packaged MiniLM trained, window "
             f"{args.max_length} tokens), on the CPU. Medians over {len(rounds)} rounds; each round runs the "
             "before fit, the after fit and the steps alone, each in a fresh process.", "",
             "| version | fit wall s | steps s | fixed s | fixed per fine-tuning s |", "|---|---|---|---|---|"]
    for name, label in (("before", f"before ({commit[:7]})"), ("after", "after (working tree)")):
        wall = statistics.median(r[name]["seconds"] for r in rounds)
        fixed = [r[name]["seconds"] - r["steps"]["seconds"] for r in rounds]
        spread = f" ({min(fixed):.2f} to {max(fixed):.2f})" if len(rounds) > 1 else ""
        lines.append(f"| {label} | {wall:.2f} | {step_seconds:.2f} | {statistics.median(fixed):.2f}{spread} | "
                     f"{statistics.median(fixed) / steps['fine_tunings']:.2f} |")
    lines += ["", "fixed = the fit's wall time - the steps' time in the same round (the range over the rounds in "
              "brackets). The steps: the same fine-tunings' forward, backward and optimizer steps on the same rows "
              "in the same batches, and the held-out predictions, timed on one net loaded and with the texts "
              "tokenised before the clock starts (`FineTunedEncoderExpert._steps` and `_predict` of the working "
              "tree). Per round, seconds (before fit, after fit, steps): "
              + "; ".join(f"{r['before']['seconds']:.2f}, {r['after']['seconds']:.2f}, {r['steps']['seconds']:.2f}"
                          for r in rounds)]
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", default=DEFAULT_REF, help=f"the git ref whose fit is 'before' (default {DEFAULT_REF})")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of before fit, after fit and steps (default 3)")
    parser.add_argument("--writers", type=int, default=24, help="writers of the generated table (default 24)")
    parser.add_argument("--turns", type=int, default=2, help="texts per writer (default 2)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--inner-folds", type=int, default=5)
    parser.add_argument("--trainable-layers", type=int, default=6)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--child", choices=("fit", "steps"), help=argparse.SUPPRESS)
    add_output_arguments(parser, "finetune_fixed_cost")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> str:
    args = parse(argv)
    if args.child:  # a child process: one measurement, as a JSON line
        print(json.dumps(child_fit(args) if args.child == "fit" else child_steps(args)))
        return ""
    quiet_machine_guard(args, Measures.TIME)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="finetune_fixed_cost_") as folder:
        before = Path(folder)
        commit = unpack(args.ref, before)
        for k in range(args.repeats):
            rounds.append({"before": run_child(args, "fit", before), "after": run_child(args, "fit", ROOT),
                           "steps": run_child(args, "steps", ROOT)})
            print(f"round {k + 1}/{args.repeats}: before {rounds[-1]['before']['seconds']:.2f} s, after "
                  f"{rounds[-1]['after']['seconds']:.2f} s, steps {rounds[-1]['steps']['seconds']:.2f} s", flush=True)
    body = report(args, commit, rounds)
    print(body)
    write_results(args, "What a fine-tuned expert's fit costs beyond its steps, before and after", body)
    return body


if __name__ == "__main__":
    main()
