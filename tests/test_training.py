"""The shared training loop: it learns, keeps the best epoch, and resumes exactly after an interruption."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kdpipe.core.store import ArtifactError, read_json
from kdpipe.data.batching import encode, model_inputs
from kdpipe.models.loading import load_classifier, load_tokenizer
from kdpipe.training.checkpoint import Checkpoint
from kdpipe.training.loop import TrainSettings, fit

CPU = torch.device("cpu")
TEXTS = [f"{w} story number {i}" for i in range(24) for w in ("sport", "money")][:32]
LABELS = [0 if t.startswith("sport") else 1 for t in TEXTS]


@pytest.fixture(scope="module")
def data():
    return encode(load_tokenizer("builtin:tiny-bert"), TEXTS, max_length=16, labels=LABELS)


def ce_loss(model, batch):
    return F.cross_entropy(model(**model_inputs(batch)).logits, batch["labels"]), {}


def read_resume_state(resume_dir) -> dict | None:
    """The training state of the latest checkpoint in ``resume_dir`` (None when there is none), as a test watches a
    job's progress: safe to call while the job trains and replaces it."""
    checkpoint = Checkpoint(resume_dir, "")
    while (current := checkpoint.current()) is not None:
        try:
            return read_json(current / "state.json")
        except ArtifactError:
            if checkpoint.current() == current:  # not replaced by a newer checkpoint: really missing
                raise
    return None


def validator(data):
    def validate(model):
        with torch.no_grad():
            from kdpipe.data.batching import collate

            batch = collate(data, np.arange(len(data)))
            acc = (model(**model_inputs(batch)).logits.argmax(1) == batch["labels"]).float().mean().item()
        return {"score": acc, "accuracy": acc}

    return validate


SETTINGS = dict(epochs=4, lr=1e-2, batch_size=8, seed=0, checkpoint_every=3, log_every=1)


def test_fit_learns_and_logs(data, tmp_path):
    model = load_classifier("builtin:tiny-bert", ["sport", "money"], seed=0)
    log = tmp_path / "log.jsonl"
    result = fit(
        model,
        train=data,
        loss_fn=ce_loss,
        validate=validator(data),
        settings=TrainSettings(**SETTINGS),
        device=CPU,
        log_path=log,
    )
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["epoch"] for r in records if "validation" in r] == [1, 2, 3, 4]
    assert result.best_metrics["accuracy"] > 0.5
    losses = [r["loss"] for r in records if "loss" in r]
    assert losses[-1] < losses[0]


class Interrupted(Exception):
    pass


def test_resume_after_interruption_gives_the_uninterrupted_result(data, tmp_path):
    settings = TrainSettings(**SETTINGS)
    straight = load_classifier("builtin:tiny-bert", ["sport", "money"], seed=0)
    expected = fit(straight, train=data, loss_fn=ce_loss, validate=validator(data), settings=settings, device=CPU)

    calls = {"n": 0}

    def dying_loss(model, batch):
        calls["n"] += 1
        if calls["n"] == 8:  # 4 steps per epoch: the 4th step of epoch 2, after its step-3 checkpoint
            raise Interrupted
        return ce_loss(model, batch)

    resume = tmp_path / "resume"
    first = load_classifier("builtin:tiny-bert", ["sport", "money"], seed=0)
    with pytest.raises(Interrupted):
        fit(
            first,
            train=data,
            loss_fn=dying_loss,
            validate=validator(data),
            settings=settings,
            device=CPU,
            resume_dir=resume,
            resume_key="k",
        )
    state = read_resume_state(resume)
    assert (state["epoch"], state["step_in_epoch"]) == (1, 3)  # 0-based epoch 1, 3 steps done

    second = load_classifier("builtin:tiny-bert", ["sport", "money"], seed=123)  # different init: must be replaced
    resumed = fit(
        second,
        train=data,
        loss_fn=ce_loss,
        validate=validator(data),
        settings=settings,
        device=CPU,
        resume_dir=resume,
        resume_key="k",
    )
    for name, tensor in expected.best_state.items():
        torch.testing.assert_close(resumed.best_state[name], tensor, rtol=1e-5, atol=1e-6)
    assert resumed.best_epoch == expected.best_epoch


def test_a_resumed_log_has_each_record_once(data, tmp_path, monkeypatch):
    """Killed after epoch 2's log line but before its checkpoint (the save fails), the rerun repeats epoch 2's steps:
    the log is cut back to the checkpoint it resumes from, so every step and epoch appears once."""
    from kdpipe.training import checkpoint

    settings = TrainSettings(**{**SETTINGS, "checkpoint_every": 0})
    resume, log = tmp_path / "resume", tmp_path / "log.jsonl"
    log.write_text('{"stale": "a line of an attempt killed before its first checkpoint"}\n')
    real_save, saves = checkpoint.Checkpoint.save, {"n": 0}

    def dying_save(self, *args, **kwargs):
        saves["n"] += 1
        if saves["n"] == 2:  # the checkpoint at the end of epoch 2
            raise Interrupted
        return real_save(self, *args, **kwargs)

    monkeypatch.setattr(checkpoint.Checkpoint, "save", dying_save)
    run = dict(train=data, loss_fn=ce_loss, validate=validator(data), settings=settings, device=CPU)
    with pytest.raises(Interrupted):
        fit(load_classifier("builtin:tiny-bert", ["sport", "money"], seed=0), **run, log_path=log,
            resume_dir=resume, resume_key="k")  # fmt: skip
    assert sum('"validation"' in line for line in log.read_text().splitlines()) == 2  # epochs 1 and 2 logged
    monkeypatch.setattr(checkpoint.Checkpoint, "save", real_save)
    fit(load_classifier("builtin:tiny-bert", ["sport", "money"], seed=0), **run, log_path=log, resume_dir=resume,
        resume_key="k")  # fmt: skip
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert "stale" not in records[0]
    assert [r["epoch"] for r in records if "validation" in r] == [1, 2, 3, 4]
    steps = [(r["epoch"], r["step"]) for r in records if "step" in r]
    assert len(steps) == len(set(steps)) == 4 * 4  # 32 rows in batches of 8, log_every 1


def test_resume_state_of_another_configuration_is_discarded(data, tmp_path):
    settings = TrainSettings(**{**SETTINGS, "epochs": 1})
    resume = tmp_path / "resume"
    model = load_classifier("builtin:tiny-bert", ["sport", "money"], seed=0)
    fit(
        model,
        train=data,
        loss_fn=ce_loss,
        validate=validator(data),
        settings=settings,
        device=CPU,
        resume_dir=resume,
        resume_key="old",
    )
    assert read_resume_state(resume)["epoch"] == 1
    model = load_classifier("builtin:tiny-bert", ["sport", "money"], seed=0)
    result = fit(
        model,
        train=data,
        loss_fn=ce_loss,
        validate=validator(data),
        settings=settings,
        device=CPU,
        resume_dir=resume,
        resume_key="new",
    )
    assert len(result.history) == 1  # trained its epoch from scratch instead of finding a finished run


def test_without_validation_the_last_epoch_is_kept(data):
    model = load_classifier("builtin:tiny-bert", ["sport", "money"], seed=0)
    result = fit(model, train=data, loss_fn=ce_loss, validate=None, settings=TrainSettings(**SETTINGS), device=CPU)
    assert result.best_epoch == 4 and [r["validation"] for r in result.history] == [None] * 4
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(result.best_state[name], tensor)


def test_extra_modules_keep_the_state_of_the_best_epoch(data):
    """Epoch 2 validates best: the extra module's saved state is its state after epoch 2, not after the last one."""
    model = load_classifier("builtin:tiny-bert", ["sport", "money"], seed=0)
    extra = torch.nn.Linear(2, 2)
    scores = iter([0.5, 0.9, 0.1, 0.2])
    after_epoch = {}

    def loss(model, batch):
        ce, _ = ce_loss(model, batch)
        return ce + extra(model(**model_inputs(batch)).logits).pow(2).mean(), {}

    def snapshot(epoch, epochs):
        after_epoch[epoch] = {k: v.clone() for k, v in extra.state_dict().items()}  # = end of epoch `epoch`

    result = fit(
        model,
        train=data,
        loss_fn=loss,
        validate=lambda m: {"score": next(scores)},
        settings=TrainSettings(**SETTINGS),
        device=CPU,
        extra_modules={"extra": (extra, None)},
        on_epoch=snapshot,
    )
    assert result.best_epoch == 2
    for name, tensor in after_epoch[2].items():
        torch.testing.assert_close(result.best_modules["extra"][name], tensor)
    assert not torch.equal(result.best_modules["extra"]["weight"], extra.weight.detach())


def fit_with_scores(data, validations):
    """``fit`` over 4 epochs whose validation returns ``validations`` in turn."""
    model = load_classifier("builtin:tiny-bert", ["sport", "money"], seed=0)
    given = iter(validations)
    return fit(
        model,
        train=data,
        loss_fn=ce_loss,
        validate=lambda m: dict(next(given)),
        settings=TrainSettings(**SETTINGS),
        device=CPU,
    )


def test_a_tie_on_the_score_goes_to_the_lower_nll(data):
    """Equal accuracy and a decreasing NLL: each later epoch replaces the kept one."""
    scores = [{"score": 0.75, "accuracy": 0.75, "nll": nll} for nll in (0.9, 0.8, 0.7, 0.6)]
    result = fit_with_scores(data, scores)
    assert result.best_epoch == 4 and result.best_metrics["nll"] == 0.6
    assert [r["best"] for r in result.history] == [True, True, True, True]


def test_a_tie_on_the_score_with_a_higher_nll_keeps_the_earlier_epoch(data):
    scores = [
        {"score": 0.5, "accuracy": 0.5, "nll": 0.9},
        {"score": 0.75, "accuracy": 0.75, "nll": 0.5},
        {"score": 0.75, "accuracy": 0.75, "nll": 0.6},  # tie, worse NLL
        {"score": 0.75, "accuracy": 0.75, "nll": 0.5},  # tie, equal NLL: not better either
    ]
    result = fit_with_scores(data, scores)
    assert result.best_epoch == 2 and result.best_metrics["nll"] == 0.5
    assert [r["best"] for r in result.history] == [True, True, False, False]


def test_a_higher_score_wins_whatever_its_nll_and_ties_without_nll_keep_the_first(data):
    scores = [{"score": 0.5, "nll": 0.1}, {"score": 0.75, "nll": 2.0}, {"score": 0.75}, {"score": 0.5, "nll": 0.01}]
    assert fit_with_scores(data, scores).best_epoch == 2


def test_the_nll_tie_break_survives_a_resume(data, tmp_path):
    """The kept NLL is part of the checkpointed state: after a resume, a tie is still judged against it."""
    scores = [{"score": 0.75, "nll": 0.5}, {"score": 0.75, "nll": 0.6}, {"score": 0.75, "nll": 0.4}]
    settings = TrainSettings(**{**SETTINGS, "epochs": 3, "checkpoint_every": 0})
    given = iter(scores)
    calls = {"n": 0}

    def dying_loss(model, batch):
        calls["n"] += 1
        if calls["n"] == 9:  # 4 steps per epoch: the first step of epoch 3, after two epochs were checkpointed
            raise Interrupted
        return ce_loss(model, batch)

    def run(loss):
        return fit(
            load_classifier("builtin:tiny-bert", ["sport", "money"], seed=0),
            train=data,
            loss_fn=loss,
            validate=lambda m: dict(next(given)),
            settings=settings,
            device=CPU,
            resume_dir=tmp_path / "resume",
            resume_key="k",
        )

    with pytest.raises(Interrupted):
        run(dying_loss)
    state = read_resume_state(tmp_path / "resume")
    assert state["best_epoch"] == 1 and state["best_metrics"]["nll"] == 0.5
    result = run(ce_loss)
    assert result.best_epoch == 3 and [r["best"] for r in result.history] == [True, False, True]


def test_resume_state_read_while_a_job_replaces_its_checkpoint(tmp_path, monkeypatch):
    """A job writes checkpoint 11 and removes checkpoint 9 between the reader's look at LATEST and its read of
    checkpoint 9's state: the reader follows LATEST to checkpoint 11. A state missing from the checkpoint that LATEST
    still names is an error."""
    from kdpipe.core.store import ArtifactError, read_json

    resume = tmp_path / "resume"
    for step in (9, 11):
        (resume / f"ckpt-{step:06d}").mkdir(parents=True)
        (resume / f"ckpt-{step:06d}" / "state.json").write_text(json.dumps({"step": step}))
    (resume / "LATEST").write_text("ckpt-000009")

    def job_moves_on_first(path):
        if (resume / "ckpt-000009").exists():
            (resume / "LATEST").write_text("ckpt-000011")
            (resume / "ckpt-000009" / "state.json").unlink()
            (resume / "ckpt-000009").rmdir()
        return read_json(path)

    monkeypatch.setitem(globals(), "read_json", job_moves_on_first)  # (read_resume_state, above, reads by it)
    assert read_resume_state(resume) == {"step": 11}
    (resume / "ckpt-000011" / "state.json").unlink()
    with pytest.raises(ArtifactError, match="ckpt-000011/state.json"):
        read_resume_state(resume)


def test_tokenising_in_chunks_gives_the_ids_of_one_call(monkeypatch):
    """encode tokenises a split a few rows at a time (bounded memory): the ids and token types are those of one
    tokenizer call over all rows, pairs included."""
    from kdpipe.data import batching

    tokenizer = load_tokenizer("builtin:tiny-bert")
    texts, pairs = TEXTS[:7], [f"pair {i}" for i in range(7)]
    whole = tokenizer(texts, pairs, truncation=True, max_length=16, padding=False)
    monkeypatch.setattr(batching, "TOKENIZE_CHUNK", 3)
    encoded = encode(tokenizer, texts, pairs, max_length=16)
    assert [x.tolist() for x in encoded.input_ids] == whole["input_ids"]
    assert [x.tolist() for x in encoded.token_type_ids] == whole["token_type_ids"]
    assert len(encode(tokenizer, [], max_length=16).input_ids) == 0


def test_the_loop_measures_which_gold_labels_a_model_read(data, tmp_path):
    """A loss that reads the batches' labels marks the model as trained on them (also across a resume); one that
    does not leaves them unread; validation marks the validation labels; the saved manifest says both."""
    from kdpipe.training.loop import FitResult, label_use

    settings = TrainSettings(**SETTINGS)

    def label_free(model, batch):  # a distillation loss that never looks at the gold labels
        logits = model(**model_inputs(batch)).logits
        return (logits.float() ** 2).mean(), {}

    read = fit(load_classifier("builtin:tiny-bert", ["sport", "money"], seed=0), train=data, loss_fn=ce_loss,
               validate=validator(data), settings=settings, device=CPU)  # fmt: skip
    free = fit(load_classifier("builtin:tiny-bert", ["sport", "money"], seed=0), train=data, loss_fn=label_free,
               validate=None, settings=settings, device=CPU)  # fmt: skip
    assert (read.read_train_labels, read.validated) == (True, True)
    assert (free.read_train_labels, free.validated) == (False, False)
    rows = {"rows": {"train": 16, "validation": 8}}
    assert label_use(rows, read) == {"train": 16, "validation": 8}
    assert label_use(rows, free) == {}
    route = {**rows, "gold_labels": {"validation": 8}}  # a route that read the validation labels
    assert label_use(route, free) == {"validation": 8}
    assert label_use({"gold_labels": {"checkpoint": "trained outside kdpipe"}}, FitResult({}, {}, -1)) == {
        "checkpoint": "trained outside kdpipe"
    }

    calls = {"n": 0}

    def reads_once_then_dies(model, batch):  # the labels read before an interruption still count after a resume
        calls["n"] += 1
        if calls["n"] == 1:
            return ce_loss(model, batch)
        if calls["n"] == 6:
            raise Interrupted
        return label_free(model, batch)

    kwargs = dict(train=data, validate=validator(data), settings=settings, device=CPU, resume_dir=tmp_path / "r",
                  resume_key="k")  # fmt: skip
    with pytest.raises(Interrupted):
        fit(load_classifier("builtin:tiny-bert", ["sport", "money"], seed=0), loss_fn=reads_once_then_dies, **kwargs)
    resumed = fit(load_classifier("builtin:tiny-bert", ["sport", "money"], seed=0), loss_fn=label_free, **kwargs)
    assert resumed.read_train_labels
