"""Evaluation texts inside longer texts (docs/your-own-models-and-data.md, "Evaluation texts inside other texts"):
kdpipe.data.contamination. A transfer row or an external OOD row that holds a validation, test or held-out class's
text anywhere in it is dropped and counted, one that shares only common phrases with one is kept, and the vectorised
word n-grams agree with a plain Python reading of the rule, chunk by chunk."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

import kdpipe.data.contamination as contamination
from kdpipe.data.contamination import CONTAINED, NGRAM, SHARED, EvaluationNgrams, joined
from kdpipe.data.dataset import OOD, read_split
from kdpipe.data.folding import fold, fold_columns
from kdpipe.data.ood import build_ood
from kdpipe.data.prepare import HELD_OUT, prepare
from kdpipe.data.settings import DatasetSettings, OodSourceSettings, TransferSettings
from kdpipe.data.transfer import build_transfer
from tests.test_data import dataset_params, tiny_frame, write_table
from tests.test_transfer import NONE_DROPPED

COMMON = "the prime minister said on monday that"  # a phrase any two political stories may share (7 words)


def articles(n: int, seed: int, words: int = 40) -> list[str]:
    """``n`` distinct made-up news articles of ``words`` words, each with :data:`COMMON` in its middle."""
    rng = np.random.default_rng(seed)
    vocabulary = [f"w{i:04d}" for i in range(3000)]
    out = []
    for _ in range(n):
        body = rng.choice(vocabulary, words).tolist()
        out.append(" ".join(body[: words // 2]).capitalize() + f", {COMMON} " + " ".join(body[words // 2 :]) + ".")
    return out


@pytest.fixture(scope="module")
def news(tmp_path_factory):
    """A prepared dataset of 60 made-up articles (two classes), and a third class ``mid`` held out of the run."""
    tmp = tmp_path_factory.mktemp("news")
    frame = pd.DataFrame({"text": articles(90, seed=1), "label": ["neg", "pos", "mid"] * 30})
    params = dataset_params(
        source=write_table(frame, tmp / "news.csv"),
        split={"validation": 0.2, "test": 0.2, "seed": 1},
        ood_classes=["mid"],
    )
    prepare(params, tmp / "data")
    return params, tmp / "data"


def transfer_settings(dataset: DatasetSettings, source, max_length: int | None = None) -> TransferSettings:
    """The transfer job's settings of the dataset ``dataset`` and the transfer file ``source``."""
    keys = ("name", "text_column", "text_pair_column", "format", "encoding")
    given = {key: getattr(dataset, key) for key in keys} | {"split": {"seed": dataset.split.seed}}
    given |= {"transfer": str(source), "transfer_max_rows": None, "max_length": max_length}
    return TransferSettings.from_params(given, "transfer")


def transfer(params, data_dir, texts, out, max_length=None) -> tuple[dict, list[str]]:
    source = write_table(pd.DataFrame({"text": texts}), out.with_suffix(".parquet"))
    manifest = build_transfer(transfer_settings(params, source, max_length), data_dir, out)
    return manifest, read_split(out, "transfer")["text"].tolist()


def test_test_articles_behind_a_source_inside_a_quotation_or_before_a_credit_are_dropped_and_counted(
    tmp_path, news, capsys
):
    params, data = news
    test = read_split(data, "test")["text"].tolist()
    validation = read_split(data, "validation")["text"].tolist()
    fresh = articles(4, seed=99)
    texts = [
        "Reuters. " + test[0],  # a source line before it
        f'He read it aloud: "{test[1]}" Then he left.',  # a quotation
        test[2] + " (Photo: AP. Copyright 2005.)",  # a credit line after it
        fresh[0][:60] + " " + test[3] + " " + fresh[0][60:],  # an article inside another
        "LONDON (AFP) - " + validation[0].upper() + " -- more at 11",  # capitals, a validation text
        fresh[1],
        fresh[2],
        " ".join(test[4].split()[:NGRAM]) + " and then it was all different",  # its first 13 words
    ]
    manifest, kept = transfer(params, data, texts, tmp_path / "t", max_length=512)
    assert manifest["dropped"] == {**NONE_DROPPED, "evaluation_shared": 6}
    assert kept == fresh[1:3]
    assert manifest["contamination"] == {
        "ngram_words": 13,
        "shared_ngrams": 1,
        "evaluation_texts": 12 + 12 + 30,  # validation and test (two classes), and every row of the held-out class
        "short_evaluation_texts": 0,
    }
    log = capsys.readouterr().err
    assert "6 dropped as sharing 13 consecutive words with a validation, test or held-out class's text" in log


def test_copies_of_a_held_out_classs_texts_are_dropped_from_the_transfer_rows_and_an_ood_set(tmp_path, news):
    params, data = news
    held = pd.read_parquet(data / HELD_OUT)["text"].tolist()
    ood_test = read_split(data, OOD)["text"].tolist()
    fresh = articles(2, seed=98)
    texts = ["Intro. " + held[0], "Intro. " + ood_test[0], held[1] + " Read more.", fresh[0]]
    manifest, kept = transfer(params, data, texts, tmp_path / "t")
    assert manifest["dropped"]["evaluation_shared"] == 3 and kept == [fresh[0]]
    # an external OOD set: a quoted test article is not unseen
    test = read_split(data, "test")["text"].tolist()
    texts = [f"Quote: '{test[5]}'", "Intro. " + held[2], fresh[1]]
    source = write_table(pd.DataFrame({"text": texts}), tmp_path / "ood.csv")
    ood = {"name": "news", "source": str(source), "text_column": "text", "text_pair_column": None}
    manifest = build_ood(
        OodSourceSettings.from_params(ood | {"format": "auto", "encoding": "utf-8"}), data, tmp_path / "ood"
    )
    assert manifest["dropped"] == {
        "empty": 0,
        "duplicate": 0,
        "dataset": 0,
        "evaluation_shared": 2,
        "evaluation_contained": 0,
    }
    assert read_split(tmp_path / "ood", OOD)["text"].tolist() == [fresh[1]]
    assert manifest["contamination"]["ngram_words"] == 13


def test_near_copies_that_share_only_common_phrases_are_kept(tmp_path, news):
    """Every article here says "the prime minister said on monday that"; a new article with that phrase, and one
    that takes a test article's words 12 at a time with a word of its own between them, share no 13 consecutive
    words with any evaluation text: kept. The same with 13 words in a row is dropped."""
    params, data = news
    test = read_split(data, "test")["text"].tolist()
    words = test[0].split()
    spliced = " ".join(" ".join(words[i : i + 12]) + " indeed" for i in range(0, len(words), 12))
    thirteen = " ".join(words[:13]) + " indeed " + " ".join(words[13:])
    fresh = articles(3, seed=97)
    assert all(COMMON in text for text in [*fresh, *test])
    manifest, kept = transfer(params, data, [*fresh, spliced, thirteen], tmp_path / "t")
    assert manifest["dropped"] == {**NONE_DROPPED, "evaluation_shared": 1}
    assert kept == [*fresh, spliced]


def test_evaluation_texts_shorter_than_the_n_gram_are_matched_whole_as_words(tmp_path):
    """Test texts of three words ("sentence number 7") are matched whole, as consecutive whole words, anywhere in a
    row; a text without a word (only punctuation) matches nothing."""
    frame = tiny_frame(40)
    frame.loc[len(frame)] = ("?!", "neg")  # a text of no word at all
    params = dataset_params(
        source=write_table(frame, tmp_path / "d.csv"), split={"validation": 0.2, "test": 0.2, "seed": 13}
    )
    prepare(params, tmp_path / "data")
    evaluated = pd.concat([read_split(tmp_path / "data", s) for s in ("validation", "test")])["text"].tolist()
    number = next(int(t.split()[-1]) for t in evaluated if t.startswith("sentence number "))
    texts = [
        f"He wrote: 'Sentence number {number}.' Then he stopped.",  # contained, in capitals and quotes
        f"sentence number {number}0 is another one",  # not the same word
        f"number {number} sentence",  # not in order
        f"sentence, number; {number}!",  # punctuation between the words changes nothing
        "a row with no test text at all",
    ]
    manifest, kept = transfer(params, tmp_path / "data", texts, tmp_path / "t")
    assert manifest["dropped"]["evaluation_contained"] == 2, manifest["dropped"]
    assert kept[-3:] == texts[1:3] + texts[4:]
    assert manifest["contamination"]["short_evaluation_texts"] == manifest["contamination"]["evaluation_texts"]


def test_a_test_pair_split_differently_between_text_and_text_pair_is_dropped(tmp_path):
    """A sentence-pair row is its text's words then its pair's: a test pair copied with the cut moved (part of the
    premise in the hypothesis column) still holds 13 consecutive words of it."""
    premises, hypotheses = articles(40, seed=3, words=20), articles(40, seed=4, words=12)
    frame = pd.DataFrame({"text": premises, "hypothesis": hypotheses, "label": ["neg", "pos"] * 20})
    source = write_table(frame, tmp_path / "pairs.csv")
    params = dataset_params(
        source=source, text_pair_column="hypothesis", split={"validation": 0.2, "test": 0.2, "seed": 13}
    )
    prepare(params, tmp_path / "data")
    test = read_split(tmp_path / "data", "test")
    premise, hypothesis = test["text"][0].split(), test["text_pair"][0]
    fresh_p, fresh_h = articles(2, seed=5, words=20), articles(2, seed=6, words=12)
    rows = pd.DataFrame(
        {
            "text": [" ".join(premise[:10]), fresh_p[0], "Intro: " + test["text"][1]],
            "hypothesis": [" ".join(premise[10:]) + " " + hypothesis, fresh_h[0], "a question?"],
        }
    )
    source = write_table(rows, tmp_path / "t.parquet")
    manifest = build_transfer(transfer_settings(params, source), tmp_path / "data", tmp_path / "t")
    assert manifest["dropped"]["evaluation_shared"] == 2  # (the third holds the 27 words of a test premise)
    assert read_split(tmp_path / "t", "transfer")["text"].tolist() == [fresh_p[0]]


def reference(evaluation: list[str], rows: list[str], n: int) -> list[int]:
    """The rule in plain Python: lower-cased words of letters and digits, n-grams as tuples."""

    def words(text):
        return [w for w in re.split(r"[^a-z0-9]+", text.lower()) if w]

    grams, whole = set(), set()
    for text in evaluation:
        w = words(text)
        if len(w) >= n:
            grams.update(tuple(w[i : i + n]) for i in range(len(w) - n + 1))
        elif w:
            whole.add(tuple(w))
    out = []
    for text in rows:
        w = words(text)
        if any(tuple(w[i : i + n]) in grams for i in range(len(w) - n + 1)):
            out.append(SHARED)
        elif any(tuple(w[i : i + len(t)]) == t for t in whole for i in range(len(w) - len(t) + 1)):
            out.append(CONTAINED)
        else:
            out.append(0)
    return out


@pytest.mark.parametrize("chunk", [1 << 23, 200])
def test_the_vectorised_rule_agrees_with_a_plain_reading_of_it_chunk_by_chunk(monkeypatch, chunk):
    """Random texts over a small vocabulary (so that windows often meet), evaluation texts of every length from 0 to
    20 words, rows built from their pieces: the numpy/Arrow rule gives each row the code of the Python reference,
    with the rows read in one chunk or in chunks of 200 characters (a window never runs from one row into the next)."""
    monkeypatch.setattr(contamination, "CHUNK_CHARS", chunk)
    rng = np.random.default_rng(0)
    vocabulary = ["a", "b", "c", "d", "e", "f"]

    def text(length):
        return " ".join(rng.choice(vocabulary, length))

    evaluation = [text(int(k)) for k in rng.integers(0, 21, 60)] + ["", "!!"]
    rows = []
    for _ in range(400):
        pieces = [text(int(rng.integers(0, 6)))]
        if rng.random() < 0.5:
            source = evaluation[int(rng.integers(len(evaluation)))].split()
            start = int(rng.integers(0, len(source) + 1))
            pieces.append(" ".join(source[start : start + int(rng.integers(1, 16))]))
        pieces.append(text(int(rng.integers(0, 6))))
        rows.append(", ".join(pieces))
    index = EvaluationNgrams([fold(pd.Series(evaluation[:30])), fold(pd.Series(evaluation[30:]))], n=5)
    found = index.find(fold(pd.Series(rows)))
    expected = reference(evaluation, rows, n=5)
    assert found.tolist() == expected
    assert {SHARED, CONTAINED, 0} <= set(expected)  # every outcome is tested
    assert index.texts == sum(1 for t in evaluation if t.strip(" !"))


def test_a_pair_row_joins_its_text_and_pair_and_cjk_ideographs_are_words():
    folded = fold_columns(pd.DataFrame({"text": ["One two", "天气"], "pair": ["three", "很好"]}), ["text", "pair"])
    assert joined(folded).tolist() == ["one two three", "天气 很好"]
    index = EvaluationNgrams([fold(pd.Series(["two three", "气很"]))], n=NGRAM)
    assert index.find(joined(folded)).tolist() == [CONTAINED, CONTAINED]
    assert index.find(fold(pd.Series(["one two", "天 气", "twothree"]))).tolist() == [0, 0, 0]
