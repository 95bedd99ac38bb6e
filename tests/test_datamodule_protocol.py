"""Both datamodules implement the one declared datamodule interface (datamodules/protocol.py), and
building a data config that gives anything else is refused with the interface named."""
from __future__ import annotations

import pytest

from empathic_fusion.datamodules.fusion_datamodule import FusionDataModule
from empathic_fusion.datamodules.protocol import EmpathyData
from empathic_fusion.datamodules.build import build_datamodule
from empathic_fusion.datamodules.text_datamodule import TextDataModule
from empathic_fusion.demo.generated_table import make_text_table


def test_the_session_and_the_text_datamodule_implement_the_protocol(tmp_path):
    sessions = FusionDataModule(dataset_dir=str(tmp_path / "dataset"), store_dir=str(tmp_path / "store"),
                                 modalities=["video", "text"], features={})
    texts = TextDataModule(path=None, text_columns=["text"], label_columns=["emotional"],
                           table=make_text_table(10, 3, seed=0))
    for datamodule in (sessions, texts):
        assert isinstance(datamodule, EmpathyData)
    assert sessions.modalities == ["video", "text"] and texts.modalities == ["text"]
    assert not isinstance(object(), EmpathyData)


def test_a_data_config_that_builds_no_datamodule_is_refused():
    with pytest.raises(TypeError, match="datamodule interface.*EmpathyData"):
        build_datamodule({"_target_": "collections.OrderedDict"}, {}, ["text"])
