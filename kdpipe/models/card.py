"""The model card (``README.md``) written into every trained model's folder: what the model is, what it was trained
on and from, its validation metrics, and how to use it
(docs/your-own-models-and-data.md, "Using a trained student")."""

from __future__ import annotations

import json

from kdpipe.core.markdown import plain  # (names as plain text, as the report writes them; not code spans)

# Settings worth a line in the card, in this order (a model's config slice has many more)
SETTINGS = ("max_length", "epochs", "lr", "batch_size", "seed")


def model_card(manifest: dict, metrics: dict, *, params: int, loader: str) -> str:
    """Markdown with a Hugging Face YAML header. ``loader``: ``"transformers"``, or kdpipe's architecture."""
    config = manifest.get("config") or {}
    kind = manifest.get("kind", "model")
    labels = manifest.get("labels") or []
    header = [
        "---",
        "library_name: transformers" if loader == "transformers" else "library_name: kdpipe",
        "pipeline_tag: text-classification",
        "tags: [knowledge-distillation, kdpipe]",
        "---",
        "",
    ]
    if kind == "student":
        teachers = ", ".join(plain(t) for t in manifest.get("teachers") or []) or "a teacher trained with it"
        what = f"A student distilled by kdpipe with the method `{manifest.get('method')}` from {teachers}."
    elif manifest.get("imported"):
        what = f"A teacher imported by kdpipe from the checkpoint {plain(config.get('checkpoint'))}, without training."
    else:
        source = config.get("checkpoint") or config.get("backbone")
        what = f"A teacher fine-tuned by kdpipe from {plain(source)}."
    lines = [*header, f"# {kind.capitalize()}", "", what, ""]
    lines += ["## Data", "", f"Classes, in output order: {', '.join(plain(c) for c in labels)}."]
    rows = manifest.get("rows") or {}
    if rows:
        lines.append("Rows: " + ", ".join(f"{split} {n}" for split, n in rows.items()) + ".")
    lines += ["", "## Training", ""]
    lines += [f"- {key}: {config[key]}" for key in SETTINGS if key in config]
    if kind == "student":
        lines.append(f"- method_args: `{json.dumps(config.get('method_args'), sort_keys=True)}`")
    lines.append(f"- parameters: {params:,}")
    if metrics.get("validation"):
        kept = metrics.get("best_epoch")
        shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics["validation"].items() if k != "score")
        epoch = f" at epoch {kept}, the best on validation, whose weights these are" if kept else ""
        lines += ["", "## Validation", "", f"{shown}{epoch}."]
    lines += ["", "## Use", ""]
    max_length = config.get("max_length")
    if loader == "transformers":
        lines += [
            "```python",
            "from transformers import pipeline",
            "",
            'classify = pipeline("text-classification", model="PATH/TO/THIS/FOLDER", truncation=True)',
            'classify(["first text", "second text"])',
            "```",
            "",
            f"`truncation=True` cuts texts at {max_length} tokens (the tokenizer's `model_max_length`), as kdpipe did "
            "when it trained and evaluated this model.",
        ]
    else:
        lines += [
            f"A {loader} model: transformers cannot load it; kdpipe can.",
            "",
            "```python",
            "from kdpipe.models.loading import load_trained",
            "",
            'model = load_trained("PATH/TO/THIS/FOLDER")',
            "```",
        ]
    lines += [
        "",
        "Or predict on a file: `kdpipe predict --model PATH/TO/THIS/FOLDER --input texts.csv --out predictions.csv`.",
        "",
    ]
    return "\n".join(lines)
