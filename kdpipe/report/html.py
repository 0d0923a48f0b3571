"""The comparison as HTML: ``summary.html``, a page of its own (the tables of summary.md, sortable by a click on a
column), and ``landing.html``, the fragment that the landing page of ``snakemake --report`` includes
(workflow/report/workflow.rst) so that the report opens on the results rather than on the rule graph.

Sorting is a few lines of inline JavaScript written by hand: the report viewer shows the page in a frame and the
landing fragment as markup, where a library would have to be embedded in every report.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

import numpy as np
import pandas as pd

from kdpipe.report.errors import per_class_rows
from kdpipe.report.markdown import PER_CLASS_NOTE, SUMMARY_NOTE, UNCERTAINTY_NOTE, summary_cells, table_columns
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
LEFT = {"model", "kind", "method", "gold labels read"}
# The columns compared on the landing page, and the summary column each sorts by (higher is better: ↑).
LANDING = (
    ("model", None), ("kind", None), ("method", None), ("gold labels read", None), ("classes", None),
    ("seeds", "seeds"),
    ("accuracy (%) ↑", "accuracy"),
    ("macro-F1 (%) ↑", "macro_f1"), ("ECE ↓", "ece"), ("params", "params"), ("ms / example", "inference_ms"),
)  # fmt: skip
# Summary columns behind the cells of summary_cells, for sorting (None: sort as text).
SORT_KEYS = {
    "seeds": "seeds", "params": "params", "accuracy (%)": "accuracy", "macro-F1 (%)": "macro_f1", "NLL": "nll",
    "ECE": "ece", "Brier": "brier", "train time": "train_time_s", "inference time": "inference_time_s",
    "members": "members", "entropy": "entropy", "aleatoric": "aleatoric", "epistemic": "epistemic",
    "TV total": "tv_total", "TV aleatoric": "tv_aleatoric", "TV epistemic": "tv_epistemic",
}  # fmt: skip


def summary_html(summary: pd.DataFrame, warnings: list[str], title: str) -> str:
    """A self-contained page: the routing warnings, then per split the comparison table and the accuracy per
    class."""
    header, uncertainty, inference = table_columns(summary)
    parts = [f"<h1>{html.escape(title)}</h1>", *_warnings(warnings), _note(SUMMARY_NOTE)]
    if uncertainty:
        parts.append(_note(UNCERTAINTY_NOTE))
    for split, table in summary.groupby("split", sort=False):
        rows = [
            (summary_cells(row, uncertainty, inference), [_sort_value(row, SORT_KEYS.get(name)) for name in header])
            for row in table.itertuples(index=False)
        ]
        parts += [f"<h2>{html.escape(split)} split</h2>", _table(header, rows, _best(table, header))]
        classes, per_class = per_class_rows(table)
        if per_class:
            parts += [f"<h3>Accuracy (%) per class, {html.escape(split)} split</h3>", _note(PER_CLASS_NOTE)]
            parts.append(_table(("model", "kind", *classes), [(cells, [None] * len(cells)) for cells in per_class]))
    body = "\n".join(parts)
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>body {{ font-family: sans-serif; margin: 1.5em; }}{STYLE}</style></head>\n"
        f'<body><div class="kdpipe">\n{body}\n</div></body></html>\n'
    )


def landing_html(summary: pd.DataFrame, warnings: list[str], title: str, plots: list[Path] = ()) -> str:
    """The fragment at the top of the report's landing page: the title, the routing warnings, the compact
    comparison of the first split (test when evaluated) and the key ``plots`` (PNG files, embedded, so that the
    fragment stands alone); the rest is one click away in the Summary category."""
    split = summary["split"].iloc[0]
    table = summary[summary["split"] == split]
    header = tuple(name for name, _ in LANDING)
    rows = [
        (_landing_cells(row), [_sort_value(row, key) for _, key in LANDING]) for row in table.itertuples(index=False)
    ]
    # The viewer narrows its description column for prose; the table needs the room. It also centres the landing
    # view vertically in the window, which cuts off the top (title and table) of a view taller than the window and
    # leaves a blank band above a shorter one (and cuts off the left of a wider one): the view starts at the top
    # left while this fragment is shown.
    style = (
        "<style>.prose.max-w-lg { max-width: 64rem; } "
        ".grow.flex.items-center.justify-center.h-screen { align-items: flex-start; justify-content: flex-start; }"
        f"{STYLE}</style>"
    )
    return "\n".join(
        [
            style,
            '<div class="kdpipe">',
            f"<h2>{html.escape(title)}</h2>",
            *_warnings(warnings),
            f"<p>Models on the <b>{html.escape(split)}</b> split: mean over seeds; click a column to sort. A "
            "teacher of some of the classes (<i>classes</i> 2/5) is scored on its own classes' rows only; the "
            "teachers' oracle reads gold labels. Full tables (± std over seeds, per class), curves, confusion "
            "matrices, cost and calibration: category <i>Summary</i> in the menu.</p>",
            _table(header, rows, _best(table, header, landing=True)),
            *(_figure(path) for path in plots),
            "</div>",
        ]
    )


def _figure(path: Path) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(Path(path).stem)}" style="width: 100%">'


def _landing_cells(row) -> list[str]:
    def number(value, digits, scale=1.0):
        return "—" if pd.isna(value) else f"{value * scale:.{digits}f}"

    params = "—" if pd.isna(row.params) else f"{row.params / 1e6:.1f}M"
    return [
        str(row.model), str(row.kind), "—" if pd.isna(row.method) else str(row.method), str(row.gold_labels),
        str(row.classes),
        str(row.seeds),
        number(row.accuracy, 1, 100), number(row.macro_f1, 1, 100), number(row.ece, 3), params,
        number(row.inference_ms, 2),
    ]  # fmt: skip


def _best(table: pd.DataFrame, header, landing: bool = False) -> set[tuple[int, int]]:
    """(row, column) of the best value of accuracy and macro-F1 (highest) and ECE (lowest) among the comparable
    models, set in bold."""
    full = comparable(table)
    names = {"accuracy": ("accuracy (%) ↑", "accuracy (%)"), "macro_f1": ("macro-F1 (%) ↑", "macro-F1 (%)"),
             "ece": ("ECE ↓", "ECE")}  # fmt: skip
    best = set()
    for column, (landing_name, name) in names.items():
        name = landing_name if landing else name
        values = np.where(full, table[column].to_numpy(dtype=float), np.nan)
        if name in header and np.isfinite(values).any():
            pick = np.nanargmin(values) if column == "ece" else np.nanargmax(values)
            best.add((int(pick), header.index(name)))
    return best


def _sort_value(row, key: str | None):
    if key is None:
        return None
    value = getattr(row, key)
    return None if pd.isna(value) else float(value)


def _table(header, rows, best=frozenset()) -> str:
    sort = html.escape(SORT)
    head = "".join(f'<th class="{_align(name)}" onclick="{sort}">{html.escape(name)}</th>' for name in header)
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
