"""Ridge experts and their stack (empathic_fusion/models/text/experts.py): held-out predictions are cross-fitted and
equal plain scikit-learn pipelines under GroupKFold, the stack weights are non-negative least squares
(checked against scipy and LinearRegression(positive=True)), the stack follows the expert
that carries the signal, fitted state travels in the state dict, and a fine-tuned encoder with an
embedding expert is refused with the fix in the message; the baselines' ridge grid reaches the
penalties raw sentence embeddings need."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import nnls
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LinearRegression, Ridge
from sklearn.metrics import mean_squared_error
from sklearn.model_selection import GroupKFold, cross_val_predict
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from empathic_fusion.evaluation import text_baselines as baselines
from empathic_fusion.models.text.experts import (GRID_END_NOTES, RIDGE_ALPHAS, EmbeddingRidgeExpert, TfidfRidgeExpert,
                                          _dense_held_out, stack_weights)

WORDS = ["kind", "sorry", "late", "bus", "rain", "hug", "warm", "cold", "loud", "calm", "glad", "sad"]


def _batch(n: int, seed: int, dim: int = 8) -> tuple[dict, np.ndarray, list[str], np.ndarray]:
    """Texts whose word counts carry the target, embeddings that are noise, 3 rows per group."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 3, size=(n, len(WORDS)))
    texts = [" ".join(w for w, c in zip(WORDS, row) for _ in range(c)) + f" id{i}" for i, row in enumerate(counts)]
    y = (counts[:, 1] - counts[:, 2] + 0.3 * rng.normal(size=n)).astype(np.float32)[:, None]
    embeddings = torch.from_numpy(rng.normal(size=(n, dim)).astype(np.float32))
    groups = [f"g{i // 3}" for i in range(n)]
    return {"texts": {"text": texts}, "embeddings": embeddings}, y, groups, counts


def test_held_out_predictions_are_cross_fitted_not_in_sample():
    batch, _, groups, _ = _batch(240, 0)
    noise = np.random.default_rng(1).normal(size=(240, 1))  # unique "idN" tokens let a ridge memorise rows
    expert = TfidfRidgeExpert(min_df=1)
    held_out = expert.fit(batch, noise, groups)
    in_sample = expert(batch).numpy()
    assert abs(np.corrcoef(held_out[:, 0], noise[:, 0])[0, 1]) < 0.2
    assert np.corrcoef(in_sample[:, 0], noise[:, 0])[0, 1] > 0.5  # what the stack must never be fitted on


def test_stack_weights_are_nonnegative_least_squares():
    rng = np.random.default_rng(2)
    held_out = rng.normal(size=(300, 2, 3))
    targets = held_out @ np.array([0.7, 0.0, 0.4]) - held_out[:, :, 1] * 0.5 + 0.1 * rng.normal(size=(300, 2)) + 3.0
    weights, intercept = stack_weights(held_out, targets)
    for j in range(2):
        x = held_out[:, j, :]
        expected, _ = nnls(x - x.mean(0), targets[:, j] - targets[:, j].mean())
        assert np.allclose(weights[j], expected, atol=1e-5) and weights[j][1] == 0.0  # negative weight clipped
        assert intercept[j] == pytest.approx(targets[:, j].mean() - x.mean(0) @ expected, abs=1e-4)


def test_stack_follows_the_expert_with_the_signal_and_scores_new_rows():
    batch, y, groups, _ = _batch(300, 3)
    experts = [TfidfRidgeExpert(min_df=1), EmbeddingRidgeExpert()]
    held_out = np.stack([e.fit(batch, y, groups) for e in experts], axis=-1)
    weights, _ = stack_weights(held_out, y)
    assert weights[0, 0] > 0.8 and weights[0, 1] < 0.1  # words carry the target, embeddings are noise
    new, y_new, _, _ = _batch(90, 4)
    scores = torch.stack([e(new) for e in experts], dim=-1)
    assert np.corrcoef(scores[:, 0, 0].numpy(), y_new[:, 0])[0, 1] > 0.8


def test_expert_state_round_trips_through_the_state_dict():
    batch, y, groups, _ = _batch(120, 5)
    for trained in (TfidfRidgeExpert(min_df=1), EmbeddingRidgeExpert()):
        trained.fit(batch, y, groups)
        fresh = type(trained)()
        fresh.load_state_dict(trained.state_dict())
        assert torch.allclose(fresh(batch), trained(batch)) and fresh.alpha == trained.alpha


def test_embedding_expert_expands_to_one_ridge_per_field_each_reading_its_columns():
    experts = EmbeddingRidgeExpert().expand(["reply", "turn"], 4)
    assert [e.field for e in experts] == ["reply", "turn"] and [e.columns for e in experts] == [(0, 4), (4, 8)]
    rng = np.random.default_rng(6)
    x = rng.normal(size=(150, 8)).astype(np.float32)
    y = (x[:, 5] + 0.1 * rng.normal(size=150))[:, None]  # only the second field's columns carry it
    batch = {"texts": {"reply": [""] * 150, "turn": [""] * 150}, "embeddings": torch.from_numpy(x)}
    held_out = [e.fit(batch, y, [str(i) for i in range(150)]) for e in experts]
    assert abs(np.corrcoef(held_out[0][:, 0], y[:, 0])[0, 1]) < 0.3 < 0.9 < np.corrcoef(held_out[1][:, 0], y[:, 0])[0, 1]
    assert EmbeddingRidgeExpert(per_field=False).expand(["reply", "turn"], 4)[0].columns is None


def test_fine_tuned_encoder_with_an_embedding_expert_is_refused_with_the_fix():
    from empathic_fusion.core.sentence_encoder import SentenceEncoder
    from empathic_fusion.models.text_module import TextRegressor

    with pytest.raises(ValueError, match="needs a frozen encoder.*TfidfRidgeExpert"):
        TextRegressor(["text"], 1, SentenceEncoder(trainable_layers=1), experts=[EmbeddingRidgeExpert()])
    with pytest.raises(ValueError, match="head_input=expert_scores needs model.net.experts"):
        TextRegressor(["text"], 1, SentenceEncoder(), experts=[], head_input="expert_scores")


def test_baseline_ridge_grid_reaches_the_penalties_weak_signal_needs():
    """Before the grid went past 100 the embedding baseline sat at its edge on EmpatheticExchanges
    (raw MiniLM embeddings: per-dimension variance about 0.04); here the best penalty is far above 100."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(400, 300)) * 0.2
    y = (x[:, :50].sum(1) * 0.05 + rng.normal(size=400))[:, None]
    alpha = baselines._pick_alpha(x[:300], y[:300], x[300:], y[300:])
    errors = {a: np.mean((Ridge(alpha=a).fit(x[:300], y[:300]).predict(x[300:]) - y[300:]) ** 2) for a in (100.0, alpha)}
    assert alpha > 100 and errors[alpha] < errors[100.0]


def test_one_training_group_falls_back_to_row_folds_with_a_warning_and_one_row_is_refused(caplog):
    batch, y, _, _ = _batch(12, 8)
    with caplog.at_level("WARNING"):
        held_out = TfidfRidgeExpert(min_df=1).fit(batch, y, ["w1"] * 12)
    assert held_out.shape == (12, 1) and "one group" in caplog.text
    with pytest.raises(ValueError, match="1 training row.*model.net.experts=\\[\\]"):
        EmbeddingRidgeExpert().fit({"texts": {"text": ["a"]}, "embeddings": torch.zeros(1, 8)}, y[:1], ["w1"])


def test_embedding_expert_equals_a_standard_scaler_ridge_pipeline_under_grouped_folds():
    """The expert's own scaling and penalty choice against scikit-learn's StandardScaler + Ridge under
    GroupKFold: the same penalty (lowest pooled held-out MSE) and the same held-out predictions."""
    rng = np.random.default_rng(9)
    x = rng.normal(size=(200, 6)).astype(np.float32) * np.array([1, 2, 0.5, 1, 3, 1], np.float32)
    y = (x[:, 0] - 0.5 * x[:, 4] + rng.normal(size=200))[:, None]
    x = np.concatenate([x, np.full((200, 1), 0.7, np.float32)], axis=1)  # a constant dimension (an empty field)
    groups = [f"g{i // 4}" for i in range(200)]
    expert = EmbeddingRidgeExpert(per_field=False)
    batch = {"texts": {"text": [""] * 200}, "embeddings": torch.from_numpy(x)}
    held_out = expert.fit(batch, y, groups)
    cv = GroupKFold(n_splits=5)
    reference = {a: cross_val_predict(make_pipeline(StandardScaler(), Ridge(alpha=a)), x, y, groups=groups,
                                      cv=cv).reshape(-1, 1) for a in RIDGE_ALPHAS}
    best = min(RIDGE_ALPHAS, key=lambda a: mean_squared_error(y, reference[a]))
    assert expert.alpha == best
    assert np.allclose(held_out, reference[best], atol=1e-4)
    # every penalty's held-out predictions (one SVD per fold) equal scikit-learn's solve per penalty
    folds = expert._dense_folds(batch, y.astype(np.float64), list(cv.split(x, y, groups)))
    path = _dense_held_out(folds, list(RIDGE_ALPHAS), y.shape)
    for k, alpha in enumerate(RIDGE_ALPHAS):
        assert np.allclose(path[k], reference[alpha], atol=1e-4), alpha


def test_tfidf_expert_equals_a_tfidf_ridge_pipeline_under_grouped_folds():
    batch, y, groups, _ = _batch(150, 10)
    expert = TfidfRidgeExpert(min_df=1)
    held_out = expert.fit(batch, y, groups)
    reference = make_pipeline(TfidfVectorizer(ngram_range=(1, 2), min_df=1, sublinear_tf=True, dtype=np.float32),
                              Ridge(alpha=expert.alpha))
    texts = batch["texts"]["text"]
    expected = cross_val_predict(reference, texts, y, groups=groups, cv=GroupKFold(n_splits=5)).reshape(-1, 1)
    assert np.allclose(held_out, expected, atol=1e-5)
    assert np.allclose(expert(batch).numpy(), reference.fit(texts, y).predict(texts).reshape(-1, 1), atol=1e-5)


def test_stack_weights_equal_a_positive_linear_regression():
    rng = np.random.default_rng(11)
    held_out = rng.normal(size=(250, 1, 4))
    targets = held_out[:, :, 0] * 0.8 - held_out[:, :, 2] * 0.3 + 0.2 * rng.normal(size=(250, 1)) + 1.0
    weights, intercept = stack_weights(held_out, targets)
    reference = LinearRegression(positive=True).fit(held_out[:, 0, :], targets[:, 0])
    assert np.allclose(weights[0], reference.coef_, atol=1e-5) and weights[0, 2] == 0.0
    assert intercept[0] == pytest.approx(reference.intercept_, abs=1e-5)


def test_baseline_penalty_choice_equals_its_validation_mse_argmin():
    rng = np.random.default_rng(12)
    x = rng.normal(size=(160, 20))
    y = (x[:, :3].sum(1) + rng.normal(size=160))[:, None]
    errors = [mean_squared_error(y[120:], Ridge(alpha=a).fit(x[:120], y[:120]).predict(x[120:])) for a in RIDGE_ALPHAS]
    assert baselines._pick_alpha(x[:120], y[:120], x[120:], y[120:]) == RIDGE_ALPHAS[int(np.argmin(errors))]


KIND = ["I am so sorry to hear that.", "That must be really hard for you.", "I hope you feel better soon.",
        "How awful, I'm here for you."]
FLAT = ["The bus was late today.", "We had pasta for dinner.", "It rained in the afternoon.", "My phone needs charging."]


FINE_TUNING = {"trainable_layers": 1, "max_length": 16, "epochs": 4, "batch_size": 8, "lr": 1e-4, "head_lr": 1e-2,
               "inner_folds": 3}


@pytest.fixture(scope="module")
def fine_tuned():
    """A FineTunedEncoderExpert (top MiniLM layer) fitted on 60 rows whose target is a caring or a flat
    reply, 2 rows per group; the rows each of its fine-tunings trained on are recorded."""
    from empathic_fusion.models.text.finetuned_expert import FineTunedEncoderExpert

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 60).astype(np.float32)
    texts = [(KIND if v else FLAT)[rng.integers(0, 4)] + f" Number {i}." for i, v in enumerate(y)]
    groups = [f"g{i // 2}" for i in range(60)]
    target = ((y - y.mean()) / y.std())[:, None]
    expert = FineTunedEncoderExpert(**FINE_TUNING)
    expert.expand(["text"], 384)
    trained_on = []
    train = expert._train
    expert._train = lambda texts, targets, rows, seed: trained_on.append(np.array(rows)) or train(texts, targets, rows, seed)
    held_out = expert.fit({"texts": {"text": texts}}, target, groups)
    del expert._train
    return expert, held_out, target, np.array(groups), trained_on, texts


def test_fine_tuned_expert_learns_and_is_cross_fitted_on_grouped_folds(fine_tuned):
    expert, held_out, target, groups, trained_on, _ = fine_tuned
    assert np.corrcoef(held_out[:, 0], target[:, 0])[0, 1] > 0.8  # held-out rows, so this is learning
    *inner, final = trained_on
    assert len(inner) == 3 and sorted(final) == list(range(60))  # one fine-tuning per inner fold, then all rows
    held = [np.setdiff1d(np.arange(60), rows) for rows in inner]
    assert sorted(np.concatenate(held)) == list(range(60))  # every row held out exactly once
    for rows, out in zip(inner, held):
        assert not set(groups[rows]) & set(groups[out])  # a group is never on both sides
    scores = expert({"texts": {"text": ["I'm so sorry, that sounds hard.", "The train was on time."]}})
    assert scores[0, 0] > 0.5 > -0.5 > scores[1, 0]


def test_fine_tuned_expert_round_trips_through_the_state_dict_and_refuses_another_base_encoder(fine_tuned):
    from empathic_fusion.models.text.finetuned_expert import FineTunedEncoderExpert

    expert = fine_tuned[0]
    state = expert.state_dict()
    weights = state["_extra_state"]["weights"]
    assert weights and all(k.startswith(("encoder.model.encoder.layer.5.", "head.")) for k in weights)  # top layer + head
    batch = {"texts": {"text": KIND + FLAT}}
    fresh = FineTunedEncoderExpert(trainable_layers=1)
    fresh.load_state_dict(state)
    assert fresh.fields == ["text"] and torch.allclose(fresh(batch), expert(batch), atol=1e-5)
    other = FineTunedEncoderExpert(trainable_layers=1)
    other.load_state_dict({"_extra_state": {**state["_extra_state"], "encoder_identity": "another"}})
    with pytest.raises(ValueError, match="base encoder .*identity another"):
        other(batch)
    # a resumed run (the same settings) fits the same rows: the saved held-out predictions, no fine-tuning
    _, held_out, target, groups, _, texts = fine_tuned
    resumed = FineTunedEncoderExpert(**FINE_TUNING)
    resumed.load_state_dict(state)
    resumed._train = lambda *args: pytest.fail("fine-tuned again on the rows it was fitted on")
    np.testing.assert_array_equal(resumed.fit({"texts": {"text": texts}}, target, groups), held_out)
    assert fresh._fit_key({"text": texts}, target, groups) != resumed._fit_key({"text": texts}, target, groups)
    with pytest.raises(ValueError, match="trainable_layers=0"):
        FineTunedEncoderExpert(trainable_layers=0)
    with pytest.raises(ValueError, match=r"fields=\['reply'\]: \['reply'\] not among"):
        FineTunedEncoderExpert(fields=["reply"]).expand(["text"], 384)


@pytest.mark.gpu
def test_fine_tuned_expert_fits_and_scores_on_a_gpu_in_bf16():
    """The GPU recipe's expert on the GPU (bf16 autocast): it learns the planted signal and scores there."""
    from empathic_fusion.models.text.finetuned_expert import FineTunedEncoderExpert

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 60).astype(np.float32)
    texts = [(KIND if v else FLAT)[rng.integers(0, 4)] + f" Number {i}." for i, v in enumerate(y)]
    target = ((y - y.mean()) / y.std())[:, None]
    expert = FineTunedEncoderExpert(trainable_layers=2, max_length=16, epochs=4, batch_size=8, lr=1e-4,
                                    head_lr=1e-2, inner_folds=3).to("cuda")
    expert.expand(["text"], 384)
    held_out = expert.fit({"texts": {"text": texts}}, target, [f"g{i // 2}" for i in range(60)])
    assert np.corrcoef(held_out[:, 0], target[:, 0])[0, 1] > 0.8
    scores = expert({"texts": {"text": KIND[:1] + FLAT[:1]}, "persona_ids": torch.zeros(2, 0, device="cuda")})
    assert scores.device.type == "cuda" and scores[0, 0] > scores[1, 0]


def test_layer_experts_expand_per_field_and_set_within_the_encoders_layers():
    experts = EmbeddingRidgeExpert(layers=[1, 2, 4]).expand(["reply", "turn"], 4, encoder_layers=6)
    assert [(e.field, e.layers, e.columns) for e in experts] == [
        ("reply", 1, (0, 4)), ("reply", 2, (0, 4)), ("reply", 4, (0, 4)),
        ("turn", 1, (4, 8)), ("turn", 2, (4, 8)), ("turn", 4, (4, 8))]
    assert experts[1].label == "embedding ridge (reply, last 2 layers)" and experts[1].layer_sets == (2,)
    assert [e.layers for e in EmbeddingRidgeExpert(layers=[1, 2, 4]).expand(["reply"], 4, encoder_layers=2)] == [1, 2]
    # an encoder without transformer layers (the multilingual one): its embeddings, one ridge per field
    plain = EmbeddingRidgeExpert(layers=[1, 2, 4]).expand(["reply", "turn"], 4, encoder_layers=None)
    assert [(e.field, e.layers) for e in plain] == [("reply", None), ("turn", None)] and plain[0].layer_sets == ()
    with pytest.raises(ValueError, match="layer count >= 1"):
        EmbeddingRidgeExpert(layers=[0, 2])


def test_all_stands_for_every_layer_the_encoder_has():
    """`all` becomes the encoder's layer count (6 for MiniLM, 12 for mpnet), once when it equals a listed set."""
    experts = EmbeddingRidgeExpert(layers=[1, 2, 4, "all"]).expand(["reply"], 4, encoder_layers=12)
    assert [e.layers for e in experts] == [1, 2, 4, 12] and experts[-1].layer_sets == (12,)
    assert experts[-1].label == "embedding ridge (all 12 layers)"
    assert experts[2].label == "embedding ridge (last 4 layers)"
    assert [e.layers for e in EmbeddingRidgeExpert(layers=[1, 2, 4, "all"]).expand(["reply"], 4, encoder_layers=4)] == [1, 2, 4]
    with pytest.raises(ValueError, match="neither a layer count >= 1 nor 'all'"):
        EmbeddingRidgeExpert(layers=[1, "every"])


def _held_out_with_best_penalty(best: float | None):
    """A stand-in for an expert's held-out predictions per penalty on one row with target 0: the squared
    error is lowest at `best` (None: it keeps falling as the penalty grows, as for an expert without signal)."""
    def held_out_of(alphas: list[float]) -> np.ndarray:
        logs = np.log10(np.asarray(alphas))
        error = 0.5 + 1.0 / (1.0 + np.asarray(alphas)) if best is None else 0.1 + (logs - np.log10(best)) ** 2
        return np.sqrt(error).reshape(-1, 1, 1)
    return held_out_of


@pytest.mark.parametrize("best", [1.0e7, 1.0e-3, 316.0])
def test_the_penalty_grid_widens_past_an_end_until_the_best_penalty_is_inside(best):
    expert = EmbeddingRidgeExpert(per_field=False)
    alphas, held_out, chosen, grid_end = expert._search(_held_out_with_best_penalty(best), np.zeros((1, 1)))
    assert grid_end is None and 0 < chosen < len(alphas) - 1 and len(held_out) == len(alphas)
    assert abs(np.log10(alphas[chosen]) - np.log10(best)) <= 0.25  # the nearest half-decade to the true best
    assert alphas[0] <= min(RIDGE_ALPHAS) and alphas[-1] >= max(RIDGE_ALPHAS)
    # the fixed grid (widen_steps=0) stops at its end and says so
    fixed = EmbeddingRidgeExpert(per_field=False, widen_steps=0)
    _, _, at, end = fixed._search(_held_out_with_best_penalty(best), np.zeros((1, 1)))
    assert end == (None if best == 316.0 else "upper" if best > 1 else "lower")


def test_a_penalty_still_at_the_end_after_widening_is_reported():
    """An expert whose error keeps falling with the penalty (no signal): the grid grows by widen_steps
    penalties, the choice is its upper end, and the stack report and the log say so."""
    expert = EmbeddingRidgeExpert(per_field=False, widen_steps=3)
    alphas, _, chosen, grid_end = expert._search(_held_out_with_best_penalty(None), np.zeros((1, 1)))
    assert grid_end == "upper" and chosen == len(alphas) - 1 and len(alphas) == len(RIDGE_ALPHAS) + 3
    assert "upper end" in GRID_END_NOTES["upper"]
    rng = np.random.default_rng(5)
    x = rng.normal(size=(120, 3)).astype(np.float32)
    noise = rng.normal(size=(120, 1))  # a target the features do not carry
    fitted = EmbeddingRidgeExpert(per_field=False, alphas=(0.1, 1.0), widen_steps=0)
    fitted.fit({"texts": {"text": [""] * 120}, "embeddings": torch.from_numpy(x)}, noise, [f"g{i // 3}" for i in range(120)])
    assert fitted.grid_end == "upper" and fitted.alpha == 1.0 and fitted._state["grid"] == (0.1, 1.0)


def test_the_stack_weighs_the_layer_set_that_carries_the_signal():
    """Three representations of one field, the target in the middle one: its expert has the held-out r,
    the stack gives it the weight, and a batch without that set is refused with what it lacks."""
    rng = np.random.default_rng(11)
    n, dim = 300, 6
    sets = {k: rng.normal(size=(n, dim)).astype(np.float32) for k in (1, 2, 4)}
    y = (sets[2][:, 0] - sets[2][:, 3] + 0.3 * rng.normal(size=n)).astype(np.float32)[:, None]
    batch = {"texts": {"text": [""] * n}, "embeddings": torch.from_numpy(sets[1]),
             "layer_embeddings": {k: torch.from_numpy(x) for k, x in sets.items()}}
    experts = EmbeddingRidgeExpert(layers=[1, 2, 4]).expand(["text"], dim, encoder_layers=6)
    groups = [f"g{i // 3}" for i in range(n)]
    held_out = np.stack([e.fit(batch, y, groups) for e in experts], axis=-1)
    r = [np.corrcoef(held_out[:, 0, k], y[:, 0])[0, 1] for k in range(3)]
    assert r[1] > 0.9 and max(abs(r[0]), abs(r[2])) < 0.3
    weights, _ = stack_weights(held_out, y)
    assert weights[0, 1] > 0.9 and weights[0, 1] > 5 * max(weights[0, 0], weights[0, 2])
    with pytest.raises(ValueError, match=r"last 2 layers.*lacks.*\[1, 4\]"):
        experts[1]({**batch, "layer_embeddings": {1: sets[1], 4: sets[4]}})
