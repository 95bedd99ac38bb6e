"""Does training with modality dropout make the demo model robust to missing modalities? The demo recipe
(`python train.py experiment=demo`: LF-LSTM on video + audio + text) trained with and without
`model.modality_dropout`, over seeds, and each run's missing-modality report read back.

    OMP_NUM_THREADS=1 python benchmarks/modality_dropout.py                      # docs/results/modality_dropout.md
    OMP_NUM_THREADS=1 python benchmarks/modality_dropout.py --dropout 0,0.5 --seeds 0,1,2,3,4   # other settings

Each run (`python train.py experiment=demo model.modality_dropout=P seed=N`, its own process) tests its best
validation checkpoint and writes test_metrics.json, whose "missing_modalities" summary holds r with nothing
missing, with each modality and each pair removed and with frames dropped at rates 0-0.9
(empathic_fusion/evaluation/missing_modalities.py). The results file gives, per dropout setting, mean ± sd
over seeds of the rating-level r under each condition and of the relative robustness (random and block
frame dropping), then every run. Run folders go under logs/benchmarks/modality_dropout/<time>/ (`--run-dir`
to choose; given again, the runs that finished there are read, not repeated). Extra Hydra overrides after
`--` go to every run.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from results import (  # noqa: E402
    Measures, add_output_arguments, kernel_environment, portable, quiet_machine_guard, run_resumable, write_results)

from empathic_fusion.evaluation.missing_modalities import NO_REFERENCE, relative_cell  # noqa: E402

DEFAULT_DROPOUT = (0.0, 0.1, 0.3)
DEFAULT_SEEDS = (0, 1, 2)
RECIPE = ["experiment=demo"]
FINISHED = "modality_dropout_run.json"  # written into a run folder when its run finished (to resume)


@dataclass
class Run:
    """One train.py process: its dropout, seed, missing-modality summary and wall seconds."""

    dropout: float
    seed: int
    seconds: float
    missing: dict  # test_metrics.json's "missing_modalities"
    folder: Path

    def rating_r(self, condition: str) -> float:
        """Rating-level r with nothing missing ("none") or with a removed set ("video", "video+audio")."""
        entry = self.missing["none"] if condition == "none" else self.missing["removed"][condition]
        return entry["rating"]["pearson"]

    def robustness(self, kind: str) -> float:
        return self.missing["robustness"][kind]["rating"]


def shown_command(dropout: float, seed: int | None = None, extra: Sequence[str] = ()) -> str:
    """The command as a user types it."""
    seed_part = [] if seed is None else [f"seed={seed}"]
    return " ".join(["python train.py", *RECIPE, f"model.modality_dropout={dropout:g}", *seed_part, *extra])


def run_one(dropout: float, seed: int, run_dir: Path, extra: Sequence[str]) -> Run:
    """Train and test one run in a subprocess, or read a finished one of the same command in `run_dir`."""
    command = [sys.executable, "train.py", *RECIPE, f"model.modality_dropout={dropout:g}", f"seed={seed}",
               "logger=none", *extra, f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    seconds = run_resumable(command, run_dir, FINISHED, env, shown_command(dropout, seed, extra),
                            f"run with modality_dropout={dropout:g}, seed {seed}")
    report = json.loads((run_dir / "test_metrics.json").read_text())
    if "missing_modalities" not in report:
        raise SystemExit(f"{run_dir}/test_metrics.json has no missing_modalities summary "
                         "(evaluation.missing_modalities=false?)")
    return Run(dropout, seed, seconds, report["missing_modalities"], run_dir)


def mean_sd(values: list[float]) -> str:
    """mean ± sample sd (sd 0 for one value) of the defined values (a robustness is NaN where r with nothing
    missing is not above 0), saying how many those are when some are not, and why there is none when none is."""
    defined = [v for v in values if math.isfinite(v)]
    if not defined:
        return NO_REFERENCE
    sd = statistics.stdev(defined) if len(defined) > 1 else 0.0
    count = f" ({len(defined)} of {len(values)})" if len(defined) < len(values) else ""
    return f"{statistics.fmean(defined):.3f} ± {sd:.3f}{count}"


def columns(runs: list[Run]) -> list[tuple[str, str, Callable[[Run], float]]]:
    """(header, key, value of a run) for the tables: r with nothing missing, each removed set, robustness."""
    removed = list(runs[0].missing["removed"])
    found = [("r, nothing missing", "none", lambda r: r.rating_r("none"))]
    found += [(f"r without {name}", name, (lambda name: lambda r: r.rating_r(name))(name)) for name in removed]
    found += [(f"robustness ({kind})", kind, (lambda kind: lambda r: r.robustness(kind))(kind))
              for kind in ("random", "block")]
    return found


def summary_table(runs: list[Run], settings: Sequence[float]) -> str:
    """One row per dropout setting: mean ± sd over its seeds of every column."""
    cols = columns(runs)
    lines = ["| model.modality_dropout | seeds | " + " | ".join(c[0] for c in cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    for dropout in settings:
        own = [r for r in runs if r.dropout == dropout]
        lines.append(f"| {dropout:g} | {len(own)} | " + " | ".join(mean_sd([c[2](r) for r in own]) for c in cols) + " |")
    return "\n".join(lines)


def runs_table(runs: list[Run], first_fills_store: bool) -> str:
    """One row per run: its values and wall seconds."""
    cols = columns(runs)
    lines = ["| model.modality_dropout | seed | " + " | ".join(c[0] for c in cols) + " | seconds |",
             "|---|---|" + "---|" * (len(cols) + 1)]
    for index, r in enumerate(runs):
        note = " (data generation and feature extraction included)" if index == 0 and first_fills_store else ""
        lines.append(f"| {r.dropout:g} | {r.seed} | " + " | ".join(relative_cell(c[2](r), r.rating_r("none"))
                                                                 for c in cols)
                     + f" | {r.seconds:.0f}{note} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dropout", default=",".join(f"{p:g}" for p in DEFAULT_DROPOUT),
                        help="comma-separated model.modality_dropout settings (default %(default)s)")
    parser.add_argument("--seeds", default=",".join(map(str, DEFAULT_SEEDS)), help="comma-separated (default %(default)s)")
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="folder for the runs' folders (default: logs/benchmarks/modality_dropout/<time>)")
    add_output_arguments(parser, "modality_dropout")
    args = parser.parse_args(argv)
    quiet_machine_guard(args, Measures.ACCURACY)
    settings = [float(p) for p in args.dropout.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    root = (args.run_dir or ROOT / "logs" / "benchmarks" / "modality_dropout" / time.strftime("%Y-%m-%d_%H-%M-%S")).resolve()
    store_was_empty = not (ROOT / "data" / "features").is_dir()
    runs = [run_one(p, seed, root / f"dropout_{p:g}" / f"seed_{seed}", extra) for p in settings for seed in seeds]
    first = runs[0].missing
    modalities, rates = first["modalities"], first["rates"]
    body = (f"The demo recipe (`{shown_command(settings[0], extra=extra)}` with `model.modality_dropout` set to "
            f"{', '.join(f'{p:g}' for p in settings)} and `seed=N` for N in {', '.join(map(str, seeds))}; modalities "
            f"{'+'.join(modalities)}), each run in its own process ({kernel_environment()}). In training, modality dropout "
            f"masks each modality of each window with probability p, keeping one at random where all were drawn "
            f"(so a modality is dropped with probability p - p^M / M: "
            + ", ".join(f"{p - p ** len(modalities) / len(modalities):.3f} for p = {p:g}" for p in settings if p)
            + f" with M = {len(modalities)}). Each run's best validation checkpoint is tested, then tested again "
            f"with modalities removed and with frames dropped at rates {rates[0]:g}-{rates[-1]:g} "
            f"(test_missing_modalities.csv; docs/evaluation.md). All values are rating level (a rating's windows "
            f"averaged): Pearson r, and the relative robustness, the area under r over the missing rates divided "
            f"by r with nothing missing times the rate span (1 = no loss), for frames dropped at random and in one "
            f"block per window. With this few test ratings, compare the differences to the sd over seeds.\n\n"
            f"## Mean ± sd over seeds\n\n{summary_table(runs, settings)}\n\n"
            f"## Every run\n\n{runs_table(runs, store_was_empty)}\n")
    print("\n" + portable(body))
    write_results(args, "Modality dropout on the demo: robustness to missing modalities", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
