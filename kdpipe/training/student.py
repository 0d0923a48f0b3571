"""A student job's data and fresh model: what the ``distill`` and ``cotrain`` stages both start from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd
import torch

from kdpipe.core.device import pick_device
from kdpipe.core.store import KdpipeError
from kdpipe.data.batching import Encoded, encode_frame
from kdpipe.data.dataset import NO_LABEL, TRANSFER, dataset_domains, read_labels, read_split, restrict_to_domain
from kdpipe.data.transfer import transfer_rows
from kdpipe.models.settings import StudentModel
from kdpipe.models.students import build_student
from kdpipe.training.loop import encoded_validator
from kdpipe.training.settings import TrainSettings


@dataclass
class SplitPart:
    """The rows of one split among a student's training rows: the order every cached signal of that split is in
    (the whole split's row_ids) and where the student's rows are in it."""

    split: str
    split_row_ids: np.ndarray
    positions: np.ndarray


@dataclass
class StudentData:
    labels: list[str]
    train: pd.DataFrame  # the student's labelled train rows (a domain's, for a per-domain student)
    valid: pd.DataFrame
    model: torch.nn.Module
    tokenizer: object
    enc_train: Encoded
    enc_valid: Encoded
    settings: TrainSettings
    device: torch.device
    split_row_ids: np.ndarray  # row_ids of the whole train split, the order every cached signal is in
    domains: list[str] | None  # the dataset's domains (None without a domain column)
    transfer: pd.DataFrame | None = None  # the transfer rows it learns from, after the train rows in enc_train
    transfer_row_ids: np.ndarray | None = None  # row_ids of the whole transfer split

    @property
    def train_positions(self) -> np.ndarray:
        """Position of each of the student's train rows in the whole train split."""
        return np.searchsorted(self.split_row_ids, self.train["row_id"].to_numpy())

    @property
    def parts(self) -> list[SplitPart]:
        """The splits of the student's training rows, in the order of ``enc_train``: train, then transfer."""
        parts = [SplitPart("train", self.split_row_ids, self.train_positions)]
        if self.transfer is not None:
            positions = np.searchsorted(self.transfer_row_ids, self.transfer["row_id"].to_numpy())
            parts.append(SplitPart(TRANSFER, self.transfer_row_ids, positions))
        return parts

    def validator(self, eval_batch_size: int):
        """``validate`` of the training loop for a model that predicts the dataset's labels."""
        return encoded_validator(self.enc_valid, batch_size=eval_batch_size, device=self.device)


class StudentJob(Protocol):
    """What :func:`student_data` reads of a student job's settings (``kdpipe.methods.settings.StudentSettings``)."""

    model: StudentModel
    max_length: int
    domain: str | None
    transfer: float | None

    def train_settings(self) -> TrainSettings: ...


def student_data(
    data_dir: Path, job: StudentJob, *, attn: str | None = None, transfer_dir: Path | None = None
) -> StudentData:
    """Read the splits (its ``domain``'s rows only, when set), build the student ``job.model`` and tokenise train and
    validation its way; with a ``transfer`` share the training rows are followed by that share of the transfer rows of
    ``transfer_dir``, with the label ``NO_LABEL``."""
    training, domain, transfer = job.train_settings(), job.domain, job.transfer
    labels = read_labels(data_dir)
    domains = dataset_domains(data_dir)
    full_train = read_split(data_dir, "train")
    train, valid = (
        restrict_to_domain(frame, domain, domains, "students.<name>.domain")
        for frame in (full_train, read_split(data_dir, "validation"))
    )
    rows = transfer_ids = None
    model, tokenizer = build_student(
        job.model, labels, seed=training.seed, pairs="text_pair" in train.columns, attn=attn
    )
    if transfer:
        if transfer_dir is None:
            raise KdpipeError("the student learns from transfer rows (its transfer share): pass --transfer")
        whole = read_split(transfer_dir, TRANSFER)
        if read_labels(transfer_dir) != labels:
            raise KdpipeError(f"{transfer_dir}: made for a dataset with other labels; rerun the transfer job")
        transfer_ids = whole["row_id"].to_numpy()
        rows = transfer_rows(whole, float(transfer))
        del whole
    learned = train if rows is None else pd.concat([train, rows], ignore_index=True)
    label_ids = learned["label_id"].fillna(NO_LABEL).to_numpy(np.int64) if rows is not None else None
    separate = getattr(model, "separate_pairs", False)
    encoded = [
        encode_frame(
            tokenizer,
            frame,
            max_length=job.max_length,
            separate_pairs=separate,
            label_ids=frame["label_id"].to_numpy() if ids is None else ids,
        )
        for frame, ids in ((learned, label_ids), (valid, None))
    ]
    return StudentData(
        labels,
        train,
        valid,
        model,
        tokenizer,
        *encoded,
        training,
        pick_device(),
        full_train["row_id"].to_numpy(),
        domains,
        rows,
        transfer_ids,
    )
