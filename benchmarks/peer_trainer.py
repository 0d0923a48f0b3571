"""One student trained the way most users distil with Hugging Face: a ``Trainer`` subclass whose ``compute_loss``
runs the teachers online (``peer_online.py``), validation accuracy after each epoch, the best epoch's weights kept.

Run by ``peers.py`` in an environment that has ``accelerate`` (the ``Trainer`` needs it; kdpipe does not):

    python peer_trainer.py --params JSON --workdir WORKDIR --out DIR [--max-steps K] [--mc-samples 16]

With ``--max-steps K`` it trains K steps only, without validation, to time a step (``timing.json``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from transformers import (
    DataCollatorWithPadding,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    get_linear_schedule_with_warmup,
)

sys.path.insert(0, str(Path(__file__).parent))
from peer_online import Clock, Job, MethodLoss, param_groups  # noqa: E402


class ClipAll(TrainerCallback):
    """Clips the gradients of everything the optimiser trains (the student and DFA's adapters) together to
    ``max_grad_norm``, as kdpipe's loop and torchdistill do. The ``Trainer``'s own clipping sees only the model's
    parameters: DFA's adapters, which live outside the student, would be left out of the norm and the student's
    gradients clipped alone, another optimisation than the other tools'."""

    def __init__(self, max_grad_norm: float):
        self.max_grad_norm = max_grad_norm

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        params = [p for group in optimizer.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)


class StepClock(TrainerCallback):
    """Times the training steps only (validation and checkpointing are outside the clock)."""

    def __init__(self, clock: Clock):
        self.clock = clock

    def on_step_begin(self, args, state, control, **kwargs):
        self.clock.start()

    def on_step_end(self, args, state, control, **kwargs):
        self.clock.stop(1)


def main() -> None:
    args, job = Job.from_command_line(__doc__)
    settings = job.params
    student, teachers = job.student(), job.teachers()
    loss_fn = MethodLoss(job, teachers, student.config)

    class OnlineKDTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            inputs = dict(inputs)
            row_ids, labels = inputs.pop("row_id"), inputs.pop("labels")
            # hidden states only for a training step's loss: in validation they would become predictions too
            outputs = model(**inputs, output_hidden_states=loss_fn.needs_hidden and model.training)
            mask = inputs["attention_mask"]
            if model.training:
                loss = loss_fn(outputs, teachers(inputs["input_ids"], mask), mask, row_ids)
            else:  # validation: the teachers are not needed for the accuracy
                loss = torch.nn.functional.cross_entropy(outputs.logits, labels)
            return (loss, outputs) if return_outputs else loss

    train = job.encode("train")
    steps = args.max_steps or int(np.ceil(len(train) / settings["batch_size"])) * settings["epochs"]
    adapters = loss_fn.amalgamator
    optimizer = torch.optim.AdamW(
        param_groups(student, settings["lr"], settings["weight_decay"], adapters, job.args.get("adapter_lr", 0.0)),
        lr=settings["lr"],
    )
    scheduler = get_linear_schedule_with_warmup(optimizer, int(settings["warmup_ratio"] * steps), steps)
    timed = bool(args.max_steps)
    training = TrainingArguments(
        output_dir=str(args.out) + ".checkpoints",
        num_train_epochs=settings["epochs"],
        max_steps=args.max_steps or -1,
        per_device_train_batch_size=settings["batch_size"],
        per_device_eval_batch_size=64,
        max_grad_norm=0.0,  # clipped by ClipAll, over the student and the adapters together
        seed=settings["seed"],
        eval_strategy="no" if timed else "epoch",
        save_strategy="no" if timed else "epoch",
        load_best_model_at_end=not timed,
        metric_for_best_model="accuracy",
        save_total_limit=1,
        label_names=["labels"],
        remove_unused_columns=False,  # the loss needs the row ids (MUKI's check)
        report_to=[],
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),
    )
    teachers.to(training.device)
    if adapters is not None:
        adapters.to(training.device)
    clock = Clock()
    trainer = OnlineKDTrainer(
        model=student,
        args=training,
        train_dataset=train,
        eval_dataset=job.encode("validation"),
        data_collator=DataCollatorWithPadding(job.tokenizer),
        compute_metrics=lambda pred: {"accuracy": float((np.argmax(pred.predictions, -1) == pred.label_ids).mean())},
        optimizers=(optimizer, scheduler),
        callbacks=[ClipAll(settings["max_grad_norm"]), StepClock(clock)],
    )
    trainer.train()
    job.save(trainer.model, clock.timing(epoch_steps=int(np.ceil(len(train) / settings["batch_size"]))))
    loss_fn.save_recorded(args.out / "certainty.npz")


if __name__ == "__main__":
    main()
