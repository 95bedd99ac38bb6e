"""What `python extract.py` runs: bring a dataset's store up to date, then print what it holds."""
from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from empathic_fusion.config import with_defaults
from empathic_fusion.core.branches import BRANCHES, branch_width
from empathic_fusion.features.extract import ExtractionReport, extract_features, parse_shard
from empathic_fusion.features.store import DATASET_KEY, FeatureStore
from empathic_fusion.utils.run_output import warn_data

log = logging.getLogger(__name__)


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
    if data["demo"]:
        from empathic_fusion.demo.generate import DemoConfig, generate_demo

        generate_demo(Path(data["dataset_dir"]), DemoConfig(**data["demo"]), workers=int(cfg.workers))
    store = FeatureStore(data["store_dir"])
    dataset = load_dataset(Path(data["dataset_dir"]), None if cfg.branches else modalities,
                           bool(data["allow_shared_media"]), store.file_hash)
    for warning in dataset.warnings:
        warn_data(warning)
    branches = list(cfg.branches) if cfg.branches else None
    report = extract_features(dataset, store, modalities, features, workers=int(cfg.workers),
                              progress=bool(cfg.progress), shard=parse_shard(cfg.shard), branches=branches,
                              verify=cfg.verify)
    shown = branches or [b for m in modalities for b in features["modalities"][m]]
    for warning in report.warnings:
        warn_data(warning)
    print(report.summary())
    print(f"\nfeature store {store.root}:")
    print(format_dims(branch_dims(store, shown), {m: features["modalities"][m] for m in modalities}))
    if report.failures:
        shard = parse_shard(cfg.shard)
        name = "failures.json" if shard is None else f"failures-shard{shard[0]}of{shard[1]}.json"
        print(f"\n{len(report.failures)} failure(s) listed in {store.root / name}")
    return report
