"""A student job's data and fresh model: what the ``distill`` and ``cotrain`` stages both start from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from kdpipe.core.device import pick_device
from kdpipe.data.batching import Encoded, encode_frame
from kdpipe.data.dataset import dataset_domains, read_labels, read_split, restrict_to_domain
from kdpipe.models.students import build_student
from kdpipe.training.loop import TrainSettings, encoded_validator


@dataclass
class StudentData:
    labels: list[str]
    train: pd.DataFrame  # the student's train rows (a domain's, for a per-domain student)
    valid: pd.DataFrame
    model: torch.nn.Module
    tokenizer: object
    enc_train: Encoded
    enc_valid: Encoded
    settings: TrainSettings
    device: torch.device
    split_row_ids: np.ndarray  # row_ids of the whole train split, the order every cached signal is in
    domains: list[str] | None  # the dataset's domains (None without a domain column)

    @property
    def train_positions(self) -> np.ndarray:
        """Position of each of the student's train rows in the whole train split."""
        return np.searchsorted(self.split_row_ids, self.train["row_id"].to_numpy())

    def validator(self, eval_batch_size: int):
        """``validate`` of the training loop for a model that predicts the dataset's labels."""
        return encoded_validator(self.enc_valid, batch_size=eval_batch_size, device=self.device)


def student_data(params: dict, data_dir: Path, attn: str | None = None) -> StudentData:
    """Read the splits (the rows of ``params["domain"]`` only, when set), build the student (``params["model"]``)
    and tokenise train and validation its way (a BiLSTM tokenises the two sides of a pair apart)."""
    labels = read_labels(data_dir)
    domains = dataset_domains(data_dir)
    full_train = read_split(data_dir, "train")
    train, valid = (
        restrict_to_domain(frame, params.get("domain"), domains, "students.<name>.domain")
        for frame in (full_train, read_split(data_dir, "validation"))
    )
    settings = TrainSettings.from_params(params)
    model, tokenizer = build_student(
        params["model"], labels, seed=settings.seed, pairs="text_pair" in train.columns, attn=attn
    )
    separate = getattr(model, "separate_pairs", False)
    encoded = [
        encode_frame(
            tokenizer,
            frame,
            max_length=params["max_length"],
            separate_pairs=separate,
            label_ids=frame["label_id"].to_numpy(),
        )
        for frame in (train, valid)
    ]
    return StudentData(
        labels,
        train,
        valid,
        model,
        tokenizer,
        *encoded,
        settings,
        pick_device(),
        full_train["row_id"].to_numpy(),
        domains,
    )
