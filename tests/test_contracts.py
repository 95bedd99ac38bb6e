"""The parts the modules build implement the contracts of models/contracts.py (checked, not probed)."""
from __future__ import annotations

import pytest
import torch

from empathic_fusion.config.model import FUSION_HEADS
from empathic_fusion.models.components.heads import make_head
from empathic_fusion.models.contracts import ClosedFormHead, FusionHead, TextBranch, TextExpert, check_part, members
from empathic_fusion.models.text.branches import TfidfBranch
from empathic_fusion.models.text.experts import EmbeddingRidgeExpert, TfidfRidgeExpert
from empathic_fusion.models.text.finetuned_expert import FineTunedEncoderExpert


@pytest.mark.parametrize("kind", FUSION_HEADS)
def test_every_head_is_a_fusion_head_and_only_the_constant_one_is_fitted(kind):
    head = make_head(kind, 4, 4)
    check_part(head, FusionHead)
    assert head.closed_form == (kind == "constant") == isinstance(head, ClosedFormHead)
    if head.closed_form:
        head.fit(3.0)
        assert head(torch.zeros(2, 4), torch.zeros(2, 4)).tolist() == [3.0, 3.0]


def test_the_shipped_experts_and_branch_implement_their_contracts():
    experts = [TfidfRidgeExpert(), EmbeddingRidgeExpert(), FineTunedEncoderExpert()]
    for expert in experts:
        check_part(expert, TextExpert)
    sets = EmbeddingRidgeExpert(layers=[1, 2, 4, "all"]).expand(["text"], 8, 6)
    assert [e.layer_sets for e in sets] == [(1,), (2,), (4,), (6,)]
    assert TfidfRidgeExpert().layer_sets == () and FineTunedEncoderExpert().layer_sets == ()
    check_part(TfidfBranch(), TextBranch)


def test_a_part_of_ones_own_that_lacks_a_member_is_named():
    class HalfExpert(torch.nn.Module):
        label, needs_embeddings = "half", False

        def forward(self, batch):
            return batch

    lacking = [m for m in members(TextExpert) if m not in ("label", "needs_embeddings", "forward")]
    with pytest.raises(TypeError, match="HalfExpert is not a TextExpert: it lacks " + repr(lacking).replace("[", r"\[")):
        check_part(HalfExpert(), TextExpert)
