"""The report's out-of-distribution (OOD) and selective-prediction views on hand-made evaluations: ``ood.json`` files
kept out of the summary, the OOD table (mean ± std over seeds per score), its figures and HTML sections, the AURC
column, and nothing of it all for evaluations without these fields."""

from __future__ import annotations

import base64
import math
import re

import numpy as np
import pandas as pd
import pytest

from kdpipe.core.store import KdpipeError, read_json, write_json
from kdpipe.evaluation.metrics import reliability_bins
from kdpipe.report import OOD_OUTPUTS, TSV_COLUMNS, build_report
from kdpipe.report.ood import curve_score, epistemic_score

CLASSES = ["business", "politics", "sport", "tech"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
BASE_SCORES = ("max_prob", "entropy")
MEMBER_SCORES = ("expected_entropy", "mutual_info")
MC_SCORES = tuple(f"mc_{s}" for s in (*BASE_SCORES, *MEMBER_SCORES))
ORACLE_REASON = "the oracle picks each row's teacher by its gold label, which OOD rows do not have"
# (model, base, kind, method, seed, scores it has, its AUROC of max_prob and of its other scores, test AURC)
MODELS = (
    ("ens", "ens", "ensemble", None, None, (*BASE_SCORES, *MEMBER_SCORES), 0.70, 0.75, 0.020),
    ("hp4.seed0", "hp4", "student", "hydra_plus", 0, (*BASE_SCORES, *MEMBER_SCORES, *MC_SCORES), 0.80, 0.90, 0.010),
    ("hp4.seed1", "hp4", "student", "hydra_plus", 1, (*BASE_SCORES, *MEMBER_SCORES, *MC_SCORES), 0.84, 0.86, 0.014),
    ("kd.seed0", "kd", "student", "vanilla_kd", 0, (*BASE_SCORES, *MC_SCORES), 0.60, 0.65, 0.030),
    ("sup", "sup", "student", "supervised", 0, BASE_SCORES, 0.55, 0.58, 0.040),
)


def _roc(auroc: float) -> dict:
    """A ROC curve with area ``auroc``: tpr = fpr^a has area 1 / (1 + a)."""
    fpr = np.linspace(0, 1, 50)
    return {"fpr": fpr.round(6).tolist(), "tpr": (fpr ** (1 / auroc - 1)).round(6).tolist()}


def _detection(auroc: float) -> dict:
    return {"auroc": auroc, "aupr": auroc - 0.2, "fpr95": 1.2 - auroc, "roc": _roc(auroc)}


def _labelled(model, base, kind, method, seed, split, aurc=None, members=1) -> dict:
    """An evaluation of a labelled split (no predictions needed: no per-class metrics, so no confusion matrix)."""
    rng = np.random.default_rng(len(model))
    labels = rng.integers(0, len(CLASSES), size=200)
    logits = rng.normal(size=(200, len(CLASSES)))
    logits[np.arange(200), labels] += 3.0
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    metrics = {"n": 200, "accuracy": 0.9, "macro_f1": 0.89, "nll": 0.3, "ece": 0.04, "brier": 0.1,
               "reliability": reliability_bins(probs, labels)}  # fmt: skip
    if aurc is not None:
        coverage = np.linspace(0.005, 1, 200)
        metrics["selective"] = {
            "aurc": {"max_prob": aurc, "entropy": aurc + 0.001},
            "curve": {"score": "max_prob", "coverage": coverage.tolist(), "risk": (3 * aurc * coverage**2).tolist()},
        }
    return {
        "model": model, "base": base, "kind": kind, "method": method, "seed": seed, "split": split,
        "params": 1_000_000, "train_time_s": 10.0, "classes": CLASSES, "members": members,
        "gold_labels": {"validation": 149}, "metrics": metrics,
    }  # fmt: skip


def _ood(model, base, kind, method, seed, scores, max_prob, others) -> dict:
    ood = {
        "source": "classes", "classes": ["entertainment"], "file": None, "in_split": "test", "n_in": 340,
        "n_ood": 77, "accuracy_in": 0.9 + 0.01 * (seed or 0),
        "scores": {s: _detection(max_prob if s == "max_prob" else others) for s in scores},
    }  # fmt: skip
    return {"model": model, "base": base, "group": base, "kind": kind, "method": method, "seed": seed,
            "split": "ood", "members": 4, "classes": CLASSES, "ood": ood}  # fmt: skip


def _oracle(split: str, selective: bool = True) -> dict:
    if split != "ood":
        return _labelled("oracle", "oracle", "oracle", None, None, split, aurc=0.001 if selective else None)
    ood = {"source": "classes", "classes": ["entertainment"], "in_split": "test", "scores": None,
           "reason": ORACLE_REASON}  # fmt: skip
    return {"model": "oracle", "base": "oracle", "kind": "oracle", "method": None, "seed": None, "split": "ood",
            "classes": CLASSES, "ood": ood}  # fmt: skip


def _write(root, records: list[dict]) -> list:
    paths = []
    for record in records:
        path = root / "eval" / record["model"] / f"{record['split']}.json"
        write_json(path, record)
        paths.append(path)
    return paths


def _records(selective: bool = True, ood: bool = True) -> list[dict]:
    """Every model on validation and test (with selective metrics), then on the OOD rows, the oracle in between."""
    records = []
    for model, base, kind, method, seed, scores, max_prob, others, aurc in MODELS:
        for split in ("validation", "test"):
            records.append(_labelled(model, base, kind, method, seed, split, aurc if selective else None))
        if ood:
            records.append(_ood(model, base, kind, method, seed, scores, max_prob, others))
        if model == "ens":
            records += [_oracle(s, selective) for s in ("validation", "test", *(["ood"] if ood else []))]
    return records


@pytest.fixture(scope="module")
def ood_report(tmp_path_factory):
    """The report on every model with OOD evaluations, built once: the plots take seconds."""
    root = tmp_path_factory.mktemp("ood")
    build_report(_write(root, _records()), root / "report", title="OOD toy")
    return root / "report"


def test_ood_table_has_each_score_mean_and_std_over_seeds(ood_report):
    table = pd.read_csv(ood_report / "ood.tsv", sep="\t").set_index("model")
    assert list(table.index) == ["ens", "oracle", "hp4", "kd", "sup"]  # ensemble, oracle, then students
    hp4 = table.loc["hp4"]
    assert hp4["seeds"] == 2 and hp4["n_in"] == 340 and hp4["n_ood"] == 77
    # max_prob AUROC 0.80 and 0.84: mean 0.82, std sqrt(2 * 0.02² / 1) = 0.0282843; mutual_info 0.90, 0.86.
    assert hp4["max_prob_auroc"] == pytest.approx(0.82)
    assert hp4["max_prob_auroc_std"] == pytest.approx(math.sqrt(0.0008), rel=1e-5)
    assert hp4["mutual_info_auroc"] == pytest.approx(0.88)
    assert hp4["mutual_info_fpr95"] == pytest.approx(1.2 - 0.88)
    assert hp4["accuracy_in"] == pytest.approx(0.905) and hp4["accuracy_in_std"] == pytest.approx(0.00707107)
    assert hp4["ood_rows"] == "held-out class entertainment" and hp4["in_split"] == "test"
    # kd has MC-dropout scores but no members' mutual information; sup has neither: blank cells.
    assert pd.isna(table.loc["kd", "mutual_info_auroc"]) and table.loc["kd", "mc_mutual_info_auroc"] == 0.65
    assert pd.isna(table.loc["sup", "mc_max_prob_auroc"])
    assert pd.isna(table.loc["sup", "max_prob_auroc_std"])  # one seed: no std
    # the oracle: its reason, no score
    assert table.loc["oracle", "reason"] == ORACLE_REASON
    assert table.loc["oracle", [c for c in table.columns if c.endswith("_auroc")]].isna().all()
    assert table["reason"].drop("oracle").isna().all()
    # every score of any model, in a fixed order
    scores = [c.removesuffix("_auroc") for c in table.columns if c.endswith("_auroc")]
    assert scores == ["max_prob", "entropy", "expected_entropy", "mutual_info", *MC_SCORES]


def test_ood_records_stay_out_of_the_summary(ood_report):
    summary = pd.read_csv(ood_report / "summary.tsv", sep="\t")
    assert set(summary["split"]) == {"test", "validation"}
    assert list(summary["model"][summary["split"] == "test"]) == ["ens", "oracle", "hp4", "kd", "sup"]
    markdown = (ood_report / "summary.md").read_text()
    assert "## ood split" not in markdown and "ood split" not in (ood_report / "summary.html").read_text()


def test_summary_gets_an_aurc_column(ood_report):
    summary = pd.read_csv(ood_report / "summary.tsv", sep="\t")
    assert list(summary.columns) == [*TSV_COLUMNS, "aurc", "aurc_std"]
    hp4 = summary[(summary["split"] == "test") & (summary["model"] == "hp4")].iloc[0]
    # 0.010 and 0.014: mean 0.012, std 0.0028284
    assert hp4["aurc"] == pytest.approx(0.012) and hp4["aurc_std"] == pytest.approx(math.sqrt(8e-6), rel=1e-5)
    markdown = (ood_report / "summary.md").read_text()
    assert "| Brier | AURC | train time |" in markdown
    hp4_row = next(line for line in markdown.splitlines() if line.startswith("| hp4 |"))
    assert "| 0.0120 ± 0.0028 |" in hp4_row
    page = (ood_report / "summary.html").read_text()
    # the lowest AURC among the comparable models is bold: hp4 (0.012), not the oracle's 0.001
    test_section = page[page.index("<h2>test split</h2>") : page.index("<h2>validation split</h2>")]
    hp4_html = re.search(r"<tr><td[^>]*>hp4</td>.*?</tr>", test_section).group(0)
    assert '<td class="best" data-sort="0.012">0.0120 ± 0.0028</td>' in hp4_html
    oracle = re.search(r"<tr><td[^>]*>oracle</td>.*?</tr>", test_section).group(0)
    assert "best" not in oracle


def test_ood_markdown(ood_report):
    text = (ood_report / "ood.md").read_text()
    assert "OOD rows: held-out class entertainment. In-distribution rows: the test split." in text
    header = next(line for line in text.splitlines() if line.startswith("| model |"))
    assert header.startswith("| model | kind | method | seeds | classes | rows in / OOD | accuracy in (%) | "
                              "max_prob AUROC | max_prob AUPR | max_prob FPR@95 | entropy AUROC |")  # fmt: skip
    hp4 = next(line for line in text.splitlines() if line.startswith("| hp4 |"))
    assert hp4.startswith("| hp4 | student | hydra_plus | 2 | 4/4 | 340 / 77 | 90.5 ± 0.7 | 0.820 ± 0.028 | "
                          "0.620 ± 0.028 | 0.380 ± 0.028 |")  # fmt: skip
    sup = next(line for line in text.splitlines() if line.startswith("| sup |"))
    assert sup.endswith("| — | — | — |") and "0.550 |" in sup
    assert not any(line.startswith("| oracle |") for line in text.splitlines())
    assert f"No OOD scores:\n\n- oracle: {ORACLE_REASON}" in text


def test_held_out_class_names_and_the_ood_file_are_text_in_ood_md():
    """The held-out classes and the OOD file's path are names from the config: no HTML or Markdown of theirs reaches
    ood.md (escaped as summary.md escapes them, kdpipe.report.markdown.plain)."""
    from kdpipe.report.markdown import plain
    from kdpipe.report.ood import describe_ood_rows, ood_markdown, ood_table

    odd = ["<img src=x onerror=alert(1)>", "**bold** [l](http://x)"]
    for ood in ({"source": "classes", "classes": odd}, {"source": "file", "file": "data/</script><b>ood</b>_x_.csv"}):
        record = _ood("kd.seed0", "kd", "student", "vanilla_kd", 0, BASE_SCORES, 0.6, 0.65)
        record["ood"] |= ood
        reason = {**_oracle("ood"), "ood": {**_oracle("ood")["ood"], **ood}}
        text = ood_markdown(ood_table([{**record, "source": "a.json"}, {**reason, "source": "b.json"}]))
        assert "<img" not in text and "</script>" not in text and "<b>" not in text and "**bold**" not in text
        assert f"OOD rows: {plain(describe_ood_rows(ood))}. In-distribution rows: the test split." in text
    assert "&lt;/script&gt;&lt;b&gt;ood&lt;/b&gt;\\_x\\_.csv" in text


def test_summary_html_has_the_ood_section(ood_report):
    page = (ood_report / "summary.html").read_text()
    section = page[page.index("<h2>Out-of-distribution detection</h2>") :]
    assert '<th class="group" colspan="3">mutual_info</th>' in section
    assert section.count('<th class="group" colspan="3">') == 8  # every score
    # the best mutual_info AUROC among the comparable models, hp4's 0.88, is bold; FPR@95 lowest is bold too
    hp4 = re.search(r"<tr><td[^>]*>hp4</td>.*?</tr>", section).group(0)
    assert '<td class="best" data-sort="0.88">0.880 ± 0.028</td>' in hp4
    assert '<td class="best" data-sort="0.32">0.320 ± 0.028</td>' in hp4
    assert f"No OOD scores: oracle: {ORACLE_REASON}" in section.replace("&#x27;", "'")


def test_landing_shows_the_compact_ood_table_and_figures(ood_report):
    fragment = (ood_report / "landing.html").read_text()
    ood = fragment[fragment.index("<h3>Out-of-distribution detection</h3>") :]
    assert fragment.index("<table>") < fragment.index("<h3>Out-of-distribution detection</h3>")
    # model, kind, seeds, max_prob AUROC and FPR@95, the epistemic score's name, its AUROC and FPR@95 (means)
    rows = {m: re.search(rf"<tr><td[^>]*>{m}</td>.*?</tr>", ood).group(0) for m in ("hp4", "kd", "sup")}
    assert re.findall(r">([^<]*)</td>", rows["hp4"]) == ["hp4", "student", "2", "0.820", "0.380", "mutual_info",
                                                         "0.880", "0.320"]  # fmt: skip
    assert re.findall(r">([^<]*)</td>", rows["kd"])[5:] == ["mc_mutual_info", "0.650", "0.550"]
    assert re.findall(r">([^<]*)</td>", rows["sup"])[5:] == ["—", "—", "—"]
    assert ">oracle</td>" not in ood[: ood.index("No OOD scores: oracle:")]  # below the table, with its reason
    embedded = re.findall(r'<img src="data:image/png;base64,([^"]+)" alt="(\w+)"', fragment)
    assert [alt for _, alt in embedded] == ["metrics", "cost", "ood_roc", "risk_coverage"]
    assert base64.b64decode(embedded[2][0]) == (ood_report / "ood_roc.png").read_bytes()


def test_ood_figures_are_written(ood_report):
    for name in ("ood_roc.png", "risk_coverage.png"):
        path = ood_report / name
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        assert path.stat().st_size > 20_000, name  # a drawn figure, not a placeholder


def test_roc_and_landing_pick_the_epistemic_score():
    both = {"mutual_info_auroc": 0.7, "mc_mutual_info_auroc": 0.9, "roc": {"mutual_info": {}, "entropy": {}}}
    assert epistemic_score(both) == "mutual_info"  # the model's own members first, even when MC dropout does better
    assert epistemic_score({"mutual_info_auroc": np.nan, "mc_mutual_info_auroc": 0.9}) == "mc_mutual_info"
    single = {"max_prob_auroc": 0.6, "entropy_auroc": 0.6, "roc": {"max_prob": {}, "entropy": {}}}
    assert epistemic_score(single) is None and curve_score(single) == "entropy"
    assert curve_score({"roc": {}}) is None


def test_without_ood_nothing_of_it_is_written(tmp_path):
    """Evaluations without OOD files or selective metrics: no OOD output (stale ones removed), no OOD section, no
    AURC column."""
    out = tmp_path / "report"
    out.mkdir()
    for name in OOD_OUTPUTS:
        (out / name).write_bytes(b"stale")
    build_report(_write(tmp_path, _records(selective=False, ood=False)), out)
    assert not [name for name in OOD_OUTPUTS if (out / name).exists()]
    assert "Out-of-distribution" not in (out / "summary.html").read_text()
    landing = (out / "landing.html").read_text()
    assert "Out-of-distribution" not in landing
    assert re.findall(r'alt="(\w+)"', landing) == ["metrics", "cost"]
    assert list(pd.read_csv(out / "summary.tsv", sep="\t").columns) == list(TSV_COLUMNS)
    assert "AURC" not in (out / "summary.md").read_text()


def test_selective_metrics_without_ood_give_the_aurc_column_only(tmp_path):
    build_report(_write(tmp_path, _records(selective=True, ood=False)), tmp_path / "report")
    assert "| AURC |" in (tmp_path / "report/summary.md").read_text()
    assert not [name for name in OOD_OUTPUTS if (tmp_path / "report" / name).exists()]


def test_only_the_oracle_has_ood_rows(tmp_path):
    """An OOD table without any score: the oracle's reason in ood.md, placeholders for the figures."""
    records = [_labelled(m, m, kind, None, 0, "test") for m, kind in (("sup", "student"), ("oracle", "oracle"))]
    records.append(_oracle("ood"))
    build_report(_write(tmp_path, records), tmp_path / "report")
    text = (tmp_path / "report/ood.md").read_text()
    assert "| model |" not in text and f"- oracle: {ORACLE_REASON}" in text
    for name in ("ood_roc.png", "risk_coverage.png"):
        path = tmp_path / "report" / name
        assert path.read_bytes()[:8] == PNG_SIGNATURE and path.stat().st_size < 20_000, name
    table = pd.read_csv(tmp_path / "report/ood.tsv", sep="\t")
    assert list(table["model"]) == ["oracle"] and table["reason"][0] == ORACLE_REASON


def test_missing_ood_field_names_the_file(tmp_path):
    paths = _write(tmp_path, _records())
    broken = next(p for p in paths if p.name == "ood.json" and p.parent.name == "kd.seed0")
    record = read_json(broken)
    del record["ood"]["n_in"]
    del record["ood"]["scores"]["entropy"]["roc"]["tpr"]
    write_json(broken, record)
    with pytest.raises(KdpipeError, match=rf"{re.escape(str(broken))}.*ood\.n_in, ood\.scores\.entropy\.roc\.tpr"):
        build_report(paths, tmp_path / "report")


def test_an_ood_evaluation_without_labelled_ones_is_an_error(tmp_path):
    with pytest.raises(KdpipeError, match="only OOD evaluations"):
        build_report(_write(tmp_path, [_oracle("ood")]), tmp_path / "report")


def test_same_model_twice_on_ood_is_an_error(tmp_path):
    paths = _write(tmp_path, _records())
    ood = next(p for p in paths if p.name == "ood.json")
    with pytest.raises(KdpipeError, match="'ens' on split 'ood' is given more than once"):
        build_report([*paths, ood], tmp_path / "report")


def test_seeds_of_one_base_must_agree_on_their_kind(tmp_path):
    records = _records()
    hp4 = next(r for r in records if r["model"] == "hp4.seed1" and r["split"] == "ood")
    hp4["method"] = "vanilla_kd"
    with pytest.raises(KdpipeError, match="share the base name 'hp4' but differ in 'method'"):
        build_report(_write(tmp_path, records), tmp_path / "report")


def test_single_models_have_no_epistemic_score(tmp_path):
    """Models of one member without MC-dropout samples: the landing table says — for the epistemic score, and the
    ROC curve falls back on the entropy."""
    records = [_labelled("sup", "sup", "student", "supervised", 0, "test", aurc=0.04)]
    records.append(_ood("sup", "sup", "student", "supervised", 0, BASE_SCORES, 0.55, 0.58))
    build_report(_write(tmp_path, records), tmp_path / "report")
    fragment = (tmp_path / "report/landing.html").read_text()
    ood = fragment[fragment.index("<h3>Out-of-distribution detection</h3>") :]
    row = re.search(r"<tr><td[^>]*>sup</td>.*?</tr>", ood).group(0)
    assert re.findall(r">([^<]*)</td>", row) == ["sup", "student", "1", "0.550", "0.650", "—", "—", "—"]
    assert '<td class="best" data-sort="0.55">0.550</td>' in row  # the only model: the best max_prob AUROC
    assert (tmp_path / "report/ood_roc.png").stat().st_size > 20_000
