"""What `python extract.py` runs: bring a dataset's store up to date, then print what it holds.

Three ways in: one process (`extract.py`), one shard of a multirun (`extract.py -m shards=16` or
`-m shard=0/16,...,15/16`, one job per shard through any Hydra launcher), or `merge=true`. Each shard
job leaves `extraction.json` (its store and shard) in its job folder; when the multirun ends,
`ShardMergeReport` (a Hydra callback, conf/extract.yaml) merges the shards' failure reports and hash
caches of every store the jobs wrote (`FeatureStore.merge_shards`), prints the failures of all shards
together and exits with status 1 when any failed, as a single run does. `extract.py merge=true` does
the same merge by hand, e.g. after a sweep whose launching process did not live to its end.
"""
from __future__ import annotations

import json
import logging
import shlex
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from empathic_fusion.config import with_defaults
from empathic_fusion.config.checks import ConfigError
from empathic_fusion.core.branches import BRANCHES, branch_width
from empathic_fusion.features.branch_unit import branch_unit
from empathic_fusion.features.extract import ExtractionReport, extract_features, parse_shard
from empathic_fusion.features.store import DATASET_KEY, FAILURES, HASH_CACHE, FeatureStore, ShardMerge, shard_file
from empathic_fusion.utils.multirun import collect_failures, in_multirun, sweep_job
from empathic_fusion.utils.run_output import warn_data

log = logging.getLogger(__name__)

JOB_RECORD = "extraction.json"  # in each multirun job's folder: which store and shard the job filled


def branch_dims(store: FeatureStore, branches: list[str]) -> dict[str, dict]:
    """Per-frame width, dtype, session count and frame count of each branch, read from the manifests."""
    table: dict[str, dict] = {}
    sessions = sorted(p.name for p in (store.root / "sessions").glob("*") if p.is_dir())
    for sid in sessions:
        for branch in branches:
            entry = store.entry(sid, branch)
            if entry is None:
                continue
            row = table.setdefault(branch, {"dim": branch_width(branch, entry),
                                            "dtype": entry["arrays"][BRANCHES[branch].vectors]["dtype"],
                                            "extractor": entry["signature"]["extractor"], "sessions": 0, "frames": 0})
            row["sessions"] += 1
            row["frames"] += int(entry.get("n_frames", 0))
    stories = store.entry(DATASET_KEY, "stories")
    if stories is not None:
        shape = stories["arrays"]["embeddings"]["shape"]
        table["stories"] = {"dim": int(shape[1]), "dtype": stories["arrays"]["embeddings"]["dtype"],
                            "extractor": stories["signature"]["extractor"], "sessions": "-",
                            "frames": f"{int(shape[0])} stories"}
    return table


def format_dims(table: dict[str, dict], modalities: dict[str, list[str]]) -> str:
    lines = ["| branch | per-frame dim | dtype | extractor | sessions | frames |", "|---|---|---|---|---|---|"]
    # stories are per story, not per frame: their row counts stories
    lines += [f"| {b} | {r['dim']} | {r['dtype']} | {r['extractor']} | {r['sessions']} | {r['frames']} |"
              for b, r in table.items()]
    for modality, names in modalities.items():
        if all(b in table for b in names):
            lines.append(f"{modality} = {' + '.join(names)} = {sum(table[b]['dim'] for b in names)} per frame")
    return "\n".join(lines)


def run_extraction(cfg: DictConfig) -> ExtractionReport:
    """Generate the demo when asked, validate the dataset, extract, print the summary and branch dims."""
    from empathic_fusion.config import validate
    from empathic_fusion.dataset import load_dataset

    validate(cfg)
    data = OmegaConf.to_container(cfg.data, resolve=True)
    features = with_defaults(OmegaConf.to_container(cfg.features, resolve=True))
    modalities = list(cfg.modality.names)
    branches = list(cfg.branches) if cfg.branches else None
    for name in branches or ():
        branch_unit(name)  # a mistyped name stops the run here, before the demo is generated or a file is read
        # (the unit registry, not the core one: it first imports the package's extractor files, which register theirs)
    prepare_demo(cfg)
    store = FeatureStore(data["store_dir"])
    # features need no ratings: new recordings are extracted before anyone has rated them (empathic-predict)
    dataset = load_dataset(Path(data["dataset_dir"]), None if cfg.branches else modalities,
                           bool(data["allow_shared_media"]), store.file_hash, ratings_required=False)
    for warning in dataset.warnings:
        warn_data(warning)
    report = extract_features(dataset, store, modalities, features, workers=int(cfg.workers),
                              progress=bool(cfg.progress), shard=parse_shard(cfg.shard), branches=branches,
                              verify=cfg.verify, lock=cfg.lock, lock_timeout=cfg.lock_timeout)
    shown = branches or [b for m in modalities for b in features["modalities"][m]]
    for warning in report.warnings:
        warn_data(warning)
    print(report.summary())
    print(f"\nfeature store {store.root}:")
    print(format_dims(branch_dims(store, shown), {m: features["modalities"][m] for m in modalities}))
    shard = parse_shard(cfg.shard)
    if report.failures:
        print(f"\n{len(report.failures)} failure(s) listed in {store.root / shard_file(FAILURES, shard)}"
              if report.failures_saved else f"\n{len(report.failures)} failure(s), listed above (the store is "
                                            f"read-only: no failure report was written)")
    if shard is not None and not in_multirun():  # a multirun's end merges the shards by itself
        note = shard_merge_note(store, shard)
        if note:
            print(f"\n{note}")
    return report


def shard_merge_note(store: FeatureStore, shard: tuple[int, int]) -> str | None:
    """What a single shard run (`extract.py shard=i/n`, no multirun) leaves beside the merged files, and the
    command that merges them once every shard has finished; None when it left none."""
    files = [shard_file(stem, shard) for stem in (FAILURES, HASH_CACHE)
             if (store.root / shard_file(stem, shard)).exists()]
    if not files:
        return None
    merged = " and ".join(f"{stem}.json" for stem in (FAILURES, HASH_CACHE))
    return (f"shard {shard[0]}/{shard[1]}: its {' and '.join(files)} stay in {store.root} until the shards are merged "
            f"into {merged}; when all {shard[1]} shards have finished, run: python extract.py merge=true "
            f"data.store_dir={shlex.quote(str(store.root))} shards={shard[1]}")


def prepare_demo(cfg: DictConfig) -> None:
    """Generate the demo dataset when the data config asks for it (reused when already there). A
    multirun does this once before its jobs start: shards generating it at once would replace each
    other's copy while reading it."""
    if cfg.data.demo:
        from empathic_fusion.demo.generate import DemoConfig, generate_demo

        generate_demo(Path(cfg.data.dataset_dir), DemoConfig(**OmegaConf.to_container(cfg.data.demo, resolve=True)),
                      workers=int(cfg.workers))


def extract_command(cfg: DictConfig) -> bool:
    """What `extract.py` runs; True when it must exit with status 1 (a failed session or branch, or an
    unfinished shard). A multirun job never does: the sweep's end merges the shards and decides."""
    if cfg.merge:
        return merge_command(cfg)
    if in_multirun():
        sweep_job(_shard_job, cfg)  # a job that raises is recorded in the sweep folder; the other shards go on
        return False
    if cfg.shards is not None:
        raise ConfigError([f"shards={cfg.shards}: runs one job per shard as a multirun; add -m (extract.py -m "
                           f"shards={cfg.shards} ...), use shard=i/{cfg.shards} for one shard, or merge=true to "
                           f"merge finished shards"])
    return bool(run_extraction(cfg).failures)


def _shard_job(cfg: DictConfig) -> ExtractionReport:
    """One job of an extraction multirun: extract, then record the store and shard for the sweep's end."""
    shard = parse_shard(cfg.shard)
    if cfg.shards is not None and (shard is None or shard[1] != int(cfg.shards)):
        raise ConfigError([f"shard={cfg.shard}: must be i/{cfg.shards} when shards={cfg.shards}"])
    report = run_extraction(cfg)
    record = {"store": str(Path(str(cfg.data.store_dir)).resolve()), "shard": list(shard) if shard else None,
              "extracted": len(report.extracted), "up_to_date": len(report.up_to_date),
              "failures": len(report.failures)}
    (Path(HydraConfig.get().runtime.output_dir) / JOB_RECORD).write_text(json.dumps(record, indent=1))
    return report


def merge_command(cfg: DictConfig) -> bool:
    """`extract.py merge=true [shards=N]`: merge the shards' reports and caches in the store (of the
    shard count last written unless shards=N), print them; True when a shard failed or is missing."""
    store = FeatureStore(str(cfg.data.store_dir))
    counts = [int(cfg.shards)] if cfg.shards is not None else store.shard_counts()
    if not counts:
        print(f"no shard failure reports ({FAILURES}-shard<i>of<n>.json) in {store.root}: nothing to merge")
        return True
    if len(counts) > 1:
        print(f"shard reports of {counts} shards in {store.root}; merging the latest, {counts[0]} (shards=N picks one)")
    with store.writing(lock=cfg.lock, timeout=cfg.lock_timeout,  # not while shards still write their reports
                       what="merging the shards writes failures.json and file_hashes.json there"):
        merge = store.merge_shards(counts[0])
    print(merge.summary())
    return bool(merge.failures or merge.missing)


def merge_sweep(sweep_dir: Path) -> tuple[list[ShardMerge], list[dict[str, Any]]]:
    """Merge every store the shard jobs of a sweep wrote (from their job records); also return the
    records, so jobs that were not sharded are counted too."""
    records = [json.loads(p.read_text()) for p in sorted(Path(sweep_dir).rglob(JOB_RECORD))]
    finished: dict[tuple[str, int], set[int]] = {}
    for record in records:
        if record["shard"] is not None:
            index, count = record["shard"]
            finished.setdefault((record["store"], count), set()).add(index)
    merges = [FeatureStore(store).merge_shards(count, done) for (store, count), done in sorted(finished.items())]
    return merges, records


class ShardMergeReport(Callback):
    """Hydra callback of extract.py: the demo made once before the jobs start; at the multirun's end the
    shards' failures merged and printed, and exit status 1 when any session, branch or job failed
    (conf/extract.yaml lists it before failure_report, so it runs after that one has listed failed jobs)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not config.merge:
            prepare_demo(config)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        merges, records = merge_sweep(sweep_dir)
        for merge in merges:
            print(merge.summary())
        failed_jobs = collect_failures(sweep_dir)
        if failed_jobs:
            print(f"{len(failed_jobs)} job(s) of the sweep failed: {sweep_dir / 'failures.json'}")
        unsharded = [r for r in records if r["shard"] is None and r["failures"]]
        if failed_jobs or unsharded or any(m.failures or m.missing for m in merges):
            raise SystemExit(1)
