"""kdpipe.report on synthetic evaluation files: table rows, seed mean/std, Markdown, and that the plots render."""

from __future__ import annotations

import ast
import math
import re
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kdpipe.core.store import KdpipeError, make_manifest, read_json, write_json
from kdpipe.evaluation.metrics import reliability_bins, total_variation
from kdpipe.report import TSV_COLUMNS, build_report, write_report
from kdpipe.report.plots import _lower_limit
from kdpipe.report.routing import read_routes
from kdpipe.report.settings import ReportSettings
from kdpipe.report.summary import _pool_reliability, describe_label_use

CLASSES = ["business", "entertainment", "politics", "sport", "tech"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# Student "vkd", three seeds, test split: (accuracy, ece, train_time_s).
VKD_TEST = {1: (0.90, 0.05, 100.0), 2: (0.92, 0.03, 110.0), 3: (0.97, 0.04, 120.0)}


def _metrics(accuracy: float, ece: float, n_classes: int, seed: int) -> dict:
    """Metrics with chosen scalars and real reliability bins from synthetic, fairly confident predictions."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, n_classes, size=400)
    logits = rng.normal(size=(400, n_classes))
    logits[np.arange(400), labels] += 3.0
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return {
        "n": 400, "accuracy": accuracy, "macro_f1": accuracy - 0.01, "nll": 1 - accuracy, "ece": ece,
        "brier": (1 - accuracy) / 2, "reliability": reliability_bins(probs, labels),
    }  # fmt: skip


def _eval(model, base, kind, method, seed, split, classes, accuracy, ece, train_time_s, params):
    gold = {"train": 600, "validation": 80} if kind == "teacher" else {"validation": 200}
    return {
        "model": model, "base": base, "kind": kind, "method": method, "seed": seed, "split": split,
        "params": params, "train_time_s": train_time_s, "classes": classes, "gold_labels": gold,
        "metrics": _metrics(accuracy, ece, len(classes), seed=zlib.crc32(f"{model}/{split}".encode())),
    }  # fmt: skip


@pytest.fixture
def eval_paths(tmp_path):
    """Student evaluations first and validation before test, so the report has to reorder them."""
    records = []
    for split, shift in (("validation", 0.01), ("test", 0.0)):
        for seed, (accuracy, ece, seconds) in VKD_TEST.items():
            records.append(
                _eval(
                    f"vkd.seed{seed}",
                    "vkd",
                    "student",
                    "vanilla_kd",
                    seed,
                    split,
                    CLASSES,
                    accuracy + shift,
                    ece,
                    seconds,
                    11_200_000,
                )  # fmt: skip
            )
        records.append(_eval("bert-a", "bert-a", "teacher", None, None, split, CLASSES[:2], 0.98, 0.02, 900.0,
                             22_700_000))  # fmt: skip
        records.append(_eval("bert-b", "bert-b", "teacher", None, 7, split, CLASSES[2:], 0.96, 0.03, 950.0,
                             22_700_000))  # fmt: skip
    return _write_evals(tmp_path, records)


def test_summary_table(eval_paths, tmp_path):
    out = tmp_path / "report"
    build_report(eval_paths, out)
    table = pd.read_csv(out / "summary.tsv", sep="\t")

    assert list(table.columns) == list(TSV_COLUMNS)
    assert list(zip(table["split"], table["model"])) == [
        ("test", "bert-a"), ("test", "bert-b"), ("test", "vkd"),
        ("validation", "bert-a"), ("validation", "bert-b"), ("validation", "vkd"),
    ]  # fmt: skip
    assert list(table["kind"][:3]) == ["teacher", "teacher", "student"]
    assert list(table["classes"][:3]) == ["2/5", "3/5", "5/5"]
    assert list(table["seeds"][:3]) == [1, 1, 3]
    assert table["method"][:2].isna().all() and table["method"][2] == "vanilla_kd"
    assert table["params"][0] == 22_700_000

    vkd = table.iloc[2]
    # accuracy 0.90, 0.92, 0.97: mean 0.93; deviations -0.03, -0.01, 0.04 -> std sqrt(0.0026 / 2) = 0.036056.
    assert vkd["accuracy"] == pytest.approx(0.93, abs=1e-6)
    assert vkd["accuracy_std"] == pytest.approx(math.sqrt(0.0013), abs=1e-6)
    # ece 0.05, 0.03, 0.04: mean 0.04, std 0.01. Train time 100, 110, 120 s: mean 110, std 10.
    assert vkd["ece"] == pytest.approx(0.04, abs=1e-6)
    assert vkd["ece_std"] == pytest.approx(0.01, abs=1e-6)
    assert vkd["train_time_s"] == pytest.approx(110.0)
    assert vkd["train_time_s_std"] == pytest.approx(10.0)
    assert table.iloc[5]["accuracy"] == pytest.approx(0.94, abs=1e-6)
    # One seed: no std at all, rather than a misleading 0.
    assert table["accuracy_std"][:2].isna().all()


def test_summary_markdown(eval_paths, tmp_path):
    build_report(eval_paths, tmp_path / "report")
    markdown = (tmp_path / "report" / "summary.md").read_text()

    assert markdown.index("## test split") < markdown.index("## validation split")
    assert "±" in markdown
    vkd_row = next(line for line in markdown.splitlines() if line.startswith("| vkd |"))
    assert "93.0 ± 3.6" in vkd_row  # accuracy in %
    assert "0.040 ± 0.010" in vkd_row  # ECE
    assert "11.2M" in vkd_row
    assert "1.8 ± 0.2 min" in vkd_row  # 110 ± 10 s
    teacher_row = next(line for line in markdown.splitlines() if line.startswith("| bert-a |"))
    assert "| teacher | — | train 600 · validation 80 | 2/5 | 1 | 22.7M | 98.0 |" in teacher_row
    assert "±" not in teacher_row
    assert "| student | vanilla_kd | validation 200 |" in vkd_row


def test_the_gold_labels_a_model_read_are_said_in_words():
    assert describe_label_use({}) == "none"
    assert describe_label_use(None) == "not recorded"
    assert describe_label_use({"validation": 213, "train": 1489}) == "train 1,489 · validation 213"
    assert describe_label_use({"test": 425, "train": 9}) == "train 9 · test 425"
    assert describe_label_use({"checkpoint": "trained outside kdpipe"}) == "checkpoint: trained outside kdpipe"


def test_ensembles_and_the_oracle_combine_their_members_labels():
    from kdpipe.evaluation.results import combined_label_use

    seeds = [{"gold_labels": {"train": 100, "validation": 20}}] * 3
    assert combined_label_use(seeds) == {"train": 100, "validation": 20}  # one label set: the same rows
    subsets = [{"gold_labels": {"train": 40, "validation": 8}}, {"gold_labels": {"train": 60, "validation": 12}}]
    assert combined_label_use(subsets, disjoint=True) == {"train": 100, "validation": 20}
    assert combined_label_use([*subsets, {"model": "old"}], disjoint=True) is None  # a member that does not say


def test_plots_are_written(eval_paths, tmp_path):
    build_report(eval_paths, tmp_path / "report")
    for name in ("reliability.png", "metrics.png"):
        path = tmp_path / "report" / name
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        assert path.stat().st_size > 10_000
    assert not list((tmp_path / "report").glob(".*tmp*")), "temporary files left behind"


def test_pooled_reliability_is_count_weighted():
    seeds = pd.DataFrame(
        {
            "model": ["s.seed1", "s.seed2"],
            "reliability": [
                {"bin_edges": [0, 0.5, 1], "count": [0, 2], "confidence": [None, 0.8], "accuracy": [None, 1.0]},
                {"bin_edges": [0, 0.5, 1], "count": [1, 6], "confidence": [0.4, 0.6], "accuracy": [0.0, 0.5]},
            ],
        }
    )
    pooled = _pool_reliability(seeds)
    assert pooled["count"].tolist() == [1, 8]
    # Bin 2: (2 * 0.8 + 6 * 0.6) / 8 = 0.65 confidence, (2 * 1 + 6 * 0.5) / 8 = 0.625 accuracy.
    assert pooled["confidence"].tolist() == pytest.approx([0.4, 0.65])
    assert pooled["accuracy"].tolist() == pytest.approx([0.0, 0.625])


def test_missing_field_names_the_file(eval_paths, tmp_path):
    broken = eval_paths[0]
    record = read_json(broken)
    del record["metrics"]["brier"]
    write_json(broken, record)
    with pytest.raises(KdpipeError, match=rf"{re.escape(str(broken))}.*metrics\.brier"):
        build_report(eval_paths, tmp_path / "report")
    assert not (tmp_path / "report" / "summary.tsv").exists()


def test_same_model_twice_is_an_error(eval_paths, tmp_path):
    with pytest.raises(KdpipeError, match="more than once"):
        build_report([*eval_paths, eval_paths[0]], tmp_path / "report")


def test_no_evaluations_is_an_error(tmp_path):
    with pytest.raises(KdpipeError, match="no evaluation"):
        build_report([], tmp_path / "report")


# ---- uncertainty split (Hydra+) --------------------------------------------------------------------------------

UNCERTAINTY_EDGES = np.linspace(0, math.log(len(CLASSES)), 4).tolist()  # 3 bins keep the TVs countable by hand
# Histograms (total, aleatoric, epistemic) and the means (entropy, aleatoric, epistemic) of each run.
ENSEMBLE_HIST = ([4, 4, 0], [8, 0, 0], [2, 2, 4])
HYDRA_HISTS = {1: ([8, 0, 0], [8, 0, 0], [2, 2, 4]), 2: ([4, 4, 0], [4, 4, 0], [0, 0, 8])}
KD_HIST = ([0, 4, 4], [4, 4, 0], [2, 2, 4])


def _with_uncertainty(record: dict, hists, means, members: int, **fields) -> dict:
    """``record`` with the optional Hydra+ fields: top-level members and others, and metrics.uncertainty."""
    parts = ("total", "aleatoric", "epistemic")
    record["metrics"]["uncertainty"] = {
        "members": members, **dict(zip(parts, means)), "bin_edges": UNCERTAINTY_EDGES,
        "hist": dict(zip(parts, hists)),
    }  # fmt: skip
    return {**record, "members": members, **fields}


def _write_evals(tmp_path, records: list[dict]) -> list:
    paths = []
    for record in records:
        path = tmp_path / "eval" / record["model"] / f"{record['split']}.json"
        write_json(path, record)
        paths.append(path)
    return paths


def _ensemble_records() -> list[dict]:
    """Students first (hydra with two seeds, kd with one), then the ensemble, then an old-style subset teacher."""
    records = [
        _with_uncertainty(
            _eval(
                f"hydra.seed{seed}", "hydra", "student", "hydra_plus", seed, "test", CLASSES, 0.9, 0.03, 50.0, 8_000_000
            ),
            hists,
            (0.9 + 0.2 * (seed - 1), 0.6, 0.3),
            members=5,
            inference_time_s=2.0 * seed,
        )  # fmt: skip
        for seed, hists in HYDRA_HISTS.items()
    ]
    records.append(
        _with_uncertainty(
            _eval("kd", "kd", "student", "vanilla_kd", 1, "test", CLASSES, 0.88, 0.05, 40.0, 4_000_000),
            KD_HIST,
            (0.7, 0.7, 0.0),
            members=1,
        )  # fmt: skip
    )
    records.append(
        _with_uncertainty(
            _eval("ens", "ens", "ensemble", None, None, "test", CLASSES, 0.93, 0.02, 500.0, 50_000_000),
            ENSEMBLE_HIST,
            (1.0, 0.6, 0.4),
            members=5,
            inference_time_s=10.0,
        )  # fmt: skip
    )
    records.append(_eval("bert-a", "bert-a", "teacher", None, None, "test", CLASSES[:2], 0.98, 0.02, 900.0,
                         22_700_000))  # fmt: skip
    return records


@pytest.fixture
def ensemble_paths(tmp_path):
    return _write_evals(tmp_path, _ensemble_records())


@pytest.fixture(scope="module")
def ensemble_report(tmp_path_factory):
    """The report on the ensemble evaluations, built once: the plots take seconds."""
    tmp_path = tmp_path_factory.mktemp("ensemble")
    build_report(_write_evals(tmp_path, _ensemble_records()), tmp_path / "report")
    return tmp_path / "report"


def test_total_variation_by_hand():
    """The distance the report's tv_* columns use (kdpipe.evaluation.metrics)."""
    assert total_variation([2, 0, 0], [1, 1, 0]) == pytest.approx(0.5)  # ½ (|1 - ½| + |0 - ½|)
    assert total_variation([4, 0, 0], [1, 1, 0]) == pytest.approx(0.5)  # counts are normalised first
    assert total_variation([1, 2, 3], [2, 4, 6]) == 0.0
    assert total_variation([1, 0], [0, 3]) == pytest.approx(1.0)


def test_uncertainty_columns(ensemble_report):
    table = pd.read_csv(ensemble_report / "summary.tsv", sep="\t").set_index("model")

    assert list(table.index) == ["bert-a", "ens", "hydra", "kd"]  # teacher, ensemble, student
    assert table.loc["ens", ["tv_total", "tv_aleatoric", "tv_epistemic"]].tolist() == [0, 0, 0]
    hydra = table.loc["hydra"]
    assert hydra["seeds"] == 2 and hydra["members"] == 5
    # Entropy 0.9, 1.1: mean 1.0, std 0.141421. Inference 2 s, 4 s: mean 3, std 1.414214.
    assert hydra["entropy"] == pytest.approx(1.0)
    assert hydra["entropy_std"] == pytest.approx(math.sqrt(0.02), rel=1e-5)
    assert hydra["aleatoric"] == pytest.approx(0.6) and hydra["epistemic"] == pytest.approx(0.3)
    assert hydra["inference_time_s"] == pytest.approx(3.0)
    assert hydra["inference_time_s_std"] == pytest.approx(math.sqrt(2), rel=1e-5)
    # Total vs the ensemble's [4, 4, 0]: seed 1 [8, 0, 0] -> 0.5, seed 2 identical -> 0; mean 0.25, std 0.353553.
    assert hydra["tv_total"] == pytest.approx(0.25)
    assert hydra["tv_total_std"] == pytest.approx(math.sqrt(0.125), rel=1e-5)
    # Aleatoric vs [8, 0, 0]: 0 and 0.5. Epistemic vs [2, 2, 4]: 0 and ½ (¼ + ¼ + ½) = 0.5.
    assert hydra["tv_aleatoric"] == pytest.approx(0.25)
    assert hydra["tv_epistemic"] == pytest.approx(0.25)
    kd = table.loc["kd"]
    assert [kd["tv_total"], kd["tv_aleatoric"], kd["tv_epistemic"]] == pytest.approx([0.5, 0.5, 0.0])
    assert kd["members"] == 1 and pd.isna(kd["tv_total_std"]) and pd.isna(kd["inference_time_s"])
    # The old-style subset teacher: every new cell blank.
    new_columns = [c for c in TSV_COLUMNS if c.startswith(("entropy", "aleatoric", "epistemic", "tv_", "inference"))]
    assert table.loc["bert-a", ["members", *new_columns]].isna().all()


def test_uncertainty_outputs(ensemble_report):
    markdown = (ensemble_report / "summary.md").read_text()
    assert "| entropy | aleatoric | epistemic | TV total | TV aleatoric | TV epistemic | inference time |" in markdown
    hydra_row = next(line for line in markdown.splitlines() if line.startswith("| hydra |"))
    assert hydra_row.endswith("| 5 | 1.000 ± 0.141 | 0.600 ± 0.000 | 0.300 ± 0.000 | 0.250 ± 0.354 "
                              "| 0.250 ± 0.354 | 0.250 ± 0.354 | 3.0 ± 1.4 s |")  # fmt: skip
    plot = ensemble_report / "uncertainty.png"
    assert plot.read_bytes()[:8] == PNG_SIGNATURE
    assert plot.stat().st_size > 10_000


def test_old_evaluations_get_no_uncertainty_output(eval_paths, tmp_path):
    stale = tmp_path / "report" / "uncertainty.png"
    stale.parent.mkdir()
    stale.write_bytes(PNG_SIGNATURE)  # left by an earlier report: it would contradict the new tables
    build_report(eval_paths, tmp_path / "report")
    assert not stale.exists()
    header = next(line for line in (tmp_path / "report" / "summary.md").read_text().splitlines() if "| model" in line)
    assert header.endswith("| Brier | train time |")
    table = pd.read_csv(tmp_path / "report" / "summary.tsv", sep="\t")
    assert table[["members", "entropy", "tv_total", "inference_time_s"]].isna().all().all()


def test_reference_picks_the_ensemble(ensemble_paths, tmp_path):
    second = read_json(ensemble_paths[3])  # "ens", histograms [4, 4, 0] ...; "ens-b" has kd's own histograms
    second.update(model="ens-b", base="ens-b")
    second["metrics"]["uncertainty"]["hist"] = dict(zip(("total", "aleatoric", "epistemic"), KD_HIST))
    paths = [*ensemble_paths, *_write_evals(tmp_path, [second])]
    with pytest.raises(KdpipeError, match="ens, ens-b.*'reference'"):
        build_report(paths, tmp_path / "report")

    for path in paths[:3]:  # the students
        write_json(path, {**read_json(path), "reference": "ens-b"})
    build_report(paths, tmp_path / "report")
    table = pd.read_csv(tmp_path / "report" / "summary.tsv", sep="\t").set_index("model")
    assert table.loc["kd", "tv_total"] == 0.0 and table.loc["ens-b", "tv_total"] == 0.0
    assert table.loc["ens", "tv_total"] == 0.0  # an ensemble is its own reference

    write_json(paths[2], {**read_json(paths[2]), "reference": "missing"})
    with pytest.raises(KdpipeError, match="names 'missing' as its reference"):
        build_report(paths, tmp_path / "report")


def test_missing_uncertainty_field_names_it(ensemble_paths, tmp_path):
    record = read_json(ensemble_paths[0])
    del record["metrics"]["uncertainty"]["hist"]["epistemic"]
    write_json(ensemble_paths[0], record)
    with pytest.raises(KdpipeError, match=r"metrics\.uncertainty\.hist\.epistemic"):
        build_report(ensemble_paths, tmp_path / "report")


def test_single_models_get_no_uncertainty_split(tmp_path):
    """Uncertainty fields from one-member models only: epistemic is exactly 0 and total equals aleatoric, so the
    summary shows no uncertainty columns and no uncertainty.png (the TSV keeps its columns for scripts)."""
    records = [r for r in _ensemble_records() if r["model"] in ("kd", "bert-a")]
    build_report(_write_evals(tmp_path, records), tmp_path / "r")
    assert "epistemic" not in (tmp_path / "r/summary.md").read_text()
    assert "epistemic" not in (tmp_path / "r/summary.html").read_text()
    assert not (tmp_path / "r/uncertainty.png").exists()
    assert "members" in pd.read_csv(tmp_path / "r/summary.tsv", sep="\t").columns


def test_html_in_a_class_name_is_text_in_summary_md(tmp_path):
    """A class, model or warning with HTML in it shows as written: no tag reaches summary.md or routing.md."""
    from kdpipe.report.markdown import summary_markdown
    from kdpipe.report.routing import routing_markdown, routing_table
    from kdpipe.report.summary import check_eval, runs_table, summarise

    classes = ["<img src=x onerror=alert(1)>", "</script><b>tech</b>", "R&D"]
    record = _eval("vkd", "vkd", "student", "vanilla_kd", 1, "test", classes, 0.9, 0.05, 10.0, 1_000_000)
    record["metrics"]["per_class_accuracy"] = dict(zip(classes, (0.5, 1.0, 0.75)))
    summary = summarise(runs_table([check_eval(read_json(path), path) for path in _write_evals(tmp_path, [record])]))
    warning = f"router knn sends 10% of {classes[0]}"
    markdown = summary_markdown(summary, warnings=[warning], title="<i>run</i>")
    route = {"route": "r", "router": "knn", "warning": warning, "diagnostics": {"knn": {"gold_labels": False}}}
    routing = routing_markdown([route], routing_table([route]))
    for text in (markdown, routing):
        assert "<img" not in text and "</script>" not in text and "<b>" not in text and "<i>" not in text
        assert "&lt;img src=x onerror=alert(1)&gt;" in text
    assert "&lt;/script&gt;&lt;b&gt;tech&lt;/b&gt;" in markdown and "R&amp;D" in markdown
    assert markdown.startswith("# &lt;i&gt;run&lt;/i&gt;\n")


MARKDOWN_NAMES = ["**bold** [l](http://x)", "_em_ ~~gone~~ `code`", "<img src=x onerror=alert(1)>", "R&amp;D \\ $x$"]


def rendered(markdown: str) -> str:
    """``markdown`` as a CommonMark viewer with GFM tables and strikethrough shows it (HTML)."""
    markdown_it = pytest.importorskip("markdown_it")
    return markdown_it.MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(markdown)


def shown(name: str) -> str:
    """``name`` as text in rendered HTML."""
    return name.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _named_markdown(tmp_path, names: list[str]) -> tuple[str, str]:
    """summary.md and routing.md with ``names`` as the classes, the title, a route, a router and in a warning."""
    from kdpipe.report.markdown import summary_markdown
    from kdpipe.report.routing import routing_markdown, routing_table
    from kdpipe.report.summary import check_eval, runs_table, summarise

    record = _eval("vkd", "vkd", "student", "vanilla_kd", 1, "test", names, 0.9, 0.05, 10.0, 1_000_000)
    record["metrics"]["per_class_accuracy"] = dict.fromkeys(names, 0.5)
    summary = summarise(runs_table([check_eval(read_json(path), path) for path in _write_evals(tmp_path, [record])]))
    warning = f"router knn sends 10% of {names[0]}"
    markdown = summary_markdown(summary, warnings=[warning], title=names[1])
    route = {"route": names[1], "router": names[2], "warning": warning, "diagnostics": {names[2]: {"gold_labels": 0}}}
    return markdown, routing_markdown([route], routing_table([route]))


def test_markdown_syntax_in_a_name_is_text_in_summary_md_and_routing_md(tmp_path):
    """A class, route, router or warning with Markdown syntax in it shows as written: no emphasis, link, code span,
    strikethrough or HTML beyond what the report writes itself (backslash escapes outside code spans, entities for
    <, > and &)."""
    markdown, routing = _named_markdown(tmp_path / "odd", MARKDOWN_NAMES)
    for text in (markdown, routing):
        assert "**bold**" not in text and "[l](" not in text and "`code`" not in text and "<img" not in text
    assert "\\*\\*bold\\*\\* \\[l\\](http://x)" in markdown
    plain_names = [f"name{i}" for i in range(len(MARKDOWN_NAMES))]
    for text, same in zip((markdown, routing), _named_markdown(tmp_path / "plain", plain_names)):
        page, expected = rendered(text), rendered(same)
        for tag in ("strong", "em", "a", "code", "s", "del", "img"):
            assert len(re.findall(rf"<{tag}\b", page)) == len(re.findall(rf"<{tag}\b", expected)), (tag, page)
        assert f"router knn sends 10% of {shown(MARKDOWN_NAMES[0])}" in page and shown(MARKDOWN_NAMES[1]) in page
    page = rendered(markdown)
    assert all(f">{shown(name)}</th>" in page for name in MARKDOWN_NAMES)
    assert f"<strong>{shown(MARKDOWN_NAMES[2])}</strong> (chosen)" in rendered(routing)


def test_percentage_axes_start_near_the_data():
    summary = pd.DataFrame({"accuracy": [0.86, 0.9], "accuracy_std": [0.02, None], "macro_f1": [0.85, 0.89]})
    summary["macro_f1_std"] = None
    assert _lower_limit(summary, (("accuracy", 0), ("macro_f1", 0)), 100) == 70.0
    summary["accuracy"] = [0.05, 0.9]
    assert _lower_limit(summary, (("accuracy", 0),), 100) == 0.0


def _cells(line: str) -> list[str]:
    """A Markdown table row's cells: split at the pipes that are not escaped."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]


def test_a_pipe_in_a_class_name_stays_inside_its_markdown_cell(tmp_path):
    from kdpipe.report.markdown import summary_markdown
    from kdpipe.report.routing import routing_markdown, routing_table
    from kdpipe.report.summary import check_eval, runs_table, summarise

    classes = ["sport|news", "tech", "a\\|b"]
    record = _eval("vkd.seed1", "vkd", "student", "vanilla_kd", 1, "test", classes, 0.9, 0.05, 10.0, 1_000_000)
    record["metrics"]["per_class_accuracy"] = {"sport|news": 0.5, "tech": 1.0, "a\\|b": 0.75}
    summary = summarise(runs_table([check_eval(read_json(path), path) for path in _write_evals(tmp_path, [record])]))
    markdown = summary_markdown(summary)
    header = next(line for line in markdown.splitlines() if line.startswith("| model | kind | sport"))
    assert _cells(header) == ["model", "kind", "sport\\|news", "tech", "a\\\\\\|b"]
    row = markdown.splitlines()[markdown.splitlines().index(header) + 2]
    assert _cells(row) == ["vkd", "student", "50.0", "100.0", "75.0"]
    for line in markdown.splitlines():
        if line.startswith("|"):
            assert len(_cells(line)) in (len(_cells(header)), 14), line

    route = {"route": "r", "router": "k|nn", "diagnostics": {"k|nn": {"gold_labels": False}}}
    text = routing_markdown([route], routing_table([route]))
    line = next(line for line in text.splitlines() if "chosen" in line and line.startswith("|"))
    assert _cells(line)[0] == "**k\\|nn** (chosen)" and len(_cells(line)) == 5


def _route_manifest(folder: Path, calibrated: bool = False) -> Path:
    """A route whose chosen router (MC certainty) sends 60% of the validation rows to their owner, knn 95%; with
    the warning an older route job stored, which the report must not show."""

    def entry(accuracy, per_class, gold=False):
        figures = {"accuracy": accuracy, "per_class": per_class}
        return {"gold_labels": gold, "validation": {"routing": figures, "target": figures}}

    diagnostics = {
        "certainty/entropy": entry(0.6, {"business": 0.9, "tech": 0.3}),
        "knn": entry(0.95, {"business": 0.95, "tech": 0.95}),
        "oracle": entry(1.0, {"business": 1.0, "tech": 1.0}, gold=True),
    }
    temps = {"a": {"temperature": 2.0}} if calibrated else None
    manifest = make_manifest(
        "route", router="certainty/entropy", labels=["business", "tech"], diagnostics=diagnostics, calibration=temps
    )
    write_json(folder / "route.json", {**manifest, "warning": "a warning stored by an older route job"})
    return folder / "route.json"


def test_the_routing_warning_is_computed_by_the_report_at_warn_below(eval_paths, tmp_path):
    """The report warns from the figures a route recorded and its own threshold (routing.warn_below, the report
    job's slice): a route's files hold no warning, so changing the threshold reruns the report only."""
    route = _route_manifest(tmp_path / "routes/a+b.certainty-entropy")
    (warned,) = read_routes([route], 0.8)
    assert warned["warning"].startswith("router certainty/entropy sends 60% of validation rows")
    assert warned["warning"].endswith("Router knn routes 95%: method_args: {router: knn} (docs/routing.md)")
    assert read_routes([route], 0.5)[0]["warning"] is None  # the stored one is not shown
    calibrated = _route_manifest(tmp_path / "routes/a+b.certainty-entropy-calibrated", calibrated=True)
    assert read_routes([calibrated])[0]["warning"].endswith("{router: knn, calibrate: true} (docs/routing.md)")

    write_report(ReportSettings.from_params({"warn_below": 0.8}), eval_paths, tmp_path / "warned", routes=[route])
    for name in ("summary.md", "routing.md", "summary.html", "landing.html"):
        assert "method_args: {router: knn}" in (tmp_path / "warned" / name).read_text(), name
    write_report(ReportSettings.from_params({"warn_below": 0.5}), eval_paths, tmp_path / "quiet", routes=[route])
    for name in ("summary.md", "routing.md", "summary.html", "landing.html"):
        text = (tmp_path / "quiet" / name).read_text()
        assert "router certainty/entropy sends" not in text and "older route job" not in text, name


def test_routing_md_shows_certainty_as_ood_detection_where_the_route_recorded_it(tmp_path):
    """routing.md has a "Certainty as OOD detection" table (teacher and split × score AUROC, — for null) under a
    route that recorded ood_auroc, and none under an older route without it, whose router table is unchanged."""
    from kdpipe.report.routing import routing_markdown, routing_table

    older = _route_manifest(tmp_path / "routes/a+b.knn")
    recorded = _route_manifest(tmp_path / "routes/a+b.certainty-entropy")
    manifest = read_json(recorded)

    def teacher(entropy):
        scores = dict.fromkeys(("entropy", "certainty", "max_prob", "variance", "mean_entropy", "mutual_info"))
        scores.update(entropy=entropy, certainty=entropy, logit_max_prob=0.625)
        return {"n_own": 30, "n_other": 20, "mc": entropy is not None, "auroc": scores}

    manifest["ood_auroc"] = {
        "train": {"a": teacher(0.5), "b": teacher(0.9)},
        "validation": {"a": teacher(None), "b": teacher(None)},
    }
    write_json(recorded, manifest)
    routes = read_routes([older, recorded])
    text = routing_markdown(routes, routing_table(routes))
    before, after = text.split("## a+b.certainty-entropy")
    assert "Certainty as OOD detection" not in before and "| **certainty/entropy** (chosen) |" in before
    assert after.count("### Certainty as OOD detection (AUROC)") == 1
    lines = [line for line in after.splitlines() if line.startswith("|")]
    header = lines.index(next(line for line in lines if line.startswith("| teacher |")))
    assert _cells(lines[header]) == [
        "teacher", "split", "own rows", "other rows", "+entropy", "−certainty", "−max_prob", "+variance",
        "+mean_entropy", "+mutual_info", "−logit_max_prob",
    ]  # fmt: skip
    rows = [_cells(line) for line in lines[header + 2 :]]
    assert rows[0] == ["a", "validation", "30", "20", *["—"] * 6, "0.625"]
    assert rows[1] == ["a", "train", "30", "20", "0.500", "0.500", "—", "—", "—", "—", "0.625"]
    assert rows[3][:5] == ["b", "train", "30", "20", "0.900"] and len(rows) == 4
    assert "0.5 means the score cannot tell own from other rows" in after


def _report_imports(path: Path, modules: set[str]) -> tuple[set[str], list[str]]:
    """The modules of kdpipe.report that ``path`` imports (``__init__`` for the package itself), and those it
    imports anywhere but at its top level."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    found, nested = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (node.module or "") if not node.level else f"kdpipe.report.{node.module or ''}".rstrip(".")
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            if parts[:2] != ["kdpipe", "report"]:
                continue
            name = "__init__" if len(parts) == 2 else parts[2]
            if name in modules:
                found.add(name)
                if id(node) not in top:
                    nested.append(name)
    return found - {path.stem}, nested


def test_the_report_package_has_no_import_cycle():
    """Imports between the modules of kdpipe.report (anywhere in a module, a function's included) form no cycle,
    every such import is at a module's top level, and figures.py, shared by every figure, imports none of them."""
    package = Path(__file__).resolve().parents[1] / "kdpipe/report"
    modules = {path.stem: path for path in package.glob("*.py")}
    graph, nested = {}, {}
    for name, path in modules.items():
        graph[name], nested[name] = _report_imports(path, set(modules))
    assert not {name: inside for name, inside in nested.items() if inside}, "imports inside a function"
    assert graph["figures"] == set()
    done, path = set(), []

    def visit(node):
        if node in path:
            raise AssertionError("import cycle: " + " -> ".join([*path[path.index(node) :], node]))
        if node in done:
            return
        path.append(node)
        for target in sorted(graph[node]):
            visit(target)
        path.pop()
        done.add(node)

    for name in sorted(graph):
        visit(name)
