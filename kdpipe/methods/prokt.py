"""ProKT: a teacher trained jointly with the student (docs/methods.md §5).

The teacher starts from the *pre-trained* backbone and takes one step per student step towards the task and the
student's current prediction; the student learns the updated teacher's prediction (so its teacher signals cannot be
cached: docs/methods.md §6). The teacher reads the batch in its own tokenisation of the train split, so a student
with another tokenisation (a BiLSTM) works too.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from kdpipe.core.settings import Args
from kdpipe.core.store import KdpipeError
from kdpipe.data.batching import Encoded, collate, model_inputs
from kdpipe.methods.base import Objective, student_logits
from kdpipe.methods.losses import kl_divergence, soft_kl
from kdpipe.training import distributed
from kdpipe.training.loop import TrainSettings, is_better, make_optimizer, state_on_cpu


def _ce_and_kl(
    teacher_logits: torch.Tensor, labels: torch.Tensor, student_probs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """CE(z_T, y) and KL(p_S ‖ softmax(z_T)), batch means: the two terms of both teacher objectives."""
    ce = F.cross_entropy(teacher_logits.float(), labels)
    return ce, kl_divergence(student_probs, F.log_softmax(teacher_logits.float(), -1)).mean()


def teacher_loss(
    teacher_logits: torch.Tensor, labels: torch.Tensor, student_probs: torch.Tensor, move_back_weight: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(1 − λ)·CE(z_T, y) + λ·KL(p_S ‖ softmax(z_T)), batch means (§5 step 2); returns (loss, CE, KL)."""
    ce, kl = _ce_and_kl(teacher_logits, labels, student_probs)
    return (1 - move_back_weight) * ce + move_back_weight * kl, ce, kl


def dual_teacher_loss(
    teacher_logits: torch.Tensor, labels: torch.Tensor, student_probs: torch.Tensor, beta: float, epsilon: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The dual variant, CE + β·(KL − ε) (§5, ``--dual_optimization``); returns (loss, CE, KL)."""
    ce, kl = _ce_and_kl(teacher_logits, labels, student_probs)
    return ce + beta * (kl - epsilon), ce, kl


def updated_multiplier(beta: float, kl: float, epsilon: float, eta: float) -> float:
    """β ← max(0, β + η·(KL − ε)), after each teacher step of the dual variant (§5)."""
    return max(0.0, beta + eta * (kl - epsilon))


def student_loss(student_logits_: torch.Tensor, teacher_probs: torch.Tensor) -> torch.Tensor:
    """KL(p_T ‖ softmax(z_S)), batch mean (§5 step 4)."""
    return soft_kl(teacher_probs, student_logits_, 1.0).mean()


def zero_classifier(model: nn.Module) -> None:
    """Zero the final classification layer (weight and bias), as ProKT initialises both models' heads."""
    head = getattr(model, "classifier", None)
    if not isinstance(head, nn.Linear):
        raise KdpipeError(f"ProKT: cannot find the classifier layer of {type(model).__name__} to zero it")
    with torch.no_grad():
        head.weight.zero_()
        if head.bias is not None:
            head.bias.zero_()


def checked_args(args: Args) -> Args:
    """The complete method_args, with the value checks no type declaration expresses."""
    if not 0 <= float(args.move_back_weight) <= 1:
        raise KdpipeError(f"prokt: move_back_weight must be in [0, 1], got {args.move_back_weight}")
    if not 0 <= float(args.teacher_warmup) <= 1:
        raise KdpipeError(f"prokt: teacher_warmup must be in [0, 1], got {args.teacher_warmup}")
    if not float(args.teacher_weight_decay) >= 0:
        raise KdpipeError(f"prokt: teacher_weight_decay must be non-negative, got {args.teacher_weight_decay}")
    return args


_STATEFUL = ("model", "optimizer", "scheduler")  # what CoTrainedTeacher checkpoints by state_dict, then as it is:
_KEPT = ("beta", "best_score", "best_metrics", "best_epoch", "history", "best_state")


class CoTrainedTeacher:
    """The teacher side of ProKT: its model, optimiser, schedule and dual multiplier, stepped inside the student's
    loss, and its best validation state; checkpointed with the student (the loop's ``extra_state``)."""

    def __init__(
        self,
        teacher: nn.Module,
        encoded: Encoded,
        args: Args,
        settings: TrainSettings,
        steps: int,
        device: torch.device,
    ):
        self.model, self.encoded, self.args, self.device = teacher.to(device), encoded, args, device
        # the student's settings but the teacher's own lr, warm-up and weight decay (the release: Trainer defaults)
        lr, warmup, decay = float(args.teacher_lr), float(args.teacher_warmup), float(args.teacher_weight_decay)
        self.settings = replace(settings, lr=lr, warmup_ratio=warmup, weight_decay=decay)
        self.optimizer, self.scheduler = make_optimizer({"teacher": (self.model, lr)}, self.settings, steps)
        self.beta = float(args.beta)
        self.best_score, self.best_metrics, self.best_epoch, self.history = -float("inf"), {}, -1, []
        self.best_state = state_on_cpu(self.model)

    def step(self, student: nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
        """Steps 1-3: the teacher's update towards the current student; returns p_T of the updated teacher."""
        was_training = student.training
        student.eval()
        with torch.no_grad():
            p_student = torch.softmax(student_logits(student, batch).float(), -1)
        student.train(was_training)
        inputs = model_inputs(collate(self.encoded, batch["index"].cpu().numpy(), self.device))
        self.model.train()
        logits = self.model(**inputs).logits
        if self.args.dual:
            loss, ce, kl = dual_teacher_loss(logits, batch["labels"], p_student, self.beta, float(self.args.epsilon))
        else:
            loss, ce, kl = teacher_loss(logits, batch["labels"], p_student, float(self.args.move_back_weight))
        self.optimizer.zero_grad(set_to_none=True)
        # (over several processes: the gradient and the KL of the global batch, so every copy takes the same step)
        loss_value = distributed.sync_backward(loss, list(self.model.parameters()))
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        kl_value = distributed.mean(kl.item())
        terms = {"teacher_loss": loss_value, "teacher_ce": ce.item(), "teacher_kl": kl_value}
        if self.args.dual:
            self.beta = updated_multiplier(self.beta, kl_value, float(self.args.epsilon), float(self.args.eta))
            terms["beta"] = self.beta
        self.model.eval()
        with torch.no_grad():
            p_teacher = torch.softmax(self.model(**inputs).logits.float(), -1)
        return p_teacher, terms

    def observe(self, metrics: dict, epoch: int) -> None:
        """After each validation: keep the teacher's best state (:func:`kdpipe.training.loop.is_better`)."""
        self.history.append({"epoch": epoch, "validation": metrics})
        if is_better(metrics, self.best_score, self.best_metrics):
            self.best_score, self.best_metrics, self.best_epoch = metrics["score"], metrics, epoch
            self.best_state = state_on_cpu(self.model)

    def state_dict(self) -> dict:
        return {name: getattr(self, name).state_dict() for name in _STATEFUL} | {n: getattr(self, n) for n in _KEPT}

    def load_state_dict(self, state: dict) -> None:
        for name in _STATEFUL:
            getattr(self, name).load_state_dict(state[name])
        for name in _KEPT:
            setattr(self, name, state[name])


def build(cotrained: CoTrainedTeacher) -> Objective:
    """The student's objective: one teacher step, then KL(p_T ‖ p_S) on the same batch (§5 step 4)."""

    def loss(model, batch):
        p_teacher, terms = cotrained.step(model, batch)
        kd = student_loss(student_logits(model, batch), p_teacher)
        return kd, {"kd": kd.item(), **terms}

    return Objective(loss=loss, extra_state=cotrained)
