"""The peers' side of ``benchmarks/peers.py``: the teachers run online on every training batch, as a user of a
general KD framework runs them, and each method of the default experiment takes its loss from their outputs.

The losses are kdpipe's own pure functions (``kdpipe.methods``: docs/methods.md §1), so the peers and kdpipe train
the same objective and differ only in where the teacher signals come from: computed on every batch of every epoch
of every student (here), or read from kdpipe's cache. A peer job gets the same settings JSON as kdpipe's ``distill``
job for the same student (``Plan.student_params``), reads the data that ``make run`` prepared and the teachers it
fine-tuned, and writes a Hugging Face model folder that ``peers.py`` scores on the test split like kdpipe's.

- ``vanilla_kd``, ``uhc``: the teachers' eval-mode logits of the batch;
- ``dfa``: the same forward pass also returns the teacher layers the student layers are aligned with;
- ``muki``: MUKI's certainty u = 1 − H(p̄)/log C from M dropout-on passes of every teacher over the batch (M =
  ``mc_dropout.samples`` of the benchmark's config: 16, as MUKI's own code runs it), on top of the logits.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from kdpipe.data.dataset import read_labels, read_split
from kdpipe.methods.dfa import Amalgamator, amalgamation_losses
from kdpipe.methods.losses import union_logits, vanilla_kd_loss
from kdpipe.methods.muki import aggregate, margin_weights, muki_loss, padded_probs
from kdpipe.methods.uhc import uhc_loss
from kdpipe.models.loading import minilm_dir

METHODS = ("vanilla_kd", "uhc", "dfa", "muki")


class Job:
    """One peer student: its settings (the distill job's params), the finished default run, the output folder."""

    def __init__(self, params: str, workdir: Path, out: Path, mc_samples: int):
        self.params = json.loads(params)
        self.method = self.params["method"]
        if self.method not in METHODS:
            raise SystemExit(f"peer job: method {self.method!r} has no online runner here ({', '.join(METHODS)})")
        self.args = self.params["method_args"]
        self.workdir, self.out, self.mc_samples = workdir, out, mc_samples
        self.data = workdir / "results/data/bbc_news"
        self.labels = read_labels(self.data)
        self.max_length = int(self.params["max_length"])
        self.tokenizer = AutoTokenizer.from_pretrained(minilm_dir())

    @classmethod
    def from_command_line(cls, doc: str) -> tuple[argparse.Namespace, Job]:
        """A peer job's command line (both peers take the same), its torch threads set."""
        p = argparse.ArgumentParser(description=doc.splitlines()[0])
        p.add_argument("--params", required=True, help="the distill job's settings JSON")
        p.add_argument("--workdir", type=Path, required=True)
        p.add_argument("--out", type=Path, required=True)
        p.add_argument("--threads", type=int, default=2)
        p.add_argument("--max-steps", type=int, default=0, help="time this many steps only (0: the whole run)")
        p.add_argument("--mc-samples", type=int, default=16, help="MUKI's dropout-on passes per teacher and batch")
        args = p.parse_args()
        torch.set_num_threads(args.threads)
        return args, cls(args.params, args.workdir, args.out, args.mc_samples)

    def encode(self, split: str) -> list[dict]:
        """The split as Hugging Face examples (ids cut at max_length, label index in the data's label order, and the
        row id that the MUKI check of ``peers.py`` matches with kdpipe's cache)."""
        frame = read_split(self.data, split)
        enc = self.tokenizer(frame["text"].tolist(), truncation=True, max_length=self.max_length)
        return [
            {"input_ids": i, "attention_mask": m, "labels": int(y), "row_id": int(r)}
            for i, m, y, r in zip(enc["input_ids"], enc["attention_mask"], frame["label_id"], frame["row_id"])
        ]

    def student(self) -> nn.Module:
        """The student kdpipe trains: MiniLM cut to the layers of ``model.init.layers``, a fresh 5-class head."""
        model = AutoModelForSequenceClassification.from_pretrained(
            minilm_dir(),
            num_labels=len(self.labels),
            id2label=dict(enumerate(self.labels)),
            label2id={c: i for i, c in enumerate(self.labels)},
        )
        keep = list(self.params["model"]["init"]["layers"])
        model.bert.encoder.layer = nn.ModuleList([model.bert.encoder.layer[i] for i in keep])
        model.config.num_hidden_layers = len(keep)
        return model

    def teachers(self) -> OnlineTeachers:
        models, blocks = [], []
        for name in self.params["teachers"]:
            model = AutoModelForSequenceClassification.from_pretrained(self.workdir / "results/teachers" / name)
            models.append(model.eval())
            order = [model.config.id2label[i] for i in range(model.config.num_labels)]
            blocks.append(torch.tensor([self.labels.index(c) for c in order]))
        layers = None
        if self.method == "dfa":  # the teacher layers each aligned student layer is matched with
            layers = [[t for _, t in self.params["alignment"][name]] for name in self.params["teachers"]]
        return OnlineTeachers(
            models,
            blocks,
            hidden_layers=layers,
            mc_samples=self.mc_samples if self.method == "muki" else 0,
        )

    def save(self, model: nn.Module, timing: dict) -> None:
        model.save_pretrained(self.out)
        self.tokenizer.save_pretrained(self.out)
        (self.out / "timing.json").write_text(json.dumps(timing))


class OnlineTeachers(nn.Module):
    """Every teacher of a student run on one batch, without gradients: eval-mode logits, the aligned hidden states
    (DFA) and MUKI's MC-dropout certainty (dropout on for M passes, everything else as in eval mode)."""

    def __init__(self, teachers, blocks, hidden_layers=None, mc_samples: int = 0):
        super().__init__()
        self.teachers = nn.ModuleList(teachers)
        self.blocks = blocks
        self.hidden_layers = hidden_layers
        self.mc_samples = mc_samples

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict:
        out = {"logits": [], "hidden": [], "certainty": None}
        certainty = []
        for k, teacher in enumerate(self.teachers):
            teacher.eval()
            result = teacher(
                input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=bool(self.hidden_layers)
            )
            out["logits"].append(result.logits.float())
            if self.hidden_layers:
                out["hidden"].append([result.hidden_states[layer].float() for layer in self.hidden_layers[k]])
            if self.mc_samples:
                teacher.train()  # dropout on: BERT-like teachers have no batch statistics, dropout is all it changes
                mean = sum(
                    teacher(input_ids=input_ids, attention_mask=attention_mask).logits.float().softmax(-1)
                    for _ in range(self.mc_samples)
                ) / float(self.mc_samples)
                teacher.eval()
                entropy = -(torch.special.xlogy(mean, mean)).sum(-1)
                certainty.append(1.0 - entropy / math.log(mean.shape[-1]))
        if certainty:
            out["certainty"] = torch.stack(certainty, -1)
        return out


class MethodLoss:
    """The student's loss under its method from the online teachers' outputs (kdpipe's loss functions), with DFA's
    adapters when the method has them; records MUKI's certainties per row for the check of ``peers.py``."""

    def __init__(self, job: Job, teachers: OnlineTeachers, student_config):
        self.job, self.method, self.args = job, job.method, job.args
        self.blocks = teachers.blocks
        self.num_labels = len(job.labels)
        self.amalgamator = None
        if self.method == "dfa":
            widths = [t.config.hidden_size for t in teachers.teachers]
            self.student_layers = [s for s, _ in job.params["alignment"][job.params["teachers"][0]]]
            self.amalgamator = Amalgamator(widths, student_config.hidden_size, len(self.student_layers))
        self.recorded: dict[int, np.ndarray] = {}

    @property
    def needs_hidden(self) -> bool:
        return self.method == "dfa"

    def __call__(self, student_out, teacher_out: dict, attention_mask, row_ids=None) -> torch.Tensor:
        z, args = student_out.logits, self.args
        if self.method == "vanilla_kd":
            return vanilla_kd_loss(
                z, union_logits(teacher_out["logits"], self.blocks, self.num_labels), args["temperature"]
            )
        if self.method == "uhc":
            return uhc_loss(z, teacher_out["logits"], self.blocks, args["temperature"])
        if self.method == "muki":
            u = teacher_out["certainty"]
            if row_ids is not None:
                self.recorded.update(zip(row_ids.tolist(), u.cpu().numpy()))
            padded = padded_probs(teacher_out["logits"], self.blocks, self.num_labels, args["temperature"])
            q = aggregate(padded, u, args["aggregation"], args["tau_s"])
            return muki_loss(z, q, margin_weights(u) if args["margin"] else None, args["temperature"])
        # dfa: vanilla KD plus the amalgamation of the aligned hidden states (docs/methods.md §1)
        kd = vanilla_kd_loss(z, union_logits(teacher_out["logits"], self.blocks, self.num_labels), args["temperature"])
        mask = attention_mask.float()
        rec_total = amal_total = z.new_zeros(())
        for p, layer in enumerate(self.student_layers):
            feats = [hidden[p] for hidden in teacher_out["hidden"]]
            rec, amal = amalgamation_losses(self.amalgamator, p, student_out.hidden_states[layer].float(), feats, mask)
            rec_total, amal_total = rec_total + rec, amal_total + amal
        return args["kd_weight"] * kd + args["rec_weight"] * rec_total + args["amal_weight"] * amal_total

    def save_recorded(self, path: Path) -> None:
        """MUKI's online certainties of the rows seen (the last pass over a row wins), for the check of peers.py."""
        if self.recorded:
            rows = np.array(sorted(self.recorded))
            np.savez(path, row_id=rows, certainty=np.stack([self.recorded[r] for r in rows]))


def param_groups(model: nn.Module, lr: float, weight_decay: float, extra: nn.Module | None, extra_lr: float):
    """AdamW groups as kdpipe makes them (no decay on biases and LayerNorm weights), DFA's adapters at their rate."""
    groups = []
    for module, rate in ((model, lr), (extra, extra_lr)):
        if module is None:
            continue
        params = [p for p in module.parameters() if p.requires_grad]
        groups += [
            {"params": [p for p in params if p.ndim >= 2], "lr": rate, "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim < 2], "lr": rate, "weight_decay": 0.0},
        ]
    return groups


class Clock:
    """Training seconds and optimiser steps of a peer job (its start-up and validation not included)."""

    def __init__(self):
        self.steps, self.seconds, self._start = 0, 0.0, None

    def start(self) -> None:
        self._start = time.perf_counter()

    def stop(self, steps: int) -> None:
        self.seconds += time.perf_counter() - self._start
        self.steps += steps

    def timing(self, **fields) -> dict:
        return {"train_s": self.seconds, "steps": self.steps, **fields}
