"""``summary.md``: the report's tables as Markdown (results, selective prediction and uncertainty when present,
accuracy per domain). Names from the data or the config (classes, models, the title) are written as plain text
(:func:`kdpipe.core.markdown.plain`), never inside code spans: a class named ``<img onerror=...>`` or
``**bold** [l](http://x)`` shows as written, and never becomes HTML, emphasis or a link in a Markdown viewer."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kdpipe.core.markdown import plain
from kdpipe.report.errors import per_class_rows
from kdpipe.report.figures import text
from kdpipe.report.summary import UNCERTAINTY_COLUMNS, has_members, has_selective

MARKDOWN_HEADER = (
    "model", "kind", "method", "gold labels read", "classes", "seeds", "params",
    "accuracy (%)", "95% interval", "macro-F1 (%)", "NLL", "ECE", "Brier", "train time",
)  # fmt: skip
# Optional column groups, shown only when some model has the fields; the AURC goes before the train time.
SELECTIVE_HEADER = ("AURC",)
UNCERTAINTY_HEADER = ("members", "entropy", "aleatoric", "epistemic", "TV total", "TV aleatoric", "TV epistemic")
INFERENCE_HEADER = ("inference time",)
MARKDOWN_LEFT_ALIGNED = {"model", "kind", "method", "gold labels read", "trained on"}


def summary_markdown(summary: pd.DataFrame, warnings: list[str] = (), title: str = "Model comparison") -> str:
    """The summary as Markdown: the routing ``warnings``, then per split the table (mean ± sample std over seeds)
    and the accuracy per class (and per domain where there are domains)."""
    parts = [
        f"# {plain(title)}\n",
        *[f"> **Routing warning** ({plain(text)}). See routing.md.\n" for text in warnings],
        f"{SUMMARY_NOTE}\n",
    ]
    header, uncertainty, inference, selective = table_columns(summary)
    if selective:
        parts.append(f"{SELECTIVE_NOTE}\n")
    if uncertainty:
        parts.append(f"{UNCERTAINTY_NOTE}\n")
    for split, table in summary.groupby("split", sort=False):
        rows = [summary_cells(row, uncertainty, inference, selective) for row in table.itertuples(index=False)]
        parts.append(f"## {split} split\n\n{markdown_table(header, rows)}\n")
        classes, per_class = per_class_rows(table)
        if per_class:
            parts.append(
                f"### Accuracy (%) per class, {split} split\n\n{PER_CLASS_NOTE}\n\n"
                f"{markdown_table(('model', 'kind', *classes), per_class)}\n"
            )
        if table["per_domain"].notna().any():
            parts.append(_domain_markdown(split, table))
    return "\n".join(parts)


SUMMARY_NOTE = (
    "One row per model; with several seeds, mean ± sample standard deviation over seeds. Teachers trained on a "
    "subset of the classes are evaluated on their own classes only (column *classes*), so their scores are not "
    "directly comparable with full-label-space models. The teachers' oracle (kind *oracle*) predicts each row with "
    "the teacher that owns its gold class: it reads gold labels, the ceiling of what a student can learn from "
    "these teachers."
)
UNCERTAINTY_NOTE = (
    "Entropy, aleatoric and epistemic: mean per-example uncertainty (nats) over the model's members or heads. TV: "
    "total variation distance between the model's histogram of that uncertainty and its reference ensemble's "
    "(0 = same distribution, 1 = disjoint)."
)
SELECTIVE_NOTE = (
    "AURC: area under the risk–coverage curve of the maximum probability. Keep the rows the model is most confident "
    "of; the risk is the error rate of the rows kept, and AURC its mean over every coverage, from the single most "
    "confident row to all of them. Lower is better: the model's confidence ranks its errors last."
)
PER_CLASS_NOTE = "Accuracy on each gold class's rows, mean over seeds; — : a class the model does not predict."


def table_columns(summary: pd.DataFrame) -> tuple[tuple[str, ...], bool, bool, bool]:
    """The comparison table's header, and whether it shows the uncertainty, the inference-time and the AURC columns
    (only when some model has them; the uncertainty split only with several members)."""
    uncertainty = bool(summary["entropy"].notna().any()) and has_members(summary)
    inference = bool(summary["inference_time_s"].notna().any())
    selective = has_selective(summary)
    header = (
        *MARKDOWN_HEADER[:-1], *(SELECTIVE_HEADER if selective else ()), MARKDOWN_HEADER[-1],
        *(UNCERTAINTY_HEADER if uncertainty else ()), *(INFERENCE_HEADER if inference else ()),
    )  # fmt: skip
    return header, uncertainty, inference, selective


def _domain_markdown(split: str, table: pd.DataFrame) -> str:
    """Accuracy on each domain's rows (docs/methods.md §4), the students of one ``per_domain`` entry (its ``group``)
    on one row."""
    table = table[table["per_domain"].notna()]
    domains = sorted(set().union(*table["per_domain"]))
    rows = {}
    for row in table.itertuples(index=False):
        name = row.model if pd.isna(row.group) else row.group
        trained = "each domain" if not pd.isna(row.group) else "all domains" if pd.isna(row.domain) else row.domain
        cells = rows.setdefault(
            (name, row.kind, text(row.method)), {"trained": trained, "seeds": row.seeds, "accuracy": {}}
        )
        cells["accuracy"].update(row.per_domain)
    header = ("model", "kind", "method", "trained on", "seeds", *domains, "mean over domains")
    lines = []
    for (name, kind, method), cells in rows.items():
        accuracy = cells["accuracy"]
        mean = np.mean([accuracy[d][0] for d in domains]) if set(domains) <= set(accuracy) else np.nan
        shown = [format_mean_std(*accuracy[d], 1, scale=100) if d in accuracy else "" for d in domains]
        mean_cell = format_mean_std(mean, np.nan, 1, scale=100)
        lines.append([name, kind, method, cells["trained"], str(cells["seeds"]), *shown, mean_cell])
    return (
        f"### Accuracy (%) per domain, {split} split\n\nEach model on the rows of each domain (mean ± std over "
        "seeds); a per-domain student is evaluated on its own domain only. The last column is the unweighted "
        f"mean of the domains' accuracies.\n\n{markdown_table(header, lines)}\n"
    )


def format_interval(low: float, high: float) -> str:
    """A 95% interval of an accuracy in percent, ``[95.1, 98.2]``; ``—`` where it could not be computed."""
    return "—" if pd.isna(low) or pd.isna(high) else f"[{100 * low:.1f}, {100 * high:.1f}]"


def summary_cells(row, uncertainty: bool, inference: bool, selective: bool = False) -> list[str]:
    """The cells of one model, with the optional column groups that the table shows."""
    cells = [
        str(row.model), str(row.kind), text(row.method), row.gold_labels, row.classes,
        str(row.seeds), _format_params(row.params),
        format_mean_std(row.accuracy, row.accuracy_std, 1, scale=100),
        format_interval(row.accuracy_low, row.accuracy_high),
        format_mean_std(row.macro_f1, row.macro_f1_std, 1, scale=100),
        format_mean_std(row.nll, row.nll_std, 3),
        format_mean_std(row.ece, row.ece_std, 3),
        format_mean_std(row.brier, row.brier_std, 3),
        *([format_mean_std(row.aurc, row.aurc_std, 4)] if selective else []),
        _format_duration(row.train_time_s, row.train_time_s_std),
    ]  # fmt: skip
    if uncertainty:
        cells.append(text(row.members))
        cells += [format_mean_std(getattr(row, c), getattr(row, f"{c}_std"), 3) for c in UNCERTAINTY_COLUMNS]
    if inference:
        cells.append(_format_duration(row.inference_time_s, row.inference_time_s_std))
    return cells


def markdown_table(header: tuple[str, ...], rows: list[list[str]], left=MARKDOWN_LEFT_ALIGNED) -> str:
    """A Markdown table, every cell :func:`plain` text, the columns named in ``left`` aligned left."""
    align = ["---" if name in left else "---:" for name in header]
    lines = [[plain(cell) for cell in header], align, *([plain(cell) for cell in row] for row in rows)]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def format_mean_std(mean: float, std: float, digits: int, scale: float = 1.0, unit: str = "") -> str:
    if pd.isna(mean):
        return "—"
    text = f"{mean * scale:.{digits}f}"
    if not pd.isna(std):
        text += f" ± {std * scale:.{digits}f}"
    return text + unit


def _format_duration(seconds: float, std: float) -> str:
    """Seconds below 100 s, minutes below 100 min, hours beyond; the std in the mean's unit."""
    if pd.isna(seconds):
        return "—"
    scale, unit = (1, " s") if seconds < 100 else (1 / 60, " min") if seconds < 6000 else (1 / 3600, " h")
    return format_mean_std(seconds, std, 1, scale=scale, unit=unit)


def _format_params(params: float) -> str:
    if pd.isna(params):
        return "—"
    for scale, suffix in ((1e9, "B"), (1e6, "M")):
        if params >= scale:
            return f"{params / scale:.1f}{suffix}"
    return f"{params / 1e3:.0f}K"
