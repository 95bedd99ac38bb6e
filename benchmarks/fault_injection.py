"""Damage each kind of feature-store file in turn and show that it is detected and that one rerun of the
extraction repairs exactly that branch and redoes nothing else.

    python benchmarks/fault_injection.py            # a small generated demo dataset (about 2-4 minutes on 2 cores)

For every file kind (a dense branch's features and mask, the audio's voiced track, an indexed text
branch's table and frame index, the story embeddings, a session manifest) and every damage (truncate,
overwrite bytes in place, delete, NaN written in place), on a fresh copy of an intact store:
  load     - does opening the array (what training does) raise an error naming the file?
  verify   - does the deep check (`extract.py verify=true`) report it?
  rerun    - which run repaired it: `extract` (the normal rerun) or `verify` (only the deep rerun sees it)
  redone   - the branches the repairing run re-extracted (must be exactly the damaged one; a damaged
             manifest loses the record of all of its session's branches, so all of those are redone)
  intact   - every store array byte-identical to the undamaged store afterwards
The table goes to docs/results/fault_injection.md (`--out` elsewhere, `--no-write` to print only).
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from empathic_fusion.dataset import load_dataset  # noqa: E402
from empathic_fusion.demo.generate import DemoConfig, generate_demo  # noqa: E402
from empathic_fusion.features.extract import extract_features  # noqa: E402
from empathic_fusion.features.store import DATASET_KEY, FeatureStore, StoreIntegrityError  # noqa: E402
from results import Measures, add_output_arguments, quiet_machine_guard, write_results  # noqa: E402

FEATURES = {"text": {"model_path": None, "speakers": ["participant"], "batch_size": 64, "device": "cpu"}}
MODALITIES = ["video", "audio", "text"]
# (owner index or dataset, branch, file): one of each kind of file the store holds
TARGETS = [(1, "face", "features"), (1, "face", "mask"), (2, "audio", "features"), (2, "audio", "voiced"),
           (0, "text", "utterances"), (0, "text", "frame_utterance"), (None, "stories", "embeddings"),
           (1, None, "manifest")]
DAMAGES = ("truncate", "overwrite", "delete", "nan")


def damage(path: Path, how: str) -> bool:
    """Damage one file; False when the damage does not apply (NaN in an integer array or JSON)."""
    if how == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif how == "overwrite":
        raw = bytearray(path.read_bytes())
        middle = len(raw) // 2 + 64 if path.suffix == ".npy" else len(raw) // 2
        raw[middle: middle + 16] = bytes(range(97, 113))  # same size, same header: only contents change
        path.write_bytes(bytes(raw))
    elif how == "delete":
        path.unlink()
    else:
        if path.suffix != ".npy":
            return False
        array = np.load(path, mmap_mode="r+")
        if array.dtype.kind != "f":
            return False
        array.reshape(-1)[array.size // 3: array.size // 3 + 7] = np.nan
        array.flush()
    return True


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.npy"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--participants", type=int, default=3)
    parser.add_argument("--workdir", default=None)
    add_output_arguments(parser, "fault_injection")
    args = parser.parse_args()
    quiet_machine_guard(args, Measures.ACCURACY)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="fault_injection_"))
    config = DemoConfig(n_participants=args.participants, sessions_per_participant=1, warm_up_s=1.0, story_share_s=8.0,
                        story_receive_s=1.0, reflection_s=4.0, cool_down_s=1.0, seed=3)
    dataset_root = generate_demo(work / "dataset", config, workers=1)
    dataset = load_dataset(dataset_root)
    pristine = work / "pristine"
    started = time.perf_counter()
    report = extract_features(dataset, FeatureStore(pristine), MODALITIES, FEATURES, workers=1, progress=False)
    assert not report.failures, report.summary()
    print(f"intact store: {len(report.extracted)} branches extracted in {time.perf_counter() - started:.1f} s")
    intact = snapshot(pristine)
    sessions = sorted(dataset.sessions.index)
    rows, ok = [], True
    for owner_index, branch, name in TARGETS:
        owner = DATASET_KEY if owner_index is None else sessions[owner_index]
        for how in DAMAGES:
            store_root = work / "damaged"
            shutil.rmtree(store_root, ignore_errors=True)
            shutil.copytree(pristine, store_root)
            store = FeatureStore(store_root)
            path = (store.owner_dir(owner) / "manifest.json" if branch is None
                    else store.branch_dir(owner, branch) / f"{name}.npy")
            if not damage(path, how):
                continue
            label = "manifest.json" if branch is None else f"{branch}/{name}.npy"
            try:
                if branch is None:
                    store.manifest(owner)
                else:
                    store.load(owner, branch, name)
                on_load = "-"
            except StoreIntegrityError as error:
                on_load = "named" if str(path) in str(error) else "error"
            store = FeatureStore(store_root)
            if branch is None:
                try:
                    found = not store.manifest(owner)  # a deleted manifest reads as empty
                except StoreIntegrityError:
                    found = True
            else:
                found = bool(store.check_branch(owner, branch, deep=True))
            repaired_by, redone = "not repaired", []
            for mode, verify in (("extract", False), ("verify", True)):
                run = extract_features(dataset, FeatureStore(store_root), MODALITIES, FEATURES, workers=1,
                                       progress=False, verify=verify)
                if run.extracted:
                    repaired_by, redone = mode, sorted(run.extracted)
                    break
            expected = ([(owner, b) for b in ("audio", "face", "text")] if branch is None else [(owner, branch)])
            identical = snapshot(store_root) == intact
            good = found and identical and redone == sorted(expected)
            ok &= good
            rows.append((label, how, on_load, "yes" if found else "NO", repaired_by,
                         ", ".join(b for _, b in redone) or "-", "yes" if identical else "NO", "ok" if good else "FAIL"))
    header = ("file", "damage", "load", "verify", "repaired by", "redone", "intact", "result")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths)) + " |"
             for row in [header, tuple("-" * w for w in widths), *rows]]
    lines += ["", f"{sum(r[-1] == 'ok' for r in rows)}/{len(rows)} damages detected and repaired exactly "
              f"(load: 'named' = opening the array raised an error naming the file; '-' = only the deep check sees it)"]
    print("\n".join(lines))
    write_results(args, "Feature store fault injection", "\n".join(lines))
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
