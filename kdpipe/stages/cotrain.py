"""The ``cotrain`` stage: ProKT, a student and its teacher trained together (docs/methods.md §5).

Nothing is read from the signal cache. The teacher's step runs inside the student's loss (``kdpipe.methods.prokt``) and
its state is checkpointed with the student's, so a killed job resumes both. Outputs: the student
(``results/students/{student}``) and the co-trained teacher (``results/cotrained/{student}``, the layout of a fine-tuned
teacher).
"""

from __future__ import annotations

from pathlib import Path

from kdpipe.core.store import make_manifest
from kdpipe.data.batching import encode_frame
from kdpipe.evaluation.results import combined_label_use
from kdpipe.methods import prokt
from kdpipe.methods.settings import StudentSettings
from kdpipe.methods.started_labels import start_label_use
from kdpipe.models.loading import load_classifier, load_tokenizer
from kdpipe.training.loop import FitResult, encoded_validator, fit_job, save_trained, total_steps
from kdpipe.training.student import student_data


def run(settings: StudentSettings, data: Path, out: Path, out_teacher: Path) -> dict:
    """Train the ProKT student of ``settings`` (to ``out``) and its teacher (to ``out_teacher``) together."""
    args = prokt.checked_args(settings.method_args)
    job = student_data(data, settings)
    device, labels, training = job.device, job.labels, job.settings

    teacher_tokenizer = load_tokenizer(args.backbone)
    teacher_train, teacher_valid = (
        encode_frame(teacher_tokenizer, frame, max_length=settings.max_length, label_ids=frame["label_id"].to_numpy())
        for frame in (job.train, job.valid)
    )
    teacher = load_classifier(args.backbone, labels, seed=training.seed)
    prokt.zero_classifier(teacher)
    prokt.zero_classifier(job.model)
    cotrained = prokt.CoTrainedTeacher(
        teacher, teacher_train, args, training, total_steps(len(job.enc_train), training), device
    )

    validate_student = job.validator(settings.eval_batch_size)
    validate_teacher = encoded_validator(teacher_valid, batch_size=settings.eval_batch_size, device=device)

    def validate(student):
        metrics = validate_student(student)
        teacher_metrics = validate_teacher(cotrained.model)
        cotrained.observe(teacher_metrics, epoch=len(cotrained.history) + 1)
        return {**metrics, "teacher_accuracy": teacher_metrics["accuracy"]}

    result = fit_job(
        job.model,
        prokt.build(cotrained),
        job.enc_train,
        validate,
        training,
        device,
        out_dir=out,
        job=settings,
        desc="student (prokt)",
    )
    rows = {"train": len(job.train), "validation": len(job.valid)}
    # what the models they start from read; the student's job trains the teacher too, so it records both
    teacher_start = start_label_use(args.backbone)
    init = settings.model.init_from
    student_start = combined_label_use([{"gold_labels": teacher_start}, {"gold_labels": start_label_use(init)}])
    teacher_result = FitResult(
        best_state=cotrained.best_state,
        best_metrics=cotrained.best_metrics,
        best_epoch=cotrained.best_epoch,
        history=cotrained.history,
        train_time_s=result.train_time_s,
        read_train_labels=result.read_train_labels,  # its loss ran inside the student's steps, on the same batches
        validated=bool(cotrained.history),  # its kept epoch is chosen on the validation labels too
    )
    save_trained(
        out_teacher,
        cotrained.model,
        teacher_tokenizer,
        labels,
        teacher_result,
        make_manifest(
            "teacher",
            config=settings,
            labels=labels,
            method="prokt",
            cotrained_with=str(out),
            tokenizer=args.backbone,
            rows=rows,
            gold_labels=teacher_start,
        ),
    )
    manifest = make_manifest(
        "student",
        config=settings,
        labels=labels,
        method="prokt",
        teachers=[],
        tokenizer=settings.model.to_dict(),
        rows=rows,
        gold_labels=student_start,
    )
    save_trained(out, job.model, job.tokenizer, labels, result, manifest)
    return manifest
