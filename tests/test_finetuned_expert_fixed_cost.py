"""What a fit of the fine-tuned encoder expert (empathic_fusion/models/text/finetuned_expert.py) does besides its
steps, and that it changes no result: texts tokenised once give the vectors the encoder gives the texts
(chunks, pooling and normalisation included), a fit loads the base encoder and tokenises each field
once, every fine-tuning starts from the base encoder's weights (the same seed and rows give the same
net) and predictions batched on the device equal predictions row by row."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from empathic_fusion.core.sentence_encoder import SentenceEncoder
from empathic_fusion.models.text.finetuned_expert import FineTunedEncoderExpert

LONG = "She told me about the move, the new job, the friends left behind and the long winter ahead. " * 3
TEXTS = ["I am so sorry.", "", LONG, "The bus was late today, again, and it rained.", "Fine.", LONG[:90]]


@pytest.mark.parametrize("pooling, normalize", [("mean", False), ("mean", True), ("cls", False)])
def test_pre_tokenised_texts_give_the_encoders_vectors(pooling, normalize):
    """A window of 16 tokens chunks the long texts; any subset of rows, in any order, gives what
    `encoder(texts)` gives for those texts."""
    encoder = SentenceEncoder(None, trainable_layers=1, max_length=16, pooling=pooling, normalize=normalize).eval()
    tokens = encoder.tokenize(TEXTS)
    assert len(tokens) == len(TEXTS) and tokens.count[2] > 2 and tokens.count[0] == tokens.count[1] == 1
    with torch.no_grad():
        for rows in (np.arange(len(TEXTS)), np.array([2, 0, 5]), np.array([4]), np.array([5, 2, 2, 1])):
            expected = encoder([TEXTS[i] for i in rows])
            torch.testing.assert_close(encoder.forward_tokens(tokens, rows), expected, atol=1e-5, rtol=1e-5)
    assert tokens.tokens()[2] == tokens.length[tokens.first[2]:tokens.first[2] + tokens.count[2]].sum()


def _rows(n: int = 24) -> tuple[dict, np.ndarray, list[str]]:
    rng = np.random.default_rng(3)
    y = rng.normal(size=(n, 1)).astype(np.float32)
    texts = [f"Row {i}: " + " ".join(["kind"] * int(rng.integers(1, 9))) for i in range(n)]
    return {"texts": {"text": texts, "reply": texts[::-1]}}, y, [f"g{i // 2}" for i in range(n)]


def test_a_fit_loads_the_base_encoder_once_and_tokenises_each_field_once(monkeypatch):
    batch, y, groups = _rows()
    expert = FineTunedEncoderExpert(trainable_layers=1, max_length=16, epochs=2, batch_size=8, inner_folds=3)
    expert.expand(["text", "reply"], 384)
    loads, tokenised = [], []
    new_net, tokenize = expert._new_net, SentenceEncoder.tokenize
    monkeypatch.setattr(expert, "_new_net", lambda *args: loads.append(1) or new_net(*args))
    monkeypatch.setattr(SentenceEncoder, "tokenize",
                        lambda self, texts: tokenised.append(len(texts)) or tokenize(self, texts))
    held_out = expert.fit(batch, y, groups)
    assert len(loads) == 1 and tokenised == [24, 24]  # 4 fine-tunings, one load, each field tokenised once
    assert held_out.shape == (24, 1) and np.isfinite(held_out).all()


def test_each_fine_tuning_starts_from_the_base_encoder_and_batched_predictions_equal_single_rows():
    batch, y, _ = _rows()
    expert = FineTunedEncoderExpert(trainable_layers=1, max_length=16, epochs=1, batch_size=8, lr=1e-3)
    expert.expand(["text", "reply"], 384)
    table = expert._table(batch["texts"], 1)
    rows = np.arange(16)
    first = expert._train(table, y, rows, seed=7).trained_state()
    expert._train(table, y, rows[::2], seed=8)  # another fine-tuning in between
    again = expert._train(table, y, rows, seed=7).trained_state()
    changed = [name for name in first if not torch.equal(first[name], table.pristine[name].cpu())]
    assert changed and any(name.startswith("encoder.") for name in changed)  # it trained the encoder layer
    for name in first:
        torch.testing.assert_close(again[name], first[name], atol=1e-6, rtol=1e-5)
    held = np.arange(16, 24)[::-1]
    together = expert._predict(table.net, table.tokens, held)
    alone = np.concatenate([expert._predict(table.net, table.tokens, held[i:i + 1]) for i in range(len(held))])
    np.testing.assert_allclose(together, alone, atol=1e-5)
