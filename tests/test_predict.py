"""A trained model a user can deploy: ``kdpipe predict`` on an unlabelled file for every kind of model, a pipeline
that truncates as kdpipe evaluated, and the model card (kdpipe/stages/predict.py, kdpipe/models/card.py)."""

from __future__ import annotations

import pandas as pd
import pytest
from transformers import pipeline

from kdpipe.cli import main
from kdpipe.data.dataset import read_labels, read_split
from kdpipe.models.students import build_student
from kdpipe.stages import evaluate, predict
from kdpipe.stages.predict import PredictSettings
from kdpipe.training.loop import FitResult, save_trained, state_on_cpu
from tests.conftest import eval_settings, model_spec

TINY = {"tokenizer": "builtin:tiny-bert", "hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64}
KINDS = {
    "transformer": {"config": TINY},
    "multihead": {"config": TINY, "heads": {"count": 2, "layers": 1}},
    "bilstm": {
        "type": "bilstm",
        "tokenizer": "builtin:tiny-bert",
        "embedding_dim": 16,
        "hidden_size": 16,
        "fc_size": 16,
    },
}
MAX_LENGTH = 16


def saved_student(kind, labels, folder):
    """A (random, untrained) student of ``kind`` saved as the distill stage saves one."""
    model, tokenizer = build_student(model_spec(KINDS[kind]), labels, seed=1)
    config = {"method": "vanilla_kd", "method_args": {"temperature": 2.0}, "max_length": MAX_LENGTH, "epochs": 1}
    manifest = {"kind": "student", "config": config, "labels": labels, "method": "vanilla_kd", "teachers": ["ta"]}
    result = FitResult(best_state=state_on_cpu(model), best_metrics={"score": 0.5, "accuracy": 0.5}, best_epoch=1)
    save_trained(folder, model, tokenizer, labels, result, manifest)
    return folder


@pytest.fixture(scope="module")
def students(tiny_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("students")
    return {kind: saved_student(kind, read_labels(tiny_data), root / kind) for kind in KINDS}


@pytest.fixture(scope="module")
def unlabelled(tiny_data, tmp_path_factory):
    """The test split's texts without labels, as a user's file."""
    path = tmp_path_factory.mktemp("input") / "texts.csv"
    read_split(tiny_data, "test")[["row_id", "text"]].rename(columns={"text": "article"}).to_csv(path, index=False)
    return path


@pytest.mark.parametrize("kind", KINDS)
def test_predict_agrees_with_kdpipes_evaluation(students, unlabelled, tiny_data, kind, tmp_path):
    out = predict.run(PredictSettings(), students[kind], unlabelled, tmp_path / "pred.parquet", text_column="article")
    params = eval_settings(model=kind, splits=["test"])
    evaluate.run(params, students[kind], tiny_data, [tmp_path / "eval.json"], [tmp_path / "eval.parquet"])
    evaluated = pd.read_parquet(tmp_path / "eval.parquet")
    written = pd.read_parquet(tmp_path / "pred.parquet")
    assert list(written["row_id"].astype(int)) == list(evaluated["row_id"])  # the input's order and columns kept
    assert list(written["label"]) == list(evaluated["pred"])
    assert written["score"].to_numpy() == pytest.approx(evaluated["confidence"].to_numpy(), abs=1e-5)
    probs = written[[f"prob_{c}" for c in read_labels(tiny_data)]].to_numpy()
    assert probs.sum(1) == pytest.approx(1.0, abs=1e-5) and len(out) == len(evaluated)


def test_pipeline_truncates_as_kdpipe_evaluated(students, unlabelled, tmp_path):
    folder = students["transformer"]
    texts = pd.read_csv(unlabelled)["article"].tolist()
    texts.append("word " * 600)  # far beyond the model's 512 positions
    classify = pipeline("text-classification", model=str(folder), truncation=True)
    assert classify.tokenizer.model_max_length == MAX_LENGTH
    frame = pd.DataFrame({"text": texts})
    frame.to_csv(tmp_path / "in.csv", index=False)
    ours = predict.run(PredictSettings(), folder, tmp_path / "in.csv", tmp_path / "out.csv")
    assert [p["label"] for p in classify(texts)] == list(ours["label"])


def test_model_cards_say_how_to_load(students):
    card = (students["transformer"] / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\npipeline_tag: text-classification")
    assert "method `vanilla_kd` from ta." in card and 'pipeline("text-classification"' in card
    assert "order: business, entertainment, politics, sport, tech." in card and "accuracy 0.5000 at epoch 1" in card
    assert f"cuts texts at {MAX_LENGTH} tokens" in card
    for kind in ("multihead", "bilstm"):
        card = (students[kind] / "README.md").read_text()
        assert f"A {kind} model: transformers cannot load it" in card and "load_trained(" in card


def test_model_card_writes_names_as_plain_text_not_code_spans():
    """Class and teacher names are Markdown text (as in the report's files): a backtick, HTML or Markdown syntax in a
    name shows as written."""
    from kdpipe.models.card import model_card

    labels = ["a`b", "<b>x</b>", "**bold** [l](http://x)"]
    manifest = {"kind": "student", "config": {}, "labels": labels, "method": "vanilla_kd", "teachers": ["t_a`"]}
    card = model_card(manifest, {}, params=10, loader="transformers")
    assert "Classes, in output order: a\\`b, &lt;b&gt;x&lt;/b&gt;, \\*\\*bold\\*\\* \\[l\\](http://x)." in card
    assert "method `vanilla_kd` from t_a\\`." in card


def test_bad_input_gets_a_clear_message(students, unlabelled, tmp_path, capsys):
    """Through the command line (in-process), as a user types it: exit status 2, one line, no output file."""

    def kdpipe(model, source):
        status = main(["predict", "--model", str(model), "--input", str(source), "--out", str(tmp_path / "o.csv")])
        return status, capsys.readouterr().err

    status, err = kdpipe(students["transformer"], unlabelled)
    assert status == 2 and "no column 'text' (--text-column); the columns are ['row_id', 'article']" in err
    status, err = kdpipe(tmp_path, unlabelled)
    assert status == 2 and "not a model folder kdpipe wrote" in err
    status, err = kdpipe(students["bilstm"], tmp_path / "nope.csv")
    assert status == 2 and "nope.csv: file not found" in err and "--input" in err
    assert not (tmp_path / "o.csv").exists()


def test_a_missing_text_stops_with_one_line_naming_the_file_column_and_row(students, tmp_path, capsys):
    """A Parquet or JSON null in the text column (or the pair column) has no text to predict from: exit status 2 and
    one line naming the file, the column and the first such row, no traceback and no output file."""
    pd.DataFrame({"text": ["a report", None, "more", None]}).to_parquet(tmp_path / "gap.parquet")
    (tmp_path / "gap.jsonl").write_text('{"text": "a report"}\n\n{"text": "x", "b": null}\n{"text": null}\n')
    (tmp_path / "pair.jsonl").write_text('{"text": "a", "b": "c"}\n{"text": "a", "b": null}\n')
    (tmp_path / "list.jsonl").write_text('{"text": "a"}\n{"text": ["a", "b"]}\n')
    missing = "(counting from 1) has no text (a missing value) in column"
    cases = {
        "gap.parquet": (None, f"data row 2 {missing} 'text' (--text-column) (and 1 more rows)"),
        "gap.jsonl": (None, f"data row 3 {missing} 'text'"),
        "pair.jsonl": ("b", f"data row 2 {missing} 'b' (--text-pair-column)"),
        "list.jsonl": (None, "data row 2 (counting from 1) has a list in column 'text'"),
    }
    for name, (pair, message) in cases.items():
        args = ["predict", "--model", str(students["bilstm"]), "--input", str(tmp_path / name)]
        args += ["--out", str(tmp_path / "o.csv"), *(["--text-pair-column", pair] if pair else [])]
        status = main(args)
        err = capsys.readouterr().err
        assert status == 2 and f"{tmp_path / name}: {message}" in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "o.csv").exists()


def test_nul_characters_are_read_as_spaces_and_counted(students, tmp_path, capsys):
    texts = ["a market\x00report", "no nul here", "\x00sports\x00\x00news"]
    pd.DataFrame({"text": texts}).to_parquet(tmp_path / "in.parquet")
    pd.DataFrame({"text": [t.replace("\x00", " ") for t in texts]}).to_parquet(tmp_path / "spaces.parquet")
    nul = predict.run(PredictSettings(), students["transformer"], tmp_path / "in.parquet", tmp_path / "nul.csv")
    assert "[kdpipe] predict: 4 NUL characters in 2 rows of column 'text' read as spaces" in capsys.readouterr().err
    spaced = predict.run(
        PredictSettings(), students["transformer"], tmp_path / "spaces.parquet", tmp_path / "spaced.csv"
    )
    assert "NUL" not in capsys.readouterr().err
    assert nul["score"].tolist() == spaced["score"].tolist() and nul["text"].tolist() == texts  # the input as given


def test_a_file_in_another_encoding_is_read_with_the_encoding_option(students, tmp_path, capsys):
    """A Windows-1252 file: refused in one line that names predict's own option (`--encoding`, not the dataset's
    setting) and the encoding that works; with that option, its texts are read as written."""
    texts = ["caf\u00e9 prices \u201cfall\u201d", "a plain row"]
    (tmp_path / "win.csv").write_bytes(("text\n" + "\n".join(texts) + "\n").encode("cp1252"))
    args = ["predict", "--model", str(students["transformer"]), "--input", str(tmp_path / "win.csv")]
    args += ["--out", str(tmp_path / "o.csv")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "not valid utf-8 at byte offset 8" in err and "pass --encoding cp1252 if that is its encoding" in err, err
    assert "dataset.encoding" not in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "o.csv").exists()
    assert main([*args, "--encoding", "nosuch"]) == 2
    assert "--encoding 'nosuch' is not a known text encoding" in capsys.readouterr().err
    assert main([*args, "--encoding", "cp1252"]) == 0
    assert pd.read_csv(tmp_path / "o.csv")["text"].tolist() == texts
