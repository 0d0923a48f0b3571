"""Why MUKI does or does not beat its baselines here: the quality of each method's distillation target.

Reads only the cached artifacts of a finished run (data split, teacher logits, MC-dropout scores) and reports, on
the training split that the students learn from:
- how often each method's target q puts its largest mass on the gold class (the student never sees gold labels,
  so this bounds what a pure-KD student is told);
- for MUKI, how often the teacher that owns the gold class gets the higher certainty score, and the mean scores of
  each teacher on rows of its own classes and of the other teacher's classes;
- MUKI's margin weight m (the gap between the two highest scores): its mean, the share of the target's weight on
  rows whose target is right, and how often the quarter of rows with the largest m is routed to its owner;
- where a teacher sends the rows of another teacher's class when it sends most of them (80% or more) to one class of
  its own, with its mean top probability on them and on its own rows (a confident teacher outside its classes is
  what breaks certainty routing);
- with ``--against``, another run's certainty for the same rows (the same teachers' MC-dropout pass with other
  settings, e.g. fewer samples): its correlation with this run's, per teacher, and how often both pick the same
  teacher, on all rows and on the quarter with the largest margin in this run.
The ``route`` job's log and the report's routing table give the routing figures of every router
(docs/routing.md); this script adds the targets of the methods that do not route (vanilla KD).

    python experiments/muki_diagnostics.py --results results --dataset bbc_news --teachers minilm_a minilm_b
    python experiments/muki_diagnostics.py --results runs/m16/results --against runs/m4/results ...
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from kdpipe.core.store import KdpipeError
from kdpipe.data.dataset import read_labels, read_split
from kdpipe.data.labelspace import teacher_blocks
from kdpipe.methods.losses import union_logits
from kdpipe.methods.muki import aggregate, padded_probs
from kdpipe.routing.certainty import certainty_scores
from kdpipe.signals.io import read_logits, read_mc


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=Path("results"))
    p.add_argument("--dataset", default="bbc_news")
    p.add_argument("--teachers", nargs="+", default=["minilm_a", "minilm_b"])
    p.add_argument("--tau-s", type=float, default=0.2)
    p.add_argument("--against", type=Path, help="another run's results/ folder with these teachers' MC-dropout scores")
    args = p.parse_args()
    for run in filter(None, (args.results, args.against)):
        if not (run / "signals").is_dir():
            p.error(f"{run}: not a run's results/ folder (no signals/ in it)")
    return args


def main() -> None:
    args = arguments()

    data = args.results / "data" / args.dataset
    labels = read_labels(data)
    train = read_split(data, "train")
    y, row_ids = train["label_id"].to_numpy(), train["row_id"].to_numpy()
    logits, certainty, classes = [], [], {}
    for t in args.teachers:
        z, classes[t] = read_logits(args.results / "signals" / t / "train" / "logits.parquet", row_ids)
        logits.append(torch.tensor(z))
        certainty.append(torch.tensor(train_certainty(args.results, t, row_ids)))
    other = other_certainty(args.against, args.dataset, train, args.teachers, classes) if args.against else None
    blocks = teacher_blocks(classes, labels, policy="disjoint", where="diagnostics")
    blocks = [torch.as_tensor(blocks[t]) for t in args.teachers]
    owner = np.zeros(len(y), dtype=int)
    for k, block in enumerate(blocks):
        owner[np.isin(y, block.numpy())] = k

    padded = padded_probs(logits, blocks, len(labels), 1.0)
    mc_scores = torch.stack(certainty, -1)
    det_scores = torch.stack([certainty_scores("logit_entropy", logits=z.numpy()) for z in logits], -1)
    targets = {
        "vanilla_kd (softmax of concatenated logits)": union_logits(logits, blocks, len(labels)),
        "muki soft, MC scores": aggregate(padded, mc_scores, "soft", args.tau_s),
        "muki hard, MC scores": aggregate(padded, mc_scores, "hard", args.tau_s),
        "muki soft, deterministic scores (no_mc)": aggregate(padded, det_scores, "soft", args.tau_s),
        "muki hard, deterministic scores (no_mc)": aggregate(padded, det_scores, "hard", args.tau_s),
    }
    print(f"train rows: {len(y)}; teachers: " + "; ".join(f"{t}: {', '.join(classes[t])}" for t in args.teachers))
    print("\n| target | argmax = gold class |\n| --- | ---: |")
    for name, q in targets.items():
        print(f"| {name} | {100 * (q.argmax(-1).numpy() == y).mean():.1f}% |")
    print(
        "\n| scores | owner teacher scores highest | "
        + " | ".join(f"{t} on own / other rows" for t in args.teachers)
        + " |"
    )
    print("| --- | ---: | " + " | ".join("---:" for _ in args.teachers) + " |")
    for name, s in (("MC-dropout certainty", mc_scores), ("deterministic certainty", det_scores)):
        s = s.numpy()
        right = (s.argmax(-1) == owner).mean()
        cells = [f"{s[owner == k, k].mean():.3f} / {s[owner != k, k].mean():.3f}" for k in range(len(args.teachers))]
        print(f"| {name} | {100 * right:.1f}% | " + " | ".join(cells) + " |")

    scores = mc_scores.numpy()
    top2 = np.sort(scores, -1)[:, -2:] if scores.shape[1] > 1 else np.c_[np.zeros(len(y)), np.ones(len(y))]
    margin = top2[:, 1] - top2[:, 0] + 1e-6
    right = targets["muki soft, MC scores"].argmax(-1).numpy() == y
    routed = scores.argmax(-1) == owner
    top = margin >= np.quantile(margin, 0.75)
    print(
        f"\nMUKI's margin m: mean {margin.mean():.3f}; target right on {100 * right.mean():.1f}% of rows, "
        f"{100 * (margin * right).sum() / margin.sum():.1f}% of the m-weighted rows; the quarter of rows with the "
        f"largest m routed to their owner {100 * routed[top].mean():.1f}% (all rows {100 * routed.mean():.1f}%)"
    )

    print("\n| teacher | rows of | sent to | share | mean top p | mean top p on own rows |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for k, t in enumerate(args.teachers):
        probs = torch.softmax(logits[k], -1).numpy()
        own_top = probs[owner == k].max(-1).mean()
        for c in np.unique(y[owner != k]):
            rows = probs[y == c]
            picks = np.bincount(rows.argmax(-1), minlength=probs.shape[1])
            if picks.max() >= 0.8 * len(rows):
                sent = classes[t][picks.argmax()]
                print(
                    f"| {t} | {labels[c]} | {sent} | {100 * picks.max() / len(rows):.0f}% | "
                    f"{rows.max(-1).mean():.2f} | {own_top:.2f} |"
                )

    if other is not None:
        against(args.against, other, args.teachers, scores, owner, top)


def other_certainty(other_run: Path, dataset: str, train, teachers: list[str], classes: dict) -> np.ndarray:
    """Another run's certainty of the same teachers (of the same classes) on the same training rows, [rows,
    teachers]; stops, before any report, when that run's split or teachers are others."""
    where = f"--against {other_run}"
    data = other_run / "data" / dataset
    if not data.is_dir():
        raise SystemExit(f"{where}: it has no prepared dataset {dataset!r}; give a run of the same dataset and split")
    try:
        theirs = read_split(data, "train")
    except KdpipeError as err:
        raise SystemExit(f"{where}: {err}") from None
    if not (
        len(theirs) == len(train)
        and np.array_equal(theirs["row_id"].to_numpy(), train["row_id"].to_numpy())
        and np.array_equal(theirs["text"].to_numpy(), train["text"].to_numpy())
    ):
        raise SystemExit(f"{where}: its {dataset} training split holds other rows; give a run of the same split")
    row_ids = train["row_id"].to_numpy()
    try:
        return np.stack([train_certainty(other_run, t, row_ids, classes[t]) for t in teachers], -1)
    except KdpipeError as err:
        raise SystemExit(f"{where}: {err}") from None


def against(other_run: Path, other: np.ndarray, teachers: list[str], scores, owner, top) -> None:
    """This run's certainty (``scores``, rows by teachers) against another run's (``other``) for the same rows."""
    same = scores.argmax(-1) == other.argmax(-1)
    corr = ", ".join(f"{t} {np.corrcoef(scores[:, k], other[:, k])[0, 1]:.3f}" for k, t in enumerate(teachers))
    print(
        f"\nAgainst {other_run}: certainty correlation {corr}; the same teacher scores highest on "
        f"{100 * same.mean():.1f}% of rows, {100 * same[top].mean():.1f}% of the quarter with the largest m here; "
        f"the owner scores highest there on {100 * (other.argmax(-1) == owner).mean():.1f}% of rows"
    )


def train_certainty(results: Path, teacher: str, row_ids: np.ndarray, labels: list[str] | None = None) -> np.ndarray:
    """A teacher's MC-dropout certainty on the training rows of one run, in the order of ``row_ids`` (its classes
    checked against ``labels`` when given)."""
    _, scores = read_mc(results / "signals" / teacher / "train" / "mc.npy", row_ids, labels)
    return scores["certainty"].to_numpy()


if __name__ == "__main__":
    main()
