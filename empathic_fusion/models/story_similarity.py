"""`story_similarity` baseline, the analogue of the paper's EmpathicStoriesBART row: the cosine
between the Sentence-BERT embedding of what the participant said in the window (their own story
or their reflection, averaged over the frames their utterances cover) and the embedding of the
story they read. No training: this net has no parameters and pairs with the parameter-free
`cosine` head. It needs the text modality; without it there is nothing to compare."""
from __future__ import annotations

import torch
from torch import nn

from empathic_fusion.core.registry import register_model
from empathic_fusion.models.components.pooling import masked_mean


@register_model("story_similarity", module="fusion", display="Story similarity (SBERT)", paper_rank=4)
class StorySimilarity(nn.Module):
    required_head = "cosine"

    def __init__(self, modalities: list[str], input_dims: dict[str, int]):
        super().__init__()
        if "text" not in modalities:
            raise ValueError(f"story_similarity compares the participant's text with the story: select a modality "
                             f"subset with text (t, v+t, a+t, v+a+t), got {'+'.join(modalities)}")
        self.modalities = list(modalities)
        self.out_dim = int(input_dims["text"])

    def forward(self, batch: dict) -> torch.Tensor:
        return masked_mean(batch["text"]["x"], batch["text"]["mask"])
