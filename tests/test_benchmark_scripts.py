"""The benchmark suite's scripts (experiments/benchmarks/): the data converters give the hub's layout, and the
comparison turns evaluation files into intervals and verdicts."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
import runpy
import shlex
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "experiments" / "benchmarks"


def _load_script(name: str):
    """A script of experiments/benchmarks/ as a module, to call its functions in this process."""
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), SCRIPTS / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(name: str, *args) -> subprocess.CompletedProcess:
    """The script run as ``python SCRIPT ARGS`` would run it (as ``__main__``, from the repository's root), in this
    process: its output, and the exit status a process would have (a ``SystemExit`` message written to stderr with
    status 1, an uncaught exception's traceback with 1). A process of its own would spend most of each test importing
    pandas and kdpipe again."""
    argv = [str(SCRIPTS / name), *map(str, args)]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(REPO), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        saved, sys.argv = sys.argv, argv
        try:
            runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
            if not isinstance(stop.code, int | None):
                print(stop.code, file=sys.stderr)
        except Exception:  # a process would print it and exit with 1
            traceback.print_exc()
            code = 1
        finally:
            sys.argv = saved
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def test_glue_mrpc_from_a_glue_folder_has_the_hubs_columns(tmp_path):
    folder = tmp_path / "glue" / "MRPC"
    folder.mkdir(parents=True)
    head = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    (folder / "train.tsv").write_text(head + '1\t1\t2\tHe said " yes .\tHe agreed .\n0\t3\t4\tA b .\tC d .\n')
    (folder / "dev.tsv").write_text(head + "0\t5\t6\tE f .\tG h .\n")
    (folder / "test.tsv").write_text("index\t#1 ID\t#2 ID\t#1 String\t#2 String\n0\t7\t8\tI j .\tK l .\n")
    result = run_script("public_data.py", "mrpc", "--glue-dir", tmp_path / "glue", "--out", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    loaded = datasets.load_from_disk(str(tmp_path / "out"))
    assert loaded["train"].features["label"].names == ["not_equivalent", "equivalent"]
    assert loaded["train"]["sentence1"] == ['He said " yes .', "A b ."]  # an unbalanced quote read as it is
    assert loaded["train"]["label"] == [1, 0]
    assert loaded["test"]["label"] == [-1]  # GLUE hides its test labels, as the hub's copy does
    assert f"source: {(tmp_path / 'out').resolve()}" in (tmp_path / "out" / "source.yaml").read_text()


def test_glue_qnli_writes_only_the_splits_asked_for(tmp_path):
    folder = tmp_path / "glue" / "QNLI"
    folder.mkdir(parents=True)
    head = "index\tquestion\tsentence\tlabel\n"
    (folder / "dev.tsv").write_text(head + "0\tWho ?\tHe did .\tentailment\n1\tWhen ?\tA b .\tnot_entailment\n")
    refused = run_script("public_data.py", "qnli", "--glue-dir", tmp_path / "glue", "--out", tmp_path / "out")
    assert refused.returncode != 0 and "no train.tsv, test.tsv" in refused.stderr and "--splits" in refused.stderr
    assert not (tmp_path / "out").exists()
    result = run_script(
        "public_data.py", "qnli", "--glue-dir", tmp_path / "glue", "--splits", "validation", "--out", tmp_path / "out"
    )
    assert result.returncode == 0, result.stderr
    loaded = datasets.load_from_disk(str(tmp_path / "out"))
    assert list(loaded) == ["validation"]
    assert loaded["validation"].features["label"].names == ["entailment", "not_entailment"]
    assert loaded["validation"]["question"] == ["Who ?", "When ?"]
    assert loaded["validation"]["sentence"] == ["He did .", "A b ."]
    assert loaded["validation"]["label"] == [0, 1]
    wrong = run_script("public_data.py", "amazon", "--acl-dir", tmp_path, "--splits", "validation", "--out", tmp_path)
    assert wrong.returncode != 0 and "--splits is for GLUE tasks" in wrong.stderr


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("1\tWhen ?\tA b .\tmaybe", "data row 2: label 'maybe' is not one of entailment, not_entailment (or 0-1)"),
        ("1\tWhen ?\tA b .\t5", "data row 2: label '5' is not one of"),
        ("1\tWhen ?\tA b .", "data row 2 has 3 tab-separated fields, its header 4"),
        ("1\tWhen ?\tA\tb .\tentailment", "data row 2 has 5 tab-separated fields, its header 4"),
    ],
)
def test_glue_rows_a_bad_row_is_named(tmp_path, row, message):
    folder = tmp_path / "glue" / "QNLI"
    folder.mkdir(parents=True)
    (folder / "dev.tsv").write_text(f"index\tquestion\tsentence\tlabel\n0\tWho ?\tHe did .\tentailment\n{row}\n")
    out = tmp_path / "out"
    result = run_script(
        "public_data.py", "qnli", "--glue-dir", tmp_path / "glue", "--splits", "validation", "--out", out
    )
    assert result.returncode != 0 and message in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


MRPC_HEAD = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (  # another header: the hub's column names instead of GLUE's
            {"train.tsv": "label\tidx\tsentence1\tsentence2\n1\t0\tA .\tB .\n"},
            "train.tsv: its header has no column '#1 String', '#2 String', 'Quality'; it has ['label', 'idx', "
            "'sentence1', 'sentence2'], and this GLUE file needs ['#1 String', '#2 String', 'Quality']",
        ),
        ({"test.tsv": "index\t#1 ID\t#2 ID\t#1 String\t#2 String\n"}, "test.tsv: no data rows (only a header)"),
        ({"train.tsv": MRPC_HEAD}, "train.tsv: no data rows (only a header)"),
        ({"train.tsv": ""}, "train.tsv: the file is empty (not even a header)"),
        ({"test.tsv": "index\tString\n0\tA .\n"}, "test.tsv: its header has no column '#1 String', '#2 String'"),
    ],
)
def test_glue_files_with_another_header_or_no_rows_are_refused_in_one_line(tmp_path, files, message):
    """A file of another layout, or a split with no data row, stops the script with one line naming the file, its
    exit status not 0, and no folder written (kdpipe could not load a split without rows)."""
    folder = tmp_path / "glue" / "MRPC"
    folder.mkdir(parents=True)
    good = {
        "train.tsv": MRPC_HEAD + "1\t1\t2\tA b .\tC d .\n",
        "dev.tsv": MRPC_HEAD + "0\t5\t6\tE f .\tG h .\n",
        "test.tsv": "index\t#1 ID\t#2 ID\t#1 String\t#2 String\n0\t7\t8\tI j .\tK l .\n",
    }
    for name, text in {**good, **files}.items():
        (folder / name).write_text(text)
    out = tmp_path / "out"
    result = run_script("public_data.py", "mrpc", "--glue-dir", tmp_path / "glue", "--out", out)
    line = result.stderr.strip()
    assert result.returncode != 0 and len(line.splitlines()) == 1, result.stderr
    assert line.startswith(f"{folder / next(iter(files))}: ") and message in line
    assert not out.exists()


def _sst2_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "glue" / "SST-2"
    folder.mkdir(parents=True)
    (folder / "train.tsv").write_text("sentence\tlabel\na fine film \t1\na dull one \t0\n")
    (folder / "dev.tsv").write_text("sentence\tlabel\nit 's good .\t1\n")
    (folder / "test.tsv").write_text('index\tsentence\n0\tbad , " bad .\n1\twell made .\n2\tso - so .\n')
    return folder


def test_sst2_test_labels_come_from_a_labelled_copy_of_the_test_set(tmp_path):
    _sst2_folder(tmp_path)
    labelled = tmp_path / "test-labeled.tsv"
    labelled.write_text('sentence\tlabel\nbad , " bad .\t0\nwell made .\t1\nso - so .\tnegative\n')
    out = tmp_path / "out"
    result = run_script(
        "public_data.py", "sst2", "--glue-dir", tmp_path / "glue", "--test-labels", labelled, "--out", out
    )
    assert result.returncode == 0, result.stderr
    loaded = datasets.load_from_disk(str(out))
    assert loaded["test"]["label"] == [0, 1, 0]  # GLUE's -1 replaced, a label by its id or by its name
    assert loaded["test"]["sentence"] == ['bad , " bad .', "well made .", "so - so ."]
    # the labelled validation rows, then the test rows: one split a config can test on
    assert loaded["validation_test"]["sentence"] == ["it 's good .", 'bad , " bad .', "well made .", "so - so ."]
    assert loaded["validation_test"]["label"] == [1, 0, 1, 0]
    assert loaded["validation"]["label"] == [1] and loaded["train"]["label"] == [1, 0]
    assert "test labels from" in (out / "source.yaml").read_text()


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ('bad , " bad .\t0\nwell made .\t1\n', "2 rows, GLUE's sst2 test set 3"),
        ('bad , " bad .\t0\nwell done .\t1\nso - so .\t0\n', "data row 2: sentence 'well done .' is not GLUE's"),
        ('bad , " bad .\t0\nwell made .\t7\nso - so .\t0\n', "data row 2: label '7' is not one of negative"),
    ],
)
def test_sst2_test_labels_refuse_a_file_that_is_not_the_test_set(tmp_path, rows, message):
    _sst2_folder(tmp_path)
    labelled = tmp_path / "test-labeled.tsv"
    labelled.write_text("sentence\tlabel\n" + rows)
    out = tmp_path / "out"
    result = run_script(
        "public_data.py", "sst2", "--glue-dir", tmp_path / "glue", "--test-labels", labelled, "--out", out
    )
    assert result.returncode != 0 and message in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()
    on_hub = run_script("public_data.py", "sst2", "--hub", "--test-labels", labelled, "--out", out)
    assert on_hub.returncode != 0 and "--test-labels is for GLUE tasks read from --glue-dir" in on_hub.stderr


def test_20newsgroups_from_a_bydate_copy_is_cleaned_as_scikit_learn_cleans_it(tmp_path):
    for split in ("train", "test"):
        for topic in ("sci.space", "alt.atheism"):
            folder = tmp_path / f"20news-bydate-{split}" / topic
            folder.mkdir(parents=True)
            post = f"From: someone\tSubject: {topic}\t\tA post on {topic}.\t> a quoted reply\t"
            (folder / "101").write_text(post, encoding="latin-1")
            (folder / "102").write_text("From: x\tSubject: y\t\t> only a quote\t", encoding="latin-1")
            (folder / "102-o").write_text("not a post", encoding="latin-1")
    out = tmp_path / "out"
    result = run_script("public_data.py", "20newsgroups", "--bydate-dir", tmp_path, "--tabs-are-newlines", "--out", out)
    assert result.returncode == 0, result.stderr
    assert "train: 2 posts empty after cleaning, dropped" in result.stdout
    loaded = datasets.load_from_disk(str(out))
    assert loaded["train"].features["label"].names == ["alt.atheism", "sci.space"]
    assert [t.strip() for t in loaded["test"]["text"]] == ["A post on alt.atheism.", "A post on sci.space."]


def _evaluation(folder: Path, model: str, correct: list[int]) -> None:
    folder.mkdir(parents=True)
    (folder / "test.json").write_text(
        json.dumps({"model": model, "metrics": {"macro_f1": float(np.mean(correct))}, "gold_labels": {"validation": 4}})
    )
    pd.DataFrame({"row_id": range(len(correct)), "correct": correct}).iloc[::-1].to_parquet(
        folder / "test.predictions.parquet"
    )


def test_compare_gives_intervals_and_verdicts(tmp_path):
    rows = 400
    better = [1] * 380 + [0] * 20  # 95%
    worse = [1] * 300 + [0] * 100  # 75%, wrong on a superset of the rows
    for seed in range(3):
        _evaluation(tmp_path / "eval" / f"good.seed{seed}", f"good.seed{seed}", better)
        _evaluation(tmp_path / "eval" / f"bad.seed{seed}", f"bad.seed{seed}", worse)
    result = run_script(
        "compare.py", "--results", tmp_path, "--models", "good", "bad",
        "--claim", "good beats bad by 3", "--claim", "good matches bad within 1",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert f"{rows} test rows" in lines[0]
    assert "One teacher seed (one results folder): the intervals exclude the teacher-seed variance" in lines[1]
    assert "| `good` | 3 | 95.0 |" in result.stdout and "validation 4" in result.stdout
    # one row per test: a claim with a gap tests its direction and its size; the verdicts read Holm's p
    rows_of = {}
    for line in lines:
        if line.startswith("| good "):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            rows_of[cells[0], cells[3].split(":")[0]] = cells
    direction, size = rows_of["good beats bad by 3", "direction"], rows_of["good beats bad by 3", "size"]
    # A - B = 80 of 400 rows, alike in every seed: se sqrt(0.2 * 0.8 / 400) = 2 points, t(399) = 1.966
    low, high = map(float, direction[2].strip("[]").split(","))
    assert direction[1] == "+20.0" and (low, high) == pytest.approx((20 - 3.93, 20 + 3.93), abs=0.15)
    assert direction[-1] == "**direction reproduced**" and size[-1] == "**size reproduced**"
    assert direction[3] == "direction: against 0" and size[3] == "size: against 3"
    assert direction[4:6] == ["<0.001", "<0.001"]  # raw and Holm-adjusted p
    matches = rows_of["good matches bad within 1", "equivalence"]
    assert matches[3].startswith("equivalence: 90% interval [+16.") and matches[3].endswith("in ±1")
    assert matches[-1] == "**not reproduced**" and matches[6].startswith("±")  # the smallest confirmable margin
    assert "One family of 2 claims and 3 tests, Holm-adjusted" in result.stdout


SCORES = {"confidence": "max_prob", "total": "entropy", "aleatoric": "expected_entropy", "epistemic": "mutual_info"}


def _ood_evaluation(folder: Path, model: str, test: dict, ood: dict, bins: int = 15, scores=None) -> None:
    """A model's test and OOD evaluations with the predictions columns ``test`` and ``ood`` (row ids added); its
    ood.json lists ``scores`` (by default those of the OOD columns), its test.json ``bins`` reliability bins."""
    folder.mkdir(parents=True)
    reliability = {"bin_edges": np.linspace(0, 1, bins + 1).tolist()}
    scores = {name: {"auroc": 0.5} for name in scores or [SCORES[c] for c in ood if c in SCORES]}
    for split, columns in (("test", test), ("ood", ood)):
        record = {"model": model, "metrics": {"macro_f1": 0.5, "reliability": reliability}}
        (folder / f"{split}.json").write_text(
            json.dumps(record | ({"ood": {"scores": scores}} if split == "ood" else {}))
        )
        rows = len(next(iter(columns.values())))
        first = 0 if split == "test" else 1000  # OOD rows are numbered after the dataset's
        table = pd.DataFrame({"row_id": range(first, first + rows), **columns})
        table.iloc[::-1].to_parquet(folder / f"{split}.predictions.parquet")


def test_compare_tests_calibration_and_ood_detection(tmp_path):
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    correct = rng.permutation([1] * 480 + [0] * 120)  # 80% right: a confidence of 0.8 is calibrated
    sharp_in, sharp_ood = rng.normal(0, 1, 600), rng.normal(2.5, 1, 200)  # entropy: OOD rows far above
    for seed in range(3):
        _ood_evaluation(
            tmp_path / "eval" / f"calibrated.seed{seed}", "calibrated",
            {"correct": correct, "confidence": np.full(600, 0.8), "total": sharp_in},
            {"confidence": np.full(200, 0.8), "total": sharp_ood},
        )  # fmt: skip
        _ood_evaluation(
            tmp_path / "eval" / f"overconfident.seed{seed}", "overconfident",
            {"correct": correct, "confidence": np.full(600, 0.99), "total": rng.normal(0, 1, 600)},
            {"confidence": np.full(200, 0.99), "total": rng.normal(0, 1, 200)},
        )  # fmt: skip
    base = ["compare.py", "--results", tmp_path, "--models", "calibrated", "overconfident"]
    result = run_script(*base, "--metric", "ece", "--claim", "calibrated beats overconfident")
    assert result.returncode == 0, result.stderr
    assert "| `calibrated` | 3 | 0.0 |" in result.stdout and "| `overconfident` | 3 | 19.0 |" in result.stdout
    assert "macro-F1" not in result.stdout and "lower is better" in result.stdout
    assert "| calibrated beats overconfident | -19.0 |" in result.stdout and "**reproduced**" in result.stdout
    result = run_script(*base, "--metric", "auroc:entropy", "--claim", "calibrated beats overconfident by 20")
    assert result.returncode == 0, result.stderr
    assert "600 test rows against 200 OOD rows" in result.stdout
    auroc = roc_auc_score(np.r_[np.zeros(600), np.ones(200)], np.r_[sharp_in, sharp_ood])
    assert f"| `calibrated` | 3 | {100 * auroc:.1f} |" in result.stdout
    assert "**direction reproduced**" in result.stdout and "**size reproduced**" in result.stdout
    # the ECE's bins are the evaluations' own (evaluate.ece_bins)
    for model in ("calibrated", "overconfident"):
        for seed in range(3):
            record = tmp_path / "eval" / f"{model}.seed{seed}" / "test.json"
            edges = {"bin_edges": np.linspace(0, 1, 3).tolist()}
            record.write_text(json.dumps(json.loads(record.read_text()) | {"metrics": {"reliability": edges}}))
    result = run_script(*base, "--metric", "ece")
    assert result.returncode == 0, result.stderr
    assert "ECE (%, 2 bins)" in result.stdout
    # max_prob is the negated confidence: a constant confidence separates nothing
    result = run_script(*base[:-1], "--metric", "auroc:max_prob")
    assert result.returncode == 0, result.stderr
    assert "| `calibrated` | 3 | 50.0 | [50.0, 50.0] |" in result.stdout


def test_compare_ood_class_keeps_one_held_out_class(tmp_path):
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(1)
    test_total = rng.normal(0, 1, 300)
    # two held-out classes: one far above the test rows' entropy, one below it (taken for a kept class, surely)
    ood_total, ood_label = np.r_[rng.normal(3, 1, 100), rng.normal(-2, 1, 100)], ["far"] * 100 + ["sibling"] * 100
    for seed in range(2):
        _ood_evaluation(
            tmp_path / "eval" / f"m.seed{seed}", "m",
            {"correct": np.ones(300, int), "confidence": np.full(300, 0.9), "total": test_total},
            {"total": ood_total, "ood_label": ood_label},
        )  # fmt: skip
    base = ["compare.py", "--results", tmp_path, "--models", "m", "--metric", "auroc:entropy"]
    for name, rows in (("far", slice(0, 100)), ("sibling", slice(100, 200))):
        result = run_script(*base, "--ood-class", name)
        assert result.returncode == 0, result.stderr
        assert f"300 test rows against 100 OOD rows (held-out class {name})" in result.stdout
        auroc = roc_auc_score(np.r_[np.zeros(300), np.ones(100)], np.r_[test_total, ood_total[rows]])
        assert f"| `m` | 2 | {100 * auroc:.1f} |" in result.stdout
    assert roc_auc_score(np.r_[np.zeros(300), np.ones(100)], np.r_[test_total, ood_total[100:]]) < 0.1
    refused = run_script(*base, "--ood-class", "nowhere")
    assert refused.returncode != 0 and "its held-out classes are far, sibling" in refused.stderr
    refused = run_script(*base[:-2], "--ood-class", "far")
    assert refused.returncode != 0 and "it goes with --metric auroc:SCORE" in refused.stderr
    refused = run_script(*base[:-2], "--ood-class", "")
    assert refused.returncode != 0 and "it goes with --metric auroc:SCORE" in refused.stderr
    # every seed's labels are read: a second seed that labels rows otherwise, or leaves one unlabelled, is refused
    predictions = tmp_path / "eval" / "m.seed1" / "ood.predictions.parquet"
    table = pd.read_parquet(predictions)
    table.loc[table["row_id"] == 1000, "ood_label"] = "sibling"
    table.to_parquet(predictions)
    refused = run_script(*base, "--ood-class", "far")
    assert refused.returncode != 0 and "seed 1 labels its OOD rows other than seed 0 does" in refused.stderr
    table.loc[table["row_id"] == 1000, "ood_label"] = None
    table.to_parquet(predictions)
    refused = run_script(*base, "--ood-class", "far")
    assert refused.returncode != 0 and "has OOD rows without an ood_label" in refused.stderr


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--metric", "auroc"], "write accuracy, ece, or auroc:SCORE"),
        (["--metric", "f1"], "write accuracy, ece, or auroc:SCORE"),
        (["--metric", "auroc:doubt"], "no uncertainty score 'doubt'; the scores are max_prob"),
        (["--metric", "auroc:entropy", "--split", "validation"], "leave --split test"),
        (["--metric", "auroc:entropy", "--models", "both=a+b"], "joins models on disjoint test rows"),
        (["--metric", "auroc:mc_entropy"], "has no score 'mc_entropy' (it has entropy"),
        # a one-member model has no mutual information, though its predictions hold an epistemic column of zeros
        (["--metric", "auroc:mutual_info"], "no score 'mutual_info' (it has entropy, max_prob; a model of one"),
        (["--metric", "auroc:entropy", "--models", "a", "lone"], "seeds [0, 1], its OOD evaluations of [0]"),
        (["--metric", "auroc:entropy", "--models", "a", "blind"], "has no OOD scores (its classes are a subset)"),
        (["--metric", "ece", "--models", "a", "coarse"], "ECE use different numbers of bins ([10, 15])"),
    ],
)
def test_compare_refuses_a_metric_it_cannot_compute(tmp_path, extra, message):
    test, ood = {"correct": [1, 0], "confidence": [0.9, 0.8], "total": [0.1, 0.2]}, {"total": [0.3]}
    for model in ("a", "b"):
        one_member = test | {"epistemic": [0.0, 0.0]}, ood | {"epistemic": [0.0]}, 15, ["entropy", "max_prob"]
        _ood_evaluation(tmp_path / "eval" / model, model, *one_member)
    for seed in (0, 1):  # seed 1's OOD evaluation is missing
        _ood_evaluation(tmp_path / "eval" / f"lone.seed{seed}", "lone", test, ood)
    (tmp_path / "eval" / "lone.seed1" / "ood.json").unlink()
    _ood_evaluation(tmp_path / "eval" / "blind", "blind", test, ood)
    (tmp_path / "eval" / "blind" / "ood.json").write_text(
        json.dumps({"model": "blind", "ood": {"scores": None, "reason": "its classes are a subset"}})
    )
    _ood_evaluation(tmp_path / "eval" / "coarse", "coarse", test, ood, bins=10)
    models = [] if "--models" in extra else ["--models", "a", "b"]
    result = run_script("compare.py", "--results", tmp_path, *models, *extra)
    assert result.returncode != 0 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_compare_tells_an_ensemble_from_its_members(tmp_path):
    # a teacher ensemble is results/eval/full/, its members full.seed0..3: NAME is the ensemble, NAME.seed* the
    # members as seeds of one model
    _evaluation(tmp_path / "eval" / "full", "full", [1] * 90 + [0] * 10)
    for seed in range(4):
        _evaluation(tmp_path / "eval" / f"full.seed{seed}", f"full.seed{seed}", [1] * (80 + seed) + [0] * (20 - seed))
    result = run_script("compare.py", "--results", tmp_path, "--models", "full", "full.seed*", "--claim",
                        "full beats full.seed*")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "| `full` | 1 | 90.0 |" in result.stdout and "| `full.seed*` | 4 | 81.5 |" in result.stdout
    assert "| full beats full.seed* | +8.5 |" in result.stdout
    result = run_script("compare.py", "--results", tmp_path, "--models", "full", "none.seed*")
    assert result.returncode != 0 and "no test.json of none.seedK" in result.stderr


def test_compare_refuses_an_auroc_of_a_per_domain_family(tmp_path):
    # each domain student is scored on the same OOD rows, so they cannot be joined as on the test rows
    test, ood = {"correct": [1, 0], "total": [0.1, 0.2]}, {"total": [0.3]}
    for domain in ("books", "dvd"):
        folder = tmp_path / "eval" / f"fam.{domain}.seed0"
        _ood_evaluation(folder, f"fam.{domain}.seed0", test, ood)
        for split in ("test", "ood"):
            record = json.loads((folder / f"{split}.json").read_text())
            (folder / f"{split}.json").write_text(json.dumps(record | {"group": "fam", "domain": domain}))
    _ood_evaluation(tmp_path / "eval" / "plain", "plain", test, ood)
    result = run_script("compare.py", "--results", tmp_path, "--models", "plain", "fam", "--metric", "auroc:entropy")
    assert result.returncode != 0 and "'fam' is a per-domain family" in result.stderr, result.stderr


def _domain_evaluation(folder: Path, record: dict, rows: list[int], correct: list[int], domains: list[str]) -> None:
    folder.mkdir(parents=True)
    (folder / "test.json").write_text(json.dumps({"metrics": {"macro_f1": 0.0}, "gold_labels": {}} | record))
    label = ["pos"] * len(rows)
    pred = ["pos" if c else "neg" for c in correct]
    pd.DataFrame({"row_id": rows, "label": label, "pred": pred, "correct": correct, "domain": domains}).to_parquet(
        folder / "test.predictions.parquet"
    )


def test_compare_joins_a_per_domain_family_into_one_model(tmp_path):
    """Each domain student is scored on its own domain's rows; the family's seed is their join, paired row by row
    with a model of every row (the teacher)."""
    half = 100
    books, dvd = list(range(half)), list(range(half, 2 * half))
    for seed in range(3):
        for domain, rows, right in (("books", books, 90), ("dvd", dvd, 70)):
            record = {"model": f"meta_kd.{domain}.seed{seed}", "group": "meta_kd", "domain": domain, "seed": seed}
            record["gold_labels"] = {"validation": 10 + len(domain), "train": 200}  # its own validation rows
            correct = [1] * right + [0] * (half - right)
            _domain_evaluation(tmp_path / "eval" / record["model"], record, rows, correct, [domain] * half)
    teacher = [1] * 60 + [0] * 40 + [1] * 60 + [0] * 40  # 60% on each domain, wrong on a superset of the rows
    _domain_evaluation(
        tmp_path / "eval" / "plain", {"model": "plain"}, books + dvd, teacher, ["books"] * half + ["dvd"] * half
    )
    result = run_script(
        "compare.py", "--results", tmp_path, "--models", "plain", "meta_kd", "--claim", "meta_kd beats plain"
    )
    assert result.returncode == 0, result.stderr
    assert "200 test rows" in result.stdout
    assert "| `meta_kd` | 3 | 80.0 |" in result.stdout  # (90 + 70) / 200 rows, not one domain's
    assert "| `meta_kd` | 90.0 | 70.0 | 80.0 |" in result.stdout  # per domain, then their mean
    assert "| each: train 200 · validation 13–15 |" in result.stdout  # per domain student, not summed
    # macro-F1 over the classes of labels and predictions: pos 2·160 / (160 + 200), neg 0 (predicted, never gold)
    assert "| `meta_kd` | 3 | 80.0 |" in result.stdout and "| 44.4 ± 0.0 |" in result.stdout
    assert "| `plain` | 60.0 | 60.0 | 60.0 |" in result.stdout
    assert "+20.0" in result.stdout and "**reproduced**" in result.stdout

    for seed in range(3):  # one single-domain student per domain, joined by NAME=A+B
        for domain, rows, right in (("books", books, 80), ("dvd", dvd, 80)):
            record = {"model": f"kd_only_{domain}.seed{seed}", "domain": domain, "seed": seed}
            correct = [1] * right + [0] * (half - right)
            _domain_evaluation(tmp_path / "eval" / record["model"], record, rows, correct, [domain] * half)
    models = ["meta_kd", "single=kd_only_books+kd_only_dvd"]
    result = run_script("compare.py", "--results", tmp_path, "--models", *models, "--claim", "meta_kd beats single")
    assert result.returncode == 0, result.stderr
    assert "| `single` | 3 | 80.0 |" in result.stdout and "| `single` | 80.0 | 80.0 | 80.0 |" in result.stdout
    assert "| meta_kd beats single | +0.0 |" in result.stdout
    for bad in ("kd_only_books+kd_only_dvd", "single=kd_only_books+"):
        result = run_script("compare.py", "--results", tmp_path, "--models", bad)
        assert result.returncode != 0 and "NAME=A+B" in result.stderr
    (tmp_path / "eval" / "kd_only_dvd.seed2" / "test.json").unlink()
    result = run_script("compare.py", "--results", tmp_path, "--models", "single=kd_only_books+kd_only_dvd")
    assert result.returncode != 0
    assert "need the same seeds (kd_only_books [0, 1, 2], kd_only_dvd [0, 1])" in result.stderr

    (tmp_path / "eval" / "meta_kd.dvd.seed2" / "test.json").unlink()  # a seed with a domain missing
    result = run_script("compare.py", "--results", tmp_path, "--models", "plain", "meta_kd")
    assert result.returncode != 0 and "family 'meta_kd' seed 2 has no test.json for domain dvd" in result.stderr


def test_compare_finds_a_per_domain_family_of_one_seed(tmp_path):
    """A per-domain student with one seed is evaluated as NAME.DOMAIN (no .seedK): its seed is the one its
    evaluation records, so two such families pair as seed k with seed k."""
    half = 100
    for name, right in (("meta_kd", (90, 70)), ("kd_plain", (80, 60))):
        for (domain, rows), r in zip((("books", range(half)), ("dvd", range(half, 2 * half))), right, strict=True):
            record = {"model": f"{name}.{domain}", "group": name, "domain": domain, "seed": 4}
            correct = [1] * r + [0] * (half - r)
            _domain_evaluation(tmp_path / "eval" / record["model"], record, list(rows), correct, [domain] * half)
    result = run_script(
        "compare.py", "--results", tmp_path, "--models", "meta_kd", "kd_plain", "--claim", "meta_kd beats kd_plain"
    )
    assert result.returncode == 0, result.stderr
    assert "| `meta_kd` | 1 | 80.0 |" in result.stdout and "| `kd_plain` | 1 | 70.0 |" in result.stdout
    assert "| `meta_kd` | 90.0 | 70.0 | 80.0 |" in result.stdout
    assert "| meta_kd beats kd_plain | +10.0 |" in result.stdout
    result = run_script("compare.py", "--results", tmp_path, "--models", "none")
    assert result.returncode != 0 and "none.DOMAIN.seedK or none.DOMAIN" in result.stderr


def test_compare_reads_seeds_from_folder_names_and_refuses_what_it_cannot_pair(tmp_path):
    half = 50
    for seed in range(3):  # no "seed" in the records: the folder names say it
        for domain, rows in (("books", range(half)), ("dvd", range(half, 2 * half))):
            record = {"model": f"fam.{domain}.seed{seed}", "group": "fam", "domain": domain}
            correct = [1] * (10 * (seed + 1)) + [0] * (half - 10 * (seed + 1))  # 20%, 40%, 60%
            _domain_evaluation(tmp_path / "eval" / record["model"], record, list(rows), correct, [domain] * half)
    for seed in range(3):
        _evaluation(tmp_path / "eval" / f"kd.seed{seed}", f"kd.seed{seed}", [1] * 90 + [0] * 10)
    _evaluation(tmp_path / "eval" / "kd.seed_sweep.seed0", "kd.seed_sweep.seed0", [0] * 100)  # not a seed of kd
    result = run_script("compare.py", "--results", tmp_path, "--models", "fam", "kd")
    assert result.returncode == 0, result.stderr
    assert "| `fam` | 3 | 40.0 |" in result.stdout and "| `kd` | 3 | 90.0 |" in result.stdout

    result = run_script("compare.py", "--results", tmp_path, "--models", "kd", "kd=fam")
    assert result.returncode != 0 and "a name given twice" in result.stderr

    _domain_evaluation(tmp_path / "eval" / "half", {"model": "half"}, list(range(half)), [1] * half, ["books"] * half)
    result = run_script("compare.py", "--results", tmp_path, "--models", "kd", "half")
    assert result.returncode != 0 and "other test rows (100 and 50)" in result.stderr

    wrong = tmp_path / "eval" / "fam.dvd.seed1" / "test.predictions.parquet"  # the dvd student scored on books rows
    pd.read_parquet(wrong).assign(domain="books").to_parquet(wrong)
    result = run_script("compare.py", "--results", tmp_path, "--models", "fam")
    assert result.returncode != 0 and "a student of domain 'dvd' has predictions of rows of ['books']" in result.stderr


def _run_with_texts(results: Path, row_ids: list[int], texts: list[str], models: dict[str, list[int]]) -> None:
    """A run's results/: its prepared test split (row ids and texts) and models of 3 seeds, each right on the rows
    given (positions in ``texts``)."""
    (results / "data" / "reviews").mkdir(parents=True)
    pd.DataFrame({"row_id": row_ids, "text": texts}).to_parquet(results / "data" / "reviews" / "test.parquet")
    for model, right in models.items():
        for seed in range(3):
            folder = results / "eval" / f"{model}.seed{seed}"
            folder.mkdir(parents=True)
            (folder / "test.json").write_text(json.dumps({"model": model, "metrics": {"macro_f1": 0.5}}))
            correct = [int(i in right) for i in range(len(texts))]
            pd.DataFrame({"row_id": row_ids, "correct": correct}).to_parquet(folder / "test.predictions.parquet")


def test_compare_tests_a_difference_of_gains_across_two_runs_of_the_same_texts(tmp_path):
    """The little-data run and the full run score the same reviews under other row ids: rows are matched by text."""
    texts = [f"review {i}" for i in range(200)]
    little, full = tmp_path / "little" / "results", tmp_path / "full" / "results"
    # little: gain 30 points (A right on 0-159, B on 0-99); its rows numbered 0..199
    _run_with_texts(little, list(range(200)), texts, {"a": range(160), "b": range(100)})
    # full: gain 5 points (A on 0-149, B on 0-139), rows numbered backwards from 1000
    _run_with_texts(full, [1000 - i for i in range(200)], texts, {"a": range(150), "b": range(140)})
    claim = "(a - b) beats (full:a - full:b) by 2"
    args = ["--results", little, "--also", f"full={full}", "--models", "a", "b", "full:a", "full:b"]
    result = run_script("compare.py", *args, "--claim", claim, "--claim", "a beats full:a")
    assert result.returncode == 0, result.stderr
    assert "| `full:a` | 3 | 75.0 |" in result.stdout
    assert f"| {claim} | +25.0 | [+" in result.stdout and "**direction reproduced**" in result.stdout
    # matched by text: a is right wherever full:a is, and on 10 rows more (5%), so the paired interval starts at
    # +2.0 (se sqrt(0.05 * 0.95 / 200) = 1.54 points) and p is 0.001 (t = 3.24 with 199 degrees of freedom); had
    # full's rows kept their own order, a and full:a would disagree on 150 rows
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("| a beats full:a |")]
    assert line.startswith("| a beats full:a | +5.0 | [+2.0, ") and "| 0.001 |" in line

    compare = _load_script("compare.py")
    refusals = {
        ("--models", "a", "full:a", "--also", "full=" + str(tmp_path / "nowhere")): "has no eval/ folder",
        ("--models", "a", "other:a"): "no run 'other' (give it as --also other=DIR)",
        ("--models", "a", "j=a+full:b"): "joined models must come from one run",
        ("--models", "a", "b", "--claim", "(a - b) beats a"): "compares a model with a gain",
        ("--models", "a", "b", "--claim", "(a - a) beats (b - a)"): "compares a model with itself",
        ("--models", "a", "b", "--claim", "(a-b) beats a"): "a-b not among --models; write a gain as (A - B)",
        ("--models", "a", "full:a=b"): "a NAME of your own has no ':'",
        ("--models", "a", ":a"): "write NAME, or LABEL:NAME",
        ("--also", f"full={little}", "--models", "a"): "the label 'full' is given twice",
    }
    for extra, message in refusals.items():
        with pytest.raises(SystemExit, match=re.escape(message)):
            compare.main(["--results", str(little), "--also", f"full={full}", *extra])

    data = pd.read_parquet(full / "data" / "reviews" / "test.parquet")
    data.loc[0, "text"] = "another review"  # a text the little run does not have
    data.to_parquet(full / "data" / "reviews" / "test.parquet")
    result = run_script("compare.py", *args)
    assert result.returncode != 0
    assert "model 'full:a': 1 of its rows have texts that are not in the --results run's split" in result.stderr
    data.loc[0, "text"] = "review 0"

    # the other run's data with a second side that is empty on every row reads as single texts, as this run's
    data.assign(text_pair=None).to_parquet(full / "data" / "reviews" / "test.parquet")
    assert run_script("compare.py", *args).returncode == 0
    for seed in range(3):  # a row its run's data does not have (ids run 1000 down to 801)
        every = full / "eval" / f"a.seed{seed}" / "test.predictions.parquet"
        pd.read_parquet(every).replace({"row_id": {1000: 5}}).to_parquet(every)
    with pytest.raises(SystemExit, match=re.escape("model 'full:a': 1 of its rows are not in its run's prepared")):
        compare.main(list(map(str, args)))
    for seed in range(3):
        every = full / "eval" / f"a.seed{seed}" / "test.predictions.parquet"
        pd.read_parquet(every).replace({"row_id": {5: 1000}}).to_parquet(every)
    predictions = full / "eval" / "a.seed1" / "test.predictions.parquet"
    table = pd.read_parquet(predictions)
    table["correct"] = table["correct"].astype(float)
    table.loc[3, "correct"] = np.nan  # a row without its outcome: refused, not a NaN verdict
    table.to_parquet(predictions)
    with pytest.raises(SystemExit, match="lack a 'correct' value for some rows"):
        compare.main(list(map(str, args)))
    predictions.unlink()
    with pytest.raises(SystemExit, match="test.predictions.parquet: missing"):
        compare.main(list(map(str, args)))
    _run_with_texts(tmp_path / "plain" / "results", [0, 1], ["x", "y"], {"a": [0]})
    pd.DataFrame({"row_id": [0, 1]}).to_parquet(tmp_path / "plain" / "results" / "data" / "reviews" / "test.parquet")
    with pytest.raises(SystemExit, match="no row_id and text columns"):
        compare.main(["--results", str(little), "--also", f"p={tmp_path / 'plain' / 'results'}", "--models", "p:a"])


def _table_row(stdout: str, start: str) -> list[str]:
    """The cells of the one Markdown row of ``stdout`` that starts with ``start``."""
    (line,) = [line for line in stdout.splitlines() if line.startswith(start)]
    return [cell.strip() for cell in line.strip("|").split("|")]


def _interval(cell: str) -> tuple[float, float]:
    low, high = cell.strip("[]").split(",")
    return float(low), float(high)


def test_compare_takes_the_teacher_seeds_of_an_experiment_from_several_results_folders(tmp_path, capsys):
    """Three runs of one experiment under teacher seeds 0, 1, 2: A - B is +5, 0 and +10 points (rows 140-149, none,
    rows 150-169 of 200), alike over each run's 3 student seeds. One run alone reproduces "a beats b"; the three
    runs, whose teacher seeds disagree, leave it undecided: the teacher seeds' means have variance 25 (points²), so
    the teacher level adds 25 / 3 (se 2.89 points) with 2 degrees of freedom, t = 4.303, and the rows nothing beyond
    the noise the teacher seeds' spread already holds (each extra row is right under one teacher seed only)."""
    compare = _load_script("compare.py")
    texts, ids = [f"review {i}" for i in range(200)], list(range(200))
    folders = [tmp_path / f"t{k}" / "results" for k in range(3)]
    extras = ([*range(140, 150)], [], [*range(150, 170)])
    for folder, extra in zip(folders, extras):
        _run_with_texts(folder, ids, texts, {"a": [*range(140), *extra], "b": range(140)})
    base = ["--models", "a", "b", "--claim", "a beats b"]
    compare.main(["--results", str(folders[0]), *base])
    one = capsys.readouterr().out
    assert "One teacher seed (one results folder): the intervals exclude the teacher-seed variance" in one
    single = _table_row(one, "| a beats b |")
    assert single[1] == "+5.0" and single[-1] == "**reproduced**"  # se sqrt(0.05 * 0.95 / 200) = 1.54 points
    assert "per teacher seed" not in one  # one folder: no table per teacher seed
    compare.main(["--results", *map(str, folders), *base])
    three, per_teacher = capsys.readouterr().out.split("Accuracy (%) per teacher seed, the mean over its student")
    assert f"3 teacher seeds in --results ({', '.join(map(str, folders))}): the intervals include" in three
    assert _table_row(three, "| `a` |")[:3] == ["`a`", "3 × 3", "75.0"]
    # each folder's mean over its student seeds, the folders by their order in the run
    assert _table_row(per_teacher, "| model |") == ["model", "folder 1", "folder 2", "folder 3"]
    assert _table_row(per_teacher, "| `a` |") == ["`a`", "75.0", "70.0", "80.0"]
    assert _table_row(per_teacher, "| `b` |") == ["`b`", "70.0", "70.0", "70.0"]
    claim = _table_row(per_teacher, "| a beats b |")
    assert claim[1] == "+5.0" and claim[-1] == "**undecided at this power**"
    assert _interval(claim[2]) == pytest.approx((5 - 4.303 * 2.887, 5 + 4.303 * 2.887), abs=0.15)

    # another run of the same texts with its own teacher seeds, paired with these by position
    others = [tmp_path / f"o{k}" / "results" for k in range(3)]
    for folder, extra in zip(others, extras):
        _run_with_texts(folder, ids, texts, {"a": [*range(140), *extra]})
    compare.main(["--results", *map(str, folders), "--also", f"o={others[0]}", *map(str, others[1:]),
                  "--models", "a", "o:a", "--claim", "a matches o:a within 1"])  # fmt: skip
    out = capsys.readouterr().out
    same = _table_row(out, "| a matches o:a within 1 |")
    assert same[1:3] == ["+0.0", "[+0.0, +0.0]"] and same[-1] == "**reproduced**"
    assert _table_row(out.split("per teacher seed")[1], "| `o:a` |") == ["`o:a`", "75.0", "70.0", "80.0"]
    # one --results folder and an --also run of three: the table holds the other run's teacher seeds, and "–" where
    # a model has no folder of that position
    compare.main(["--results", str(folders[0]), "--also", f"o={others[0]}", *map(str, others[1:]),
                  "--models", "a", "o:a"])  # fmt: skip
    per_teacher = capsys.readouterr().out.split("per teacher seed")[1]
    assert _table_row(per_teacher, "| `a` |") == ["`a`", "75.0", "–", "–"]
    assert _table_row(per_teacher, "| `o:a` |") == ["`o:a`", "75.0", "70.0", "80.0"]

    refusals = {
        ("--results", str(folders[0]), str(folders[0])): "--results: a folder given twice",
        ("--results", str(folders[0]), str(tmp_path / "t9")): f"{tmp_path / 't9'}/eval: no test.json of model 'a'",
    }
    for extra, message in refusals.items():
        with pytest.raises(SystemExit, match=re.escape(message)):
            compare.main([*extra, *base])
    data = folders[2] / "data" / "reviews" / "test.parquet"
    pd.read_parquet(data).assign(text=lambda t: t["text"] + " (another split)").to_parquet(data)
    with pytest.raises(SystemExit, match=re.escape(f"{folders[2]}: its test split is not that of {folders[0]}")):
        compare.main(["--results", *map(str, folders), *base])


def test_power_projects_a_claim_over_more_teacher_seeds(tmp_path, capsys):
    """The three runs of the test above: A - B is +5, 0 and +10 points under teacher seeds 0-2, so the top level's
    part of the variance is 25 / 3 points² (se 2.89) and the rows add nothing. With T teacher seeds the standard error
    is sqrt(25 / T), with T - 1 degrees of freedom: T = 3 detects (4.303 + 1.061) · 2.887 = 15.5 points, T = 12
    (2.201 + 0.876) · 1.443 = 4.4; a match within 5 is confirmable at T = 12 ((1.796 + 1.363) · 1.443 = 4.6), not
    at T = 3 ((2.920 + 1.886) · 2.887 = 13.9)."""
    power = _load_script("power.py")
    texts, ids = [f"review {i}" for i in range(200)], list(range(200))
    folders = [tmp_path / f"t{k}" / "results" for k in range(3)]
    for folder, extra in zip(folders, ([*range(140, 150)], [], [*range(150, 170)])):
        _run_with_texts(folder, ids, texts, {"a": [*range(140), *extra], "b": range(140)})
    power.main(["--results", *map(str, folders), "--models", "a", "b", "--claim", "a beats b",
                "--claim", "a matches b within 5", "--teacher-seeds", "3", "12"])  # fmt: skip
    out = capsys.readouterr().out
    assert out.startswith("200 test rows; designs over teacher seeds")
    lines = [line for line in out.splitlines() if line.startswith("| a ")]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    assert [c[0] for c in cells] == ["a beats b", "a beats b", "a matches b within 5", "a matches b within 5"]
    assert cells[0][1:5] == ["+5.0", "2.89", "2.89 (3)", "0.00"]
    assert [float(c[6]) for c in cells] == pytest.approx([15.5, 4.4, 13.9, 4.6], abs=0.05)
    # a plain "beats" is read against the observed difference (5 points): reached by 12 teacher seeds, not 3
    assert [c[7] for c in cells] == ["no (5.0)", "yes (5.0)", "no (5.0)", "yes (5.0)"]
    with pytest.raises(SystemExit, match="at least 2 each"):
        power.main(["--results", str(folders[0]), "--models", "a", "b", "--teacher-seeds", "1"])
    with pytest.raises(SystemExit, match="above 0, finite"):
        power.main(["--results", str(folders[0]), "--models", "a", "b", "--rows-factor", "nan"])
    with pytest.raises(SystemExit):
        power.main(["--help"])
    shown = capsys.readouterr().out  # power's own options, beside compare's
    assert "--teacher-seeds T" in shown and "--rows-factor F" in shown and "--claim CLAIM" in shown


def test_power_at_the_runs_own_design_gives_compares_detectable_difference(tmp_path, capsys):
    """Models of other seed counts (a: 3 seeds at 70, 65 and 75%; b: 1 seed), drawn apart: the run's own design (3
    seeds) projects the difference compare.py detects; the one-seed model is named as such by both."""
    power, compare = _load_script("power.py"), _load_script("compare.py")
    results = tmp_path / "results"
    _run_with_texts(results, list(range(200)), [f"review {i}" for i in range(200)], {"a": [], "b": range(100)})
    for seed, right in enumerate((140, 130, 150)):
        predictions = results / "eval" / f"a.seed{seed}" / "test.predictions.parquet"
        pd.DataFrame({"row_id": range(200), "correct": [int(i < right) for i in range(200)]}).to_parquet(predictions)
    for seed in (1, 2):
        shutil.rmtree(results / "eval" / f"b.seed{seed}")
    base = ["--results", str(results), "--models", "a", "b", "--claim", "a beats b"]
    compare.main(base)
    out = capsys.readouterr().out
    assert "Of one seed: `b`; its seed-to-seed variance is not sampled" in out
    detectable = _table_row(out, "| a beats b |")[6]
    # the verdict itself says what its interval leaves out
    caveat = "(a model of one seed: its seeds' variance is not in the interval)"
    assert _table_row(out, "| a beats b |")[7].endswith(caveat)
    power.main([*base, "--teacher-seeds", "3", "30"])
    out = capsys.readouterr().out
    assert "Of one seed: `b`" in out
    rows = [_table_row(line, "| a beats b |") for line in out.splitlines() if line.startswith("| a beats b |")]
    assert rows[0][3] == "2.89 (3 and 1)" and rows[0][6] == detectable  # sqrt(25 / 3) points: a's seeds alone
    assert float(rows[1][6]) < float(detectable)
    # two units: twice the rows shrink the standard error, but the degrees of freedom fall towards the top level's 1,
    # so compare.py's test would detect less; the line says so, and the one of fewer rows does not
    power.main([*base, "--teacher-seeds", "2", "--rows-factor", "2", "1"])
    out = capsys.readouterr().out
    rows = [_table_row(line, "| a beats b |") for line in out.splitlines() if "| a beats b |" in line]
    assert [row[5] for row in rows] == ["2 × 1 rows", "2 × 2 rows"]
    assert rows[0][6] == "21.2" and rows[1][6] == "26.9 (more rows lower the degrees of freedom)"
    refusals = {
        ("--target", "-1"): "--target -1: points above 0 and below 100",
        ("--target", "nan"): "--target nan: points above 0 and below 100",
        ("--target", "100"): "--target 100: points above 0 and below 100",
    }
    for extra, message in refusals.items():
        with pytest.raises(SystemExit, match=re.escape(message)):
            power.main([*base, *extra])
    with pytest.raises(SystemExit, match="no --claim: power.py projects claims"):
        power.main(base[:-2])


def test_a_verdict_on_models_of_other_student_seeds_says_they_were_drawn_apart(tmp_path, capsys):
    """a of seeds 0-2 against b of seeds 0-1: no seed pairs the two, so each is drawn apart, and the verdict says so;
    with the same seeds it says nothing."""
    compare = _load_script("compare.py")
    results = tmp_path / "results"
    _run_with_texts(results, list(range(200)), [f"review {i}" for i in range(200)], {"a": range(150), "b": range(100)})
    base = ["--results", str(results), "--models", "a", "b", "--claim", "a beats b"]
    compare.main(base)
    assert _table_row(capsys.readouterr().out, "| a beats b |")[7] == "**reproduced**"
    shutil.rmtree(results / "eval" / "b.seed2")
    compare.main(base)
    verdict = _table_row(capsys.readouterr().out, "| a beats b |")[7]
    assert verdict.endswith("** (other student seeds: drawn apart, not paired)")
    shutil.copytree(results / "eval" / "b.seed1", results / "eval" / "b.seed01")
    with pytest.raises(SystemExit, match=re.escape(f"{results}/eval: b.seed01 and b.seed1 are both seed 1")):
        compare.main(base)


def test_compare_draws_clusters_of_rows(tmp_path, capsys):
    """QNLI-like pairs: 100 questions of 2 rows each, a right on both rows of 70 questions, b on none. Drawn by
    question, the interval of A - B is that of 100 outcomes, sd sqrt(0.7 * 0.3 / 100) = 4.58 points with 99 degrees
    of freedom (t = 1.984); by row, of 200 (3.24 points, t = 1.972)."""
    compare = _load_script("compare.py")
    results = tmp_path / "results"
    _run_with_texts(results, list(range(200)), [f"pair {i}" for i in range(200)], {"a": range(140), "b": []})
    data = results / "data" / "reviews" / "test.parquet"
    pd.read_parquet(data).assign(question=[f"question {i // 2}" for i in range(200)]).to_parquet(data)
    base = ["--results", str(results), "--models", "a", "b", "--claim", "a beats b"]
    compare.main([*base, "--cluster-column", "question"])
    by_question = capsys.readouterr().out
    assert by_question.startswith("200 test rows in 100 clusters by 'question'; 95% intervals")
    low, high = _interval(_table_row(by_question, "| a beats b |")[2])
    assert (high - low) / 2 == pytest.approx(1.984 * 4.58, rel=0.05)
    compare.main(base)
    low, high = _interval(_table_row(capsys.readouterr().out, "| a beats b |")[2])
    assert (high - low) / 2 == pytest.approx(1.972 * 3.24, rel=0.05)
    with pytest.raises(SystemExit, match="has no such column; its columns are row_id, text, question"):
        compare.main([*base, "--cluster-column", "topic"])
    # one cluster (or row_id, every row its own) is refused: drawn, one cluster would give a zero-width interval
    pd.read_parquet(data).assign(question="the same").to_parquet(data)
    with pytest.raises(SystemExit, match="all in one cluster; drawing clusters needs at least two"):
        compare.main([*base, "--cluster-column", "question"])
    with pytest.raises(SystemExit, match="every row is a cluster of its own already"):
        compare.main([*base, "--cluster-column", "row_id"])


def test_compare_refuses_a_test_of_one_row_and_names_an_unreadable_file(tmp_path):
    """One test row would give a zero-width interval and a decided verdict: refused. A predictions file cut short,
    an evaluation record cut short and a file listing a row twice are named, with what to do."""
    compare = _load_script("compare.py")
    one = tmp_path / "one" / "results"
    _run_with_texts(one, [0], ["a review"], {"a": [0], "b": []})
    with pytest.raises(SystemExit, match="its test predictions have 1 row\\(s\\); a test needs two"):
        compare.main(["--results", str(one), "--models", "a", "b", "--claim", "a beats b"])
    results = tmp_path / "run" / "results"
    _run_with_texts(results, list(range(20)), [f"review {i}" for i in range(20)], {"a": range(15), "b": range(10)})
    base = ["--results", str(results), "--models", "a", "b", "--claim", "a beats b"]
    predictions = results / "eval" / "b.seed1" / "test.predictions.parquet"
    table = pd.read_parquet(predictions)
    predictions.write_bytes(predictions.read_bytes()[:40])
    with pytest.raises(SystemExit, match=f"{re.escape(str(predictions))}: not a readable Parquet file"):
        compare.main(base)
    pd.concat([table, table.iloc[:1]]).to_parquet(predictions)
    with pytest.raises(SystemExit, match=f"{re.escape(str(predictions))}: lists some rows twice"):
        compare.main(base)
    table.to_parquet(predictions)
    record = results / "eval" / "b.seed1" / "test.json"
    record.write_text('{"model": "b", "metr')
    with pytest.raises(SystemExit, match=f"{re.escape(str(record))}: not a readable evaluation record"):
        compare.main(base)
    with pytest.raises(SystemExit, match="a claim given twice"):
        compare.main([*base, "--claim", "a  beats b"])
    with pytest.raises(SystemExit, match="a gap or margin is a size in points, 0 or more"):
        compare.main([*base[:-2], "--claim", "a beats b by -1"])
    with pytest.raises(SystemExit, match="a gap or margin of 100 points is the whole 0-100 scale"):
        compare.main([*base[:-2], "--claim", "a matches b within 100"])


def _compare_commands():
    """Every compare.py command the README, docs/ and the experiments' comments give, continuation lines joined."""
    for path in [REPO / "README.md", *(REPO / "docs").rglob("*.md"), *(REPO / "experiments").rglob("*.yaml")]:
        lines = path.read_text().splitlines()
        if path.suffix == ".yaml":
            lines = [re.sub(r"^\s*#\s?", "", line) for line in lines]
        for line in "\n".join(lines).replace("\\\n", " ").splitlines():
            if line.lstrip().startswith(".venv/bin/python experiments/benchmarks/compare.py"):
                yield path.relative_to(REPO), shlex.split(line)[2:]


def test_every_compare_command_the_docs_give_parses():
    compare = _load_script("compare.py")
    found = list(_compare_commands())
    assert len(found) >= 8  # the write-ups' tables and the configs' comments
    for path, argv in found:
        args, models, _ = compare.arguments(argv)  # stops on an unknown option, a malformed model or claim
        assert all(re.fullmatch(r"[\w.:=+-]+(\.seed\*)?", m) for m in args.models), (path, args.models)


@pytest.mark.parametrize(
    "claim",
    [
        "good wins bad",
        "good beats nobody",
        "good beats bad within 1",  # a gap is "by", a margin "within"
        "good beats bad by 1.2.3",
        "good matches bad",  # a match needs its margin
        "good matches bad within 0",  # which can never be shown
        "good beats good",
    ],
)
def test_compare_refuses_a_claim_it_cannot_read(tmp_path, claim):
    _evaluation(tmp_path / "eval" / "good", "good", [1, 0])
    _evaluation(tmp_path / "eval" / "bad", "bad", [0, 0])
    result = run_script("compare.py", "--results", tmp_path, "--models", "good", "bad", "--claim", claim)
    assert result.returncode != 0 and claim in result.stderr
    assert "| model |" not in result.stdout  # refused before any table


def test_amazon_reviews_split_per_domain_and_thin_one_domain(tmp_path):
    acl = tmp_path / "sorted_data_acl"
    for folder in ("books", "dvd", "electronics", "kitchen_&_housewares"):
        (acl / folder).mkdir(parents=True)
        for polarity in ("positive", "negative"):
            reviews = "".join(
                f"<review>\n<rating>\n5.0\n</rating>\n<review_text>\n{folder} {polarity} {i} & more\n</review_text>\n"
                "</review>\n"
                for i in range(20)
            )
            (acl / folder / f"{polarity}.review").write_text(reviews, encoding="latin-1")
    out = tmp_path / "out"
    result = run_script("public_data.py", "amazon", "--acl-dir", acl, "--little", "kitchen=0.25", "--out", out)
    assert result.returncode == 0, result.stderr
    loaded = datasets.load_from_disk(str(out))
    train, test = loaded["train"].to_pandas(), loaded["test"].to_pandas()
    assert test.groupby(["domain", "label"]).size().tolist() == [4] * 8  # 20% of each (domain, polarity)
    assert train.groupby("domain").size().to_dict() == {"books": 32, "dvd": 32, "electronics": 32, "kitchen": 8}
    assert not set(train["text"]) & set(test["text"])
    assert train["text"].iloc[0].startswith("books ") and train["text"].iloc[0].endswith("& more")
    bad = run_script("public_data.py", "amazon", "--acl-dir", acl, "--little", "garden=0.1", "--out", tmp_path / "x")
    assert bad.returncode != 0 and "no domain ['garden']" in bad.stderr


def test_texts_writes_one_splits_column_as_an_ood_file(tmp_path):
    folder = tmp_path / "sst2"
    rows = {"sentence": [f"sentence {i}" for i in range(10)], "label": [i % 2 for i in range(10)]}
    datasets.DatasetDict({"validation": datasets.Dataset.from_dict(rows)}).save_to_disk(str(folder))
    out = tmp_path / "ood.parquet"
    args = ["texts", "--from-dir", folder, "--split", "validation", "--column", "sentence", "--out", out]
    result = run_script("public_data.py", *args, "--rows", 4)
    assert result.returncode == 0, result.stderr
    texts = pd.read_parquet(out)["text"].tolist()
    assert len(texts) == 4 and set(texts) < set(rows["sentence"])
    assert texts == sorted(texts, key=lambda t: int(t.split()[1]))  # the dataset's order kept
    assert run_script("public_data.py", *args, "--rows", 4).returncode == 0
    assert pd.read_parquet(out)["text"].tolist() == texts  # the same rows every time
    wrong = run_script("public_data.py", *args[:-4], "--column", "text", "--out", out)
    assert wrong.returncode != 0 and "no column 'text'; it has ['sentence', 'label']" in wrong.stderr
    assert "no split 'test'" in run_script("public_data.py", *args[:4], "test", *args[5:]).stderr
    settings = yaml.safe_load(out.with_suffix(".yaml").read_text())
    assert settings == {"evaluate": {"ood": {"source": str(out.resolve())}}}  # any working directory finds it


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (["--rows", "-5"], "--rows -5: keep at least one row"),
        (["--column", "label"], "column 'label' holds Value('int64'), not text"),
        (["--out", "ood.csv"], "must end in .parquet"),
        (["--from-dir", "nowhere"], "not a folder of splits written by save_to_disk"),
    ],
)
def test_texts_refuses_what_would_make_a_wrong_ood_set(tmp_path, change, message):
    folder = tmp_path / "sst2"
    rows = {"sentence": ["a", "", "b"], "label": [0, 1, 0]}
    datasets.DatasetDict({"validation": datasets.Dataset.from_dict(rows)}).save_to_disk(str(folder))
    args = {"--from-dir": folder, "--column": "sentence", "--out": tmp_path / "ood.parquet"}
    args.update(dict(zip(change[::2], change[1::2], strict=True)))
    result = run_script("public_data.py", "texts", *[x for pair in args.items() for x in pair])
    assert result.returncode != 0 and message in result.stderr
    assert not (tmp_path / "ood.parquet").exists()


def test_a_task_refuses_another_tasks_source():
    result = run_script("public_data.py", "20newsgroups", "--acl-dir", ".", "--out", "x")
    assert result.returncode != 0
    assert "20newsgroups comes from --bydate-dir or --sklearn, not --acl-dir" in result.stderr
