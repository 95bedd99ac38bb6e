"""Text tables, grouped folds, turn context, persona encoding, perturbations, baselines."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr

from empathic_fusion.evaluation import text_baselines as baselines
from empathic_fusion.datamodules.text_table import PREVIOUS_TURNS, PersonaEncoder, TextTableSpec, grouped_folds, read_table, text_fields, validate
from empathic_fusion.evaluation.text_perturb import CHARACTER_LEVEL, GREEK_HOMOGLYPHS, PERTURBATIONS, perturb
from empathic_fusion.demo.generated_table import make_text_table

SAMPLE = ("I can feel the thoroughness of your emotional pain, and it is amazing that you are able to push through "
          "this. It is as if you are a warrior, and I envy that. It is difficult to go through tensions with family, "
          "and it is perfectly okay to feel stressed, I feel your emotions fully.")


def test_validate_names_every_problem_at_once():
    table = pd.DataFrame({"text": ["a", "b", "c"], "score": [1, "high", None]})
    spec = TextTableSpec(["text", "missing_text"], ["score"], group_column="nope")
    with pytest.raises(ValueError) as err:
        validate(table, spec, "t.csv")
    message = str(err.value)
    assert "missing_text" in message and "nope" in message
    assert "line 3, field 'score': 'high' is not a number" in message and "line 4" in message


def test_read_table_csv_and_jsonl_agree(tmp_path):
    table = make_text_table(5, 2, seed=1)
    table.to_csv(tmp_path / "t.csv", index=False)
    table.to_json(tmp_path / "t.jsonl", orient="records", lines=True)
    a, b = read_table(tmp_path / "t.csv"), read_table(tmp_path / "t.jsonl")
    assert a.text.tolist() == b.text.tolist() and a.cognitive.tolist() == b.cognitive.tolist()
    with pytest.raises(FileNotFoundError):
        read_table(tmp_path / "absent.csv")


def test_grouped_folds_never_split_a_group_and_cover_every_row():
    table = make_text_table(40, 3, seed=2)
    spec = TextTableSpec(["text"], ["cognitive"], group_column="writer")
    folds = grouped_folds(table, spec, 5, seed=0)
    assert len(folds) == 5
    tested = np.concatenate([te for _, te in folds])
    assert sorted(tested.tolist()) == list(range(len(table)))
    for train, test in folds:
        assert not set(table.writer.iloc[train]) & set(table.writer.iloc[test])
    assert [te.tolist() for _, te in grouped_folds(table, spec, 5, seed=0)] == [te.tolist() for _, te in folds]
    with pytest.raises(ValueError, match="groups"):
        grouped_folds(table.head(6), spec, 5, seed=0)
    continuous = table.assign(score=np.linspace(0, 1, len(table)))  # > 20 levels: grouped, not stratified
    spec_c = TextTableSpec(["text"], ["score"], group_column="writer")
    folds_c = [te for _, te in grouped_folds(continuous, spec_c, 4, seed=1)]
    assert sorted(np.concatenate(folds_c).tolist()) == list(range(len(table)))
    assert all(not set(table.writer.iloc[a]) & set(table.writer.iloc[b]) for a in folds_c for b in folds_c if a is not b)
    assert [f.tolist() for f in folds_c] != [te.tolist() for _, te in grouped_folds(continuous, spec_c, 4, seed=2)]


def test_previous_turns_come_from_the_same_conversation_in_order():
    table = pd.DataFrame({"conv": ["a", "b", "a", "a", "b"], "n": [2, 1, 1, 3, 2],
                          "reply": ["a2", "b1", "a1", "a3", "b2"], "said": ["sa2", "sb1", "sa1", "sa3", "sb2"],
                          "y": [1, 2, 3, 4, 5]})
    spec = TextTableSpec(["reply"], ["y"], group_column="conv", context_columns=["said"], order_column="n", context_turns=2)
    fields = text_fields(table, spec)
    assert spec.fields == ["reply", "said", PREVIOUS_TURNS]
    assert fields[PREVIOUS_TURNS] == ["sa1 a1", "", "", "sa1 a1 sa2 a2", "sb1 b1"]


def test_persona_encoder_uses_training_statistics_and_unknown_ids():
    train = pd.DataFrame({"gender": ["f", "m", "f"], "concern": [1.0, 3.0, 5.0]})
    encoder = PersonaEncoder(["gender", "concern"]).fit(train)
    ids, numeric = encoder.transform(pd.DataFrame({"gender": ["m", "x", None], "concern": [3.0, 5.0, None]}))
    assert encoder.cardinalities == [3] and ids[:, 0].tolist() == [2, 0, 0]
    assert numeric[:, 0] == pytest.approx([0.0, 2 / np.std([1, 3, 5]), 0.0])
    restored = PersonaEncoder.from_state(encoder.state())
    assert np.array_equal(restored.transform(train)[0], encoder.transform(train)[0])


@pytest.mark.parametrize("name", list(PERTURBATIONS))
def test_perturbations_are_deterministic_and_change_the_text(name):
    once, again = perturb(SAMPLE, name, 0.3, seed=1), perturb(SAMPLE, name, 0.3, seed=1)
    assert once == again and once != SAMPLE and once.strip()
    if name in CHARACTER_LEVEL:
        assert perturb(SAMPLE, name, 0.3, seed=2) != once  # another seed, another draw


def test_graded_levels_change_more_characters():
    def changed(text: str) -> int:
        return sum(a != b for a, b in zip(text, SAMPLE))

    for name in ("greek_homoglyphs", "leetspeak"):
        counts = [changed(perturb(SAMPLE, name, level, seed=0)) for level in (0.1, 0.3, 0.6, 1.0)]
        assert counts == sorted(counts) and counts[0] < counts[-1]
    assert set(perturb(SAMPLE, "greek_homoglyphs", 1.0)) & set(GREEK_HOMOGLYPHS.values())
    with pytest.raises(ValueError):
        perturb(SAMPLE, "leetspeak", 0.0)
    with pytest.raises(KeyError):
        perturb(SAMPLE, "rot13")


def test_rule_based_registers_follow_their_maps():
    assert "It's hard" in perturb(SAMPLE, "casual_language") and "you're" in perturb(SAMPLE, "casual_language")
    elevated = perturb(SAMPLE, "elevated_language")
    assert "anguish" in elevated and "awe-inspiring" in elevated
    short = perturb(SAMPLE, "shortened")
    assert len(short) < len(SAMPLE) / 2 + 40 and "perfectly" not in short


def test_baselines_on_planted_signal():
    table = make_text_table(60, 4, seed=0)
    y = table[["cognitive", "emotional"]].to_numpy(float)
    fields = {"text": table.text.tolist()}
    train, test = np.arange(0, 180), np.arange(180, 240)
    mean = baselines.train_mean(y[train], len(test))
    assert mean.shape == (60, 2) and np.allclose(mean[0], y[train].mean(0))
    majority = baselines.majority_class(np.array([[1.0], [2.0], [2.0], [3.0]]), 3)
    assert majority.ravel().tolist() == [2.0, 2.0, 2.0]
    ridge = baselines.tfidf_ridge(fields, y, train, test)
    assert ridge.shape == (60, 2)
    assert spearmanr(ridge[:, 0], y[test, 0])[0] > 0.6  # the phrases carry the label
    tuned = baselines.tfidf_ridge(fields, y, train[:150], test, alpha=None, val_rows=train[150:])
    assert spearmanr(tuned[:, 0], y[test, 0])[0] > 0.6
    empty = baselines.tfidf_ridge({"text": [""] * 240}, y, train, test)  # no vocabulary: the training mean
    assert np.allclose(empty, y[train].mean(0))


def test_a_utf16_table_from_excel_reads_as_its_utf8_copy_and_latin1_is_refused_with_line_and_byte(tmp_path):
    """Excel's "Unicode text" and "CSV UTF-8" exports read alike (pandas alone read neither UTF-16 nor the BOM
    as text); Latin-1 stops with the table, line and byte instead of a UnicodeDecodeError traceback."""
    from empathic_fusion.datamodules.text_table import TextTableError

    table = pd.DataFrame({"text": ["I hear you.", "Ça va mieux, merci"], "empathy": [4.0, 2.5]})
    utf8 = tmp_path / "table.csv"
    table.to_csv(utf8, index=False)
    unicode_text = tmp_path / "unicode.tsv"
    unicode_text.write_bytes(table.to_csv(sep="\t", index=False).encode("utf-16"))  # with its byte-order mark
    with_bom = tmp_path / "bom.csv"
    with_bom.write_bytes(table.to_csv(index=False).encode("utf-8-sig"))
    for path in (unicode_text, with_bom):
        pd.testing.assert_frame_equal(read_table(path), read_table(utf8))
    latin1 = tmp_path / "latin1.csv"
    latin1.write_bytes(table.to_csv(index=False).encode("latin-1"))
    with pytest.raises(TextTableError, match=r"latin1\.csv, line 3: is not UTF-8: byte 2 of the line is 0xc7"):
        read_table(latin1)
