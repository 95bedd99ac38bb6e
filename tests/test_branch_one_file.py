"""A feature branch is one file: an extractor file dropped into the `features` package (declaring its spec,
settings and extractor, and registered by nobody else) is found before Hydra composes, so its
`features.<branch>.<setting>` overrides compose; it is extracted, sized by the datamodule and trained on."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import lightning as L
import numpy as np
import pytest

import empathic_fusion.features as features_package
from empathic_fusion.core.branches import BRANCHES
from empathic_fusion.dataset import load_dataset
from empathic_fusion.features.branch_unit import forget_module, unregister_branch
from empathic_fusion.features.store import FeatureStore

TOY_MODULE = "toy_clock_branch"
TOY_DIM = 3
# the whole branch, as a contributor would write it: spec, settings and extractor in one file
TOY_SOURCE = textwrap.dedent('''
    """The toy branch: per video frame, a sine and a cosine of the session clock and a constant."""
    from __future__ import annotations

    from dataclasses import dataclass

    import numpy as np

    from empathic_fusion.config.checks import require
    from empathic_fusion.core.branches import BranchSpec
    from empathic_fusion.features.branch_unit import BranchUnit, register_branch


    @dataclass
    class ToyConfig:
        """features.toy: the period of the clock waves."""

        period_s: float = 2.0

        def __post_init__(self) -> None:
            require("features.toy", self, {"period_s": (self.period_s > 0, "a number > 0")})


    def toy_signature(store, dataset, session_id, cfg, text_identity=None):
        return {"extractor": "toy_clock", "version": "1", "config": {"fps": dataset.fps, **cfg["toy"]},
                "inputs": {"video": store.file_hash(dataset.sessions.loc[session_id].video)}}


    def toy_frame_bytes(cfg):
        return 3 * 2 + 1


    def extract_toy(job, branches):
        from empathic_fusion.features.media import probe_video

        n_frames = probe_video(job.video).frames_at(job.fps)
        phase = 2 * np.pi * np.arange(n_frames) / job.fps / job.cfg["toy"]["period_s"]
        features = np.stack([np.sin(phase), np.cos(phase), np.ones(n_frames)], axis=1).astype(np.float16)
        return {"toy": ({"features": features, "mask": np.ones(n_frames, np.uint8)}, {"n_frames": n_frames}, [])}


    register_branch(BranchUnit("toy", BranchSpec("video", "media", medium="video"), ToyConfig, toy_signature,
                               extract_media=extract_toy, frame_bytes=toy_frame_bytes))
''')


@pytest.fixture
def toy_file(tmp_path_factory) -> Iterator[Path]:
    """The toy extractor file in a folder added to the `features` package's path (as if it were in the
    package's folder, which stays untouched); afterwards the folder, module and branch are gone."""
    folder = tmp_path_factory.mktemp("branch_file")
    path = folder / f"{TOY_MODULE}.py"
    path.write_text(TOY_SOURCE)
    features_package.__path__.append(str(folder))
    try:
        yield path
    finally:
        features_package.__path__.remove(str(folder))
        sys.modules.pop(f"{features_package.__name__}.{TOY_MODULE}", None)
        forget_module(f"{features_package.__name__}.{TOY_MODULE}")
        unregister_branch("toy")


def _toy_overrides(dataset_dir: Path, store: Path) -> list[str]:
    return [f"data.dataset_dir={dataset_dir}", f"data.store_dir={store}", "data.demo=null", "modality=v",
            "features.modalities.video=[toy]", "features.toy.period_s=3.0", "data.split_fractions=[0.6,0.2,0.2]",
            "data.extract_workers=1", "model.head=regression", "trainer.max_epochs=1", "trainer.accelerator=cpu",
            "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "seed=1", "evaluation=lean"]


class InputDims(L.Callback):
    """What the datamodule sized each input to, read when fitting starts."""

    dims: dict[str, int] = {}

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.dims = dict(trainer.datamodule.input_dims)


def test_an_extractor_file_is_a_branch_that_composes_extracts_and_trains(toy_file, tiny_dataset, tmp_path):
    from empathic_fusion.config import with_defaults
    from empathic_fusion.features.store_space import branch_bytes
    from empathic_fusion.pipeline import train
    from empathic_fusion.compose import compose_config

    assert "toy" not in BRANCHES  # nothing but the file declares it; composing finds it
    store = tmp_path / "store"
    cfg = compose_config(_toy_overrides(tiny_dataset, store), tmp_path / "run", "train")
    assert cfg.features.toy.period_s == 3.0 and BRANCHES["toy"].modality == "video"
    dataset = load_dataset(tiny_dataset)
    session = dataset.sessions.index[0]
    assert branch_bytes(dataset, session, "toy", with_defaults(None)) > 100 * (TOY_DIM * 2 + 1)
    dims = InputDims()
    results = train(cfg, extra_callbacks=[dims])
    assert np.isfinite(results["model"]["rating"]["mse"])
    assert dims.dims["video"] == TOY_DIM
    entry = FeatureStore(store).entry(session, "toy")
    assert entry["signature"]["config"] == {"fps": dataset.fps, "period_s": 3.0}
    assert entry["arrays"]["features"]["shape"][1] == TOY_DIM
    assert FeatureStore(store).entry(session, "face") is None  # only the branch the run asked for


def test_a_file_branchs_settings_are_checked_like_the_packages_own(toy_file, tmp_path):
    from hydra.errors import ConfigCompositionException

    from empathic_fusion.config import ConfigError, validate
    from empathic_fusion.config.typos import composition_message
    from empathic_fusion.compose import compose_config

    cfg = compose_config(["features.toy.period_s=-1"], tmp_path / "run", "train")
    with pytest.raises(ConfigError, match=r"features\.toy\.period_s=-1\.0: must be a number > 0"):
        validate(cfg)
    with pytest.raises(ConfigCompositionException) as error:
        compose_config(["features.toy.perod_s=1"], tmp_path / "run", "train")
    assert composition_message(error.value) == ("features.toy.perod_s=1: features.toy (ToyConfig) has no key "
                                                "'perod_s'; did you mean features.toy.period_s=1?")


def test_importing_the_package_declares_every_branch_without_heavy_imports():
    """Every process that reads a config imports the extractor files: they import no network or media library."""
    code = ("import sys, empathic_fusion.features; from empathic_fusion.core.branches import BRANCHES;"
            "print(list(BRANCHES), [m for m in ('torch', 'mediapipe', 'opensmile', 'cv2') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['face', 'cnn', 'audio', 'text', 'glove'] []"


def test_a_pickled_config_validates_in_a_fresh_process(tmp_path):
    """A sweep's job unpickles its config in another process (joblib's workers, submitit): the schema it names
    declares the branches there, so `features.face` and the rest are settings, not unknown keys."""
    import pickle

    from empathic_fusion.compose import compose_config

    path = tmp_path / "cfg.pkl"
    path.write_bytes(pickle.dumps(compose_config(["features.face.max_faces=3"], tmp_path / "run", "train")))
    code = ("import pickle, sys; cfg = pickle.loads(open(sys.argv[1], 'rb').read());"
            "from empathic_fusion.config import validate; validate(cfg); print(cfg.features.face.max_faces)")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "3"
