"""The comparison as HTML: ``summary.html``, a page of its own (the tables of summary.md, sortable by a click on a
column), and ``landing.html``, the fragment that the landing page of ``snakemake --report`` includes
(workflow/report/workflow.rst) so that the report opens on the results rather than on the rule graph. Sorting is a
few lines of inline JavaScript written by hand, where a library would have to be embedded in every report.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

import numpy as np
import pandas as pd

from kdpipe.report.errors import per_class_rows
from kdpipe.report.markdown import (
    PER_CLASS_NOTE,
    SELECTIVE_NOTE,
    SUMMARY_NOTE,
    UNCERTAINTY_NOTE,
    format_interval,
    format_mean_std,
    summary_cells,
    table_columns,
    text,
)
from kdpipe.report.ood import (
    DETECTION,
    LOWER_IS_BETTER,
    MARKDOWN_HEAD,
    OOD_NOTE,
    epistemic_score,
    ood_cells,
    ood_notes,
    table_scores,
)
from kdpipe.report.summary import comparable

# Sort a table by the clicked column: numbers by their data-sort value, text alphabetically; a second click reverses.
SORT = (
    "(function(th){var t=th.closest('table'),b=t.tBodies[0],i=th.cellIndex,d=th.dataset.dir==='asc'?-1:1;"
    "th.dataset.dir=d>0?'asc':'desc';Array.from(b.rows).sort(function(x,y){"
    "var p=x.cells[i].dataset.sort,q=y.cells[i].dataset.sort;"
    "if(p!==undefined&&q!==undefined)return d*(parseFloat(p)-parseFloat(q));"
    "return d*x.cells[i].textContent.localeCompare(y.cells[i].textContent);})"
    ".forEach(function(r){b.appendChild(r);});})(this)"
)
STYLE = """
.kdpipe table { border-collapse: collapse; font-size: 13px; margin: 0.6em 0 1.2em; }
.kdpipe th, .kdpipe td { padding: 3px 9px; border-bottom: 1px solid #ddd; text-align: right; white-space: nowrap; }
.kdpipe th { cursor: pointer; background: #f3f4f6; }
.kdpipe th:hover { background: #e5e7eb; }
.kdpipe .left { text-align: left; }
.kdpipe .best { font-weight: bold; }
.kdpipe .warning { background: #fff4e5; border-left: 4px solid #e8a33d; padding: 6px 10px; margin: 0.6em 0; }
.kdpipe .note { color: #555; font-size: 12px; max-width: 60em; }
"""
# Only on pages with the OOD table, so that the pages of a run without OOD evaluations are as before.
OOD_STYLE = """
.kdpipe th.group { cursor: default; text-align: center; background: #fff; border-bottom: 2px solid #9ca3af; }
.kdpipe .wide { overflow-x: auto; }
"""
LEFT = {"model", "kind", "method", "gold labels read", "score"}
# The columns compared on the landing page, and the summary column each sorts by (higher is better: ↑).
LANDING = (
    ("model", None), ("kind", None), ("method", None), ("gold labels read", None), ("classes", None),
    ("seeds", "seeds"),
    ("accuracy (%) ↑", "accuracy"), ("95% interval", "accuracy_low"),
    ("macro-F1 (%) ↑", "macro_f1"), ("ECE ↓", "ece"), ("params", "params"), ("ms / example", "inference_ms"),
)  # fmt: skip
# Summary columns behind the cells of summary_cells, for sorting (None: sort as text).
SORT_KEYS = {
    "seeds": "seeds", "params": "params", "accuracy (%)": "accuracy", "95% interval": "accuracy_low",
    "macro-F1 (%)": "macro_f1", "NLL": "nll",
    "ECE": "ece", "Brier": "brier", "train time": "train_time_s", "inference time": "inference_time_s",
    "members": "members", "entropy": "entropy", "aleatoric": "aleatoric", "epistemic": "epistemic",
    "TV total": "tv_total", "TV aleatoric": "tv_aleatoric", "TV epistemic": "tv_epistemic", "AURC": "aurc",
}  # fmt: skip
# The OOD table's columns before the scores' (kdpipe.report.ood.MARKDOWN_HEAD) and the column each sorts by.
OOD_SORT_KEYS = {"seeds": "seeds", "rows in / OOD": "n_in", "accuracy in (%)": "accuracy_in"}
METRIC_HEADERS = {m: f"{name} {'↓' if m in LOWER_IS_BETTER else '↑'}" for m, name in DETECTION.items()}
# The landing page's OOD metric columns, (column group, metric): the epistemic group has the score's name first.
LANDING_OOD = (("max_prob", "auroc"), ("max_prob", "fpr95"), ("epistemic", "auroc"), ("epistemic", "fpr95"))


def summary_html(summary: pd.DataFrame, warnings: list[str], title: str, ood: pd.DataFrame | None = None) -> str:
    """A self-contained page: the routing warnings, per split the comparison table and the accuracy per class, then
    the OOD table (``ood``: :func:`kdpipe.report.ood.ood_table`) when there is one."""
    header, uncertainty, inference, selective = table_columns(summary)
    parts = [f"<h1>{html.escape(title)}</h1>", *_warnings(warnings), _note(SUMMARY_NOTE)]
    if selective:
        parts.append(_note(SELECTIVE_NOTE))
    if uncertainty:
        parts.append(_note(UNCERTAINTY_NOTE))
    for split, table in summary.groupby("split", sort=False):
        rows = [
            (
                summary_cells(row, uncertainty, inference, selective),
                [_value(row._asdict(), SORT_KEYS.get(name)) for name in header],
            )
            for row in table.itertuples(index=False)
        ]
        parts += [f"<h2>{html.escape(split)} split</h2>", _table(header, rows, _best_summary(table, header))]
        classes, per_class = per_class_rows(table)
        if per_class:
            parts += [f"<h3>Accuracy (%) per class, {html.escape(split)} split</h3>", _note(PER_CLASS_NOTE)]
            parts.append(_table(("model", "kind", *classes), [(cells, [None] * len(cells)) for cells in per_class]))
    if ood is not None:
        parts += _ood_section(ood)
    body = "\n".join(parts)
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>body {{ font-family: sans-serif; margin: 1.5em; }}{STYLE}{'' if ood is None else OOD_STYLE}</style>"
        "</head>\n"
        f'<body><div class="kdpipe">\n{body}\n</div></body></html>\n'
    )


def landing_html(
    summary: pd.DataFrame, warnings: list[str], title: str, plots: list[Path] = (), ood: pd.DataFrame | None = None
) -> str:
    """The fragment at the top of the report's landing page: the title, the routing warnings, the compact
    comparison of the first split, the compact OOD table when there is one and the key ``plots`` (PNG, embedded)."""
    split = summary["split"].iloc[0]
    table = summary[summary["split"] == split]
    header = tuple(name for name, _ in LANDING)
    rows = [
        (_landing_cells(row), [_value(row._asdict(), key) for _, key in LANDING])
        for row in table.itertuples(index=False)
    ]
    # The viewer narrows its description column for prose; the table needs the room. It also centres the landing
    # view vertically in the window, which cuts off the top (title and table) of a view taller than the window and
    # leaves a blank band above a shorter one (and cuts off the left of a wider one): the view starts at the top
    # left while this fragment is shown.
    style = (
        "<style>.prose.max-w-lg { max-width: 64rem; } "
        ".grow.flex.items-center.justify-center.h-screen { align-items: flex-start; justify-content: flex-start; }"
        f"{STYLE}{'' if ood is None else OOD_STYLE}</style>"
    )
    return "\n".join(
        [
            style,
            '<div class="kdpipe">',
            f"<h2>{html.escape(title)}</h2>",
            *_warnings(warnings),
            f"<p>Models on the <b>{html.escape(split)}</b> split: mean over seeds; click a column to sort. "
            f"{_landing_caveats(table)}Full tables (± std over seeds, per class), curves, confusion matrices, cost "
            "and calibration: category <i>Summary</i> in the menu.</p>",
            _table(header, rows, _best_summary(table, header)),
            *(_landing_ood(ood) if ood is not None else ()),
            *(_figure(path) for path in plots),
            "</div>",
        ]
    )


def _landing_caveats(table: pd.DataFrame) -> str:
    """The landing sentences on the rows that :func:`comparable` leaves out, for those this run has."""
    subset = table.loc[table["n_classes"] < table["n_classes"].max(), "classes"]
    parts = []
    if len(subset):
        parts.append(
            f"A teacher of some of the classes (<i>classes</i> {html.escape(str(subset.iloc[0]))}) is scored on its "
            "own classes' rows only. "
        )
    if (table["kind"] == "oracle").any():
        parts.append("The teachers' oracle reads gold labels. ")
    return "".join(parts)


def _ood_section(ood: pd.DataFrame) -> list[str]:
    """summary.html's OOD section: the notes, the table with a column group per score, the models without scores."""
    sentence, unscored = ood_notes(ood)
    scores = table_scores(ood)
    scored = ood[ood["reason"].isna()].reset_index(drop=True)
    keys = [OOD_SORT_KEYS.get(name) for name in MARKDOWN_HEAD] + [f"{s}_{m}" for s in scores for m in DETECTION]
    header = (*MARKDOWN_HEAD, *(METRIC_HEADERS[m] for _ in scores for m in DETECTION))
    rows = [(ood_cells(row, scores), [_value(row, key) for key in keys]) for row in scored.to_dict("records")]
    groups = [("", len(MARKDOWN_HEAD)), *((score, len(DETECTION)) for score in scores)]
    best = _best(
        scored, [(keys.index(f"{s}_{m}"), f"{s}_{m}", m in LOWER_IS_BETTER) for s in scores for m in DETECTION]
    )
    parts = ["<h2>Out-of-distribution detection</h2>", _note(f"{sentence} {OOD_NOTE}")]
    if rows:  # a column group per score: the table scrolls on its own rather than the page
        parts.append(f'<div class="wide">{_table(header, rows, best, groups)}</div>')
    if unscored:
        parts.append(_note("No OOD scores: " + "; ".join(unscored)))
    return parts


def _landing_ood(ood: pd.DataFrame) -> list[str]:
    """The landing page's OOD table: AUROC and FPR@95 of the maximum probability and of each model's
    :func:`~kdpipe.report.ood.epistemic_score`."""
    sentence, unscored = ood_notes(ood)
    scored = ood[ood["reason"].isna()].reset_index(drop=True)
    records = scored.to_dict("records")
    epistemic = [epistemic_score(row) for row in records]
    shown = scored[["model", "kind", "seeds", "n_classes"]].copy()
    for group, metric in LANDING_OOD:  # the epistemic group: each model's own score
        scores = epistemic if group == "epistemic" else [group] * len(records)
        shown[f"{group}_{metric}"] = [_value(row, f"{s}_{metric}") if s else None for row, s in zip(records, scores)]
    header = ("model", "kind", "seeds", *(METRIC_HEADERS[m] for _, m in LANDING_OOD[:2]), "score",
              *(METRIC_HEADERS[m] for _, m in LANDING_OOD[2:]))  # fmt: skip
    keys = (None, None, "seeds", "max_prob_auroc", "max_prob_fpr95", None, "epistemic_auroc", "epistemic_fpr95")
    rows = []
    for row, score in zip(shown.to_dict("records"), epistemic):
        values = [_value(row, key) for key in keys]
        shown_values = ["—" if v is None else f"{v:.3f}" for v in values]
        cells = [row["model"], row["kind"], str(row["seeds"]), *shown_values[3:5], score or "—", *shown_values[6:]]
        rows.append((cells, values))
    best = _best(shown, [(keys.index(f"{g}_{m}"), f"{g}_{m}", m in LOWER_IS_BETTER) for g, m in LANDING_OOD])
    parts = [
        "<h3>Out-of-distribution detection</h3>",
        f"<p>{html.escape(sentence)} How well the maximum probability and the model's epistemic score (mutual "
        "information of its members or heads, else of its MC-dropout samples) flag the OOD rows: AUROC (higher is "
        "better, 0.5 = chance) and the false positive rate at 95% true positive rate (lower is better), mean over "
        "seeds. Every score, AUPR and ± std over seeds: the comparison table (<i>summary.html</i>) in category "
        "<i>Summary</i>.</p>",
    ]
    if rows:
        parts.append(_table(header, rows, best, [("", 3), ("max_prob", 2), ("epistemic", 3)]))
    if unscored:
        parts.append(_note("No OOD scores: " + "; ".join(unscored)))
    return parts


def _best(table: pd.DataFrame, columns) -> set[tuple[int, int]]:
    """(row, column) of the best value of each (column index, table column, lower is better) among the comparable
    models, set in bold."""
    full = comparable(table) if len(table) else np.zeros(0, dtype=bool)
    best = set()
    for index, column, lower in columns:
        values = np.where(full, table[column].to_numpy(dtype=float), np.nan)
        if np.isfinite(values).any():
            best.add((int(np.nanargmin(values) if lower else np.nanargmax(values)), index))
    return best


def _value(row: dict, key: str | None):
    """The sort value of a table column (None: sort as text, or no value)."""
    if key is None or key not in row or pd.isna(row[key]):
        return None
    return float(row[key])


def _figure(path: Path) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(Path(path).stem)}" style="width: 100%">'


def _landing_cells(row) -> list[str]:
    """The cells of one model in the landing table: means without their std."""
    params = "—" if pd.isna(row.params) else f"{row.params / 1e6:.1f}M"
    return [
        str(row.model), str(row.kind), text(row.method), str(row.gold_labels), str(row.classes), str(row.seeds),
        format_mean_std(row.accuracy, np.nan, 1, 100), format_interval(row.accuracy_low, row.accuracy_high),
        format_mean_std(row.macro_f1, np.nan, 1, 100), format_mean_std(row.ece, np.nan, 3), params,
        format_mean_std(row.inference_ms, np.nan, 2),
    ]  # fmt: skip


def _best_summary(table: pd.DataFrame, header) -> set[tuple[int, int]]:
    """:func:`_best` of accuracy and macro-F1 (highest) and ECE and AURC (lowest), in the columns so named."""
    names = [name.rstrip(" ↑↓") for name in header]  # (the landing table's names end in an arrow)
    columns = {"accuracy": "accuracy (%)", "macro_f1": "macro-F1 (%)", "ece": "ECE", "aurc": "AURC"}
    return _best(table, [(names.index(n), c, c in ("ece", "aurc")) for c, n in columns.items() if n in names])


def _table(header, rows, best=frozenset(), groups=()) -> str:
    """A sortable table; ``groups``: (label, columns spanned) of a header row above the column names (the sort reads
    the column names' row)."""
    sort = html.escape(SORT)
    head = "".join(f'<th class="{_align(name)}" onclick="{sort}">{html.escape(name)}</th>' for name in header)
    if groups:
        spans = "".join(f'<th class="group" colspan="{span}">{html.escape(label)}</th>' for label, span in groups)
        head = f"{spans}</tr><tr>{head}"
    lines = []
    for r, (cells, keys) in enumerate(rows):
        tds = []
        for c, (cell, key) in enumerate(zip(cells, keys)):
            classes = " ".join(filter(None, (_align(header[c]), "best" if (r, c) in best else "")))
            sort = "" if key is None else f' data-sort="{key:.6g}"'
            tds.append(f'<td class="{classes}"{sort}>{html.escape(cell)}</td>')
        lines.append(f"<tr>{''.join(tds)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(lines)}</tbody></table>"


def _align(name: str) -> str:
    return "left" if name in LEFT else ""


def _warnings(warnings: list[str]) -> list[str]:
    return [f'<p class="warning"><b>Routing warning</b> ({html.escape(w)}). See routing.md.</p>' for w in warnings]


def _note(text: str) -> str:
    return f'<p class="note">{html.escape(text.replace("*", ""))}</p>'
