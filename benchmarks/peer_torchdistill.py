"""One student trained with torchdistill, set up as its Hugging Face text-classification example sets it up: a
``DistillationBox`` built from a training configuration (data loaders, teacher and student forward processes, a
registered loss inside ``WeightedSumLoss``, an optimiser and a step-wise linear schedule), an epoch loop of
``forward_process`` / ``post_forward_process``, validation accuracy after each epoch and the best epoch saved.

torchdistill has one teacher slot, so the teachers of a student are one module that runs them all
(``peer_online.OnlineTeachers``); the registered loss takes the method's loss from its output (``peer_online``:
kdpipe's loss functions, so the objective is the same as kdpipe's). DFA's adapters are a module of the student
wrapper, trained at their own rate through a registered optimiser factory, as torchdistill's examples register
their optimisers.

torchdistill needs torchvision, which needs its own torch, so this runs in an environment of its own (the
docstring of ``peers.py`` says how to make it):

    python peer_torchdistill.py --params JSON --workdir WORKDIR --out DIR [--max-steps K] [--mc-samples 16]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import RandomSampler, SequentialSampler
from torchdistill.common.main_util import set_seed
from torchdistill.core.distillation import get_distillation_box
from torchdistill.core.interfaces.registry import register_forward_proc_func
from torchdistill.datasets.registry import register_collate_func
from torchdistill.losses.registry import register_mid_level_loss
from torchdistill.optim.registry import register_optimizer, register_scheduler
from transformers import DataCollatorWithPadding, get_linear_schedule_with_warmup

sys.path.insert(0, str(Path(__file__).parent))
from peer_online import Clock, Job, MethodLoss, param_groups  # noqa: E402

register_scheduler(get_linear_schedule_with_warmup)
MODEL_INPUTS = ("input_ids", "attention_mask")


class Student(nn.Module):
    """The student with the modules its loss trains beside it (DFA's adapters), so that the box optimises both."""

    def __init__(self, model: nn.Module, adapters: nn.Module | None):
        super().__init__()
        self.model = model
        self.adapters = adapters


class Teachers(nn.Module):
    """torchdistill's one teacher: every teacher of the student, and the batch's mask and row ids for the loss."""

    def __init__(self, online):
        super().__init__()
        self.online = online

    def forward(self, batch: dict) -> dict:
        out = self.online(batch["input_ids"], batch["attention_mask"])
        return {**out, "attention_mask": batch["attention_mask"], "row_id": batch["row_id"]}


@register_forward_proc_func
def peer_student_forward(model, sample_batch, targets=None, supp_dict=None):
    return model.model(**{k: sample_batch[k] for k in MODEL_INPUTS}, output_hidden_states=True)


@register_forward_proc_func
def peer_teacher_forward(model, sample_batch, targets=None, supp_dict=None):
    return model(sample_batch)


@register_mid_level_loss
class PeerMethodLoss(nn.Module):
    """The method's loss from the io dicts' whole-model outputs (path ``.``)."""

    def __init__(self, method_loss: MethodLoss, **kwargs):
        super().__init__()
        self.method_loss = method_loss

    def forward(self, student_io_dict, teacher_io_dict, targets=None, *args, **kwargs):
        teachers = teacher_io_dict["."]["output"]
        return self.method_loss(
            student_io_dict["."]["output"], teachers, teachers["attention_mask"], teachers["row_id"]
        )


@register_optimizer
def adamw_kdpipe_groups(modules, lr, weight_decay, adapter_lr=0.0, **kwargs):
    """AdamW with kdpipe's parameter groups (and DFA's adapters at their own rate); the box passes the modules to
    train as a list: the student alone (its teacher is frozen)."""
    (student,) = modules
    return torch.optim.AdamW(param_groups(student.model, lr, weight_decay, student.adapters, adapter_lr), lr=lr)


@torch.inference_mode()
def accuracy(model: nn.Module, loader) -> float:
    model.eval()
    right = total = 0
    for batch in loader:
        logits = model(**{k: batch[k] for k in MODEL_INPUTS}).logits
        right += int((logits.argmax(-1) == batch["labels"]).sum())
        total += len(batch["labels"])
    return right / total


def main() -> None:
    args, job = Job.from_command_line(__doc__)
    settings = job.params
    set_seed(settings["seed"])
    model, online = job.student(), job.teachers()
    loss_fn = MethodLoss(job, online, model.config)
    student = Student(model, loss_fn.amalgamator)
    datasets = {"train": job.encode("train"), "validation": job.encode("validation")}
    register_collate_func(DataCollatorWithPadding(job.tokenizer), key="DataCollatorWithPadding")
    epoch_steps = int(np.ceil(len(datasets["train"]) / settings["batch_size"]))
    steps = args.max_steps or epoch_steps * settings["epochs"]

    def loader(split: str, sampler, batch_size: int) -> dict:
        return {
            "dataset_id": split,
            "sampler": {"class_or_func": sampler, "kwargs": {}},
            "kwargs": {"batch_size": batch_size, "num_workers": 0, "drop_last": False},
            "collate_fn": "DataCollatorWithPadding",
            "requires_supp": False,
        }

    train_config = {
        "num_epochs": settings["epochs"],
        "train_data_loader": loader("train", RandomSampler, settings["batch_size"]),
        "val_data_loader": loader("validation", SequentialSampler, 64),
        "teacher": {"forward_proc": "peer_teacher_forward", "requires_grad": False},
        "student": {"forward_proc": "peer_student_forward", "requires_grad": True},
        "optimizer": {
            "key": "adamw_kdpipe_groups",
            "kwargs": {
                "lr": settings["lr"],
                "weight_decay": settings["weight_decay"],
                "adapter_lr": job.args.get("adapter_lr", 0.0),
            },
            "filters_params": False,
            "max_grad_norm": settings["max_grad_norm"],
        },
        "scheduler": {
            "key": "get_linear_schedule_with_warmup",
            "kwargs": {"num_warmup_steps": int(settings["warmup_ratio"] * steps), "num_training_steps": steps},
            "scheduling_step": 1,
        },
        "criterion": {
            "key": "WeightedSumLoss",
            "kwargs": {
                "sub_terms": {
                    "kd": {"criterion": {"key": "PeerMethodLoss", "kwargs": {"method_loss": loss_fn}}, "weight": 1.0}
                }
            },
        },  # fmt: skip
    }
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    box = get_distillation_box(Teachers(online), student, datasets, train_config, device, None, False, 1)
    clock, best = Clock(), -1.0
    for epoch in range(box.num_epochs):
        box.pre_epoch_process(epoch=epoch)
        clock.start()
        done = 0
        for batch in box.train_data_loader:
            loss = box.forward_process({k: v.to(device) for k, v in batch.items()}, targets=None, supp_dict=None)
            box.post_forward_process(loss=loss)
            done += 1
            if args.max_steps and done >= args.max_steps:
                break
        clock.stop(done)
        if args.max_steps:
            break
        score = accuracy(model, box.val_data_loader)
        if score > best:  # the example saves the student whenever validation improves
            best = score
            job.save(model, clock.timing(epoch_steps=epoch_steps))
        box.post_epoch_process()
    if args.max_steps:
        job.save(model, clock.timing(epoch_steps=epoch_steps))
    else:  # the saved (best) student, with the whole run's training time
        job.save(model.from_pretrained(args.out), clock.timing(epoch_steps=epoch_steps))
    loss_fn.save_recorded(args.out / "certainty.npz")


if __name__ == "__main__":
    main()
