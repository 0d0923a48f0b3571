"""Students you can ship (kdpipe/models/export.py, onnx_runtime.py, onnx_model.py, serving.py and
kdpipe/evaluation/exported.py): a trained folder exported to ONNX and quantised to int8, each checked against the
model it comes from; an exported folder evaluated and predicted with as any model; the refusal of a model ONNX cannot
trace; serving profiles; the accuracy-drop flag of a quantised model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn
from transformers.modeling_outputs import SequenceClassifierOutput

from kdpipe.cli import main
from kdpipe.core.store import ArtifactError, KdpipeError, read_json, write_json
from kdpipe.data.batching import collate, encode, encode_frame, model_inputs
from kdpipe.data.dataset import read_labels, read_split
from kdpipe.evaluation.exported import accuracy_drop, against_reference, with_reference
from kdpipe.models import export
from kdpipe.models.export import CHECK_TEXTS, export_onnx, flag_card, quantize_int8
from kdpipe.models.inference import predict_logits
from kdpipe.models.loading import check_model_folder, count_parameters, load_tokenizer, load_trained
from kdpipe.models.onnx_runtime import OnnxRunner
from kdpipe.models.serving import peak_rss_mb, profile_in_subprocess, serving_profile
from kdpipe.stages import evaluate, predict
from kdpipe.stages.predict import PredictSettings
from tests.conftest import REPO, eval_settings
from tests.test_predict import KINDS, MAX_LENGTH, saved_student
from tests.tiny_models import tiny_roberta

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def folders(tiny_data, tmp_path_factory):
    """For each kind of student: the trained folder, its ONNX export and the int8 version."""
    root = tmp_path_factory.mktemp("exported")
    labels = read_labels(tiny_data)
    out = {}
    for kind in KINDS:
        student = saved_student(kind, labels, root / "students" / kind)
        export_onnx(student, root / "exported" / f"{kind}.onnx")
        quantize_int8(root / "exported" / f"{kind}.onnx", root / "exported" / f"{kind}.int8")
        out[kind] = {"student": student, "onnx": root / "exported" / f"{kind}.onnx"}
        out[kind]["int8"] = root / "exported" / f"{kind}.int8"
    return out


def split_logits(folder, tiny_data, split="test"):
    """Member logits [M, N, C] of ``folder``'s model on a split, through kdpipe's inference path."""
    model = load_trained(folder)
    frame = read_split(tiny_data, split)
    encoded = encode_frame(
        load_tokenizer(str(folder)),
        frame,
        max_length=MAX_LENGTH,
        separate_pairs=getattr(model, "separate_pairs", False),
    )
    return predict_logits(model, encoded, batch_size=3, device=CPU, members=True)


@pytest.mark.parametrize("kind", KINDS)
def test_the_onnx_graph_gives_pytorchs_logits_at_any_batch_and_length(folders, tiny_data, kind):
    """Batches of 3 rows cut from a split sorted by length: other batch sizes and lengths than the trace's."""
    manifest = read_json(folders[kind]["onnx"] / "manifest.json")
    assert manifest["kind"] == "onnx" and manifest["check"]["max_abs_logit_diff"] < 1e-4
    assert manifest["check"]["rows"] == 2 * len(CHECK_TEXTS) and manifest["check"]["same_prediction"] == 1.0
    torch_logits = split_logits(folders[kind]["student"], tiny_data)
    onnx_logits = split_logits(folders[kind]["onnx"], tiny_data)
    assert onnx_logits.shape == torch_logits.shape
    assert np.abs(onnx_logits - torch_logits).max() < 1e-5
    spec = read_json(folders[kind]["onnx"] / "onnx.json")
    if kind == "multihead":  # every head's logits: [2 heads, N, 5 classes]
        assert spec["outputs"] == ["logits", "head_logits"] and spec["heads"] == 2 and onnx_logits.shape[0] == 2
    else:
        assert spec["outputs"] == ["logits"] and spec["heads"] is None
    assert spec["max_length"] == MAX_LENGTH and spec["opset"] == 17


@pytest.mark.parametrize("kind", KINDS)
def test_int8_is_close_to_fp32_and_smaller(folders, tiny_data, kind):
    fp32 = split_logits(folders[kind]["onnx"], tiny_data)
    int8 = split_logits(folders[kind]["int8"], tiny_data)
    scale = np.abs(fp32).max()
    assert 0 < np.abs(int8 - fp32).max() < 0.05 * max(scale, 1.0)  # int8 differs, but a little
    manifest = read_json(folders[kind]["int8"] / "manifest.json")
    assert manifest["check"]["against"] == "onnx fp32" and manifest["check"]["max_abs_logit_diff"] > 0
    size = {v: (folders[kind][v] / "model.onnx").stat().st_size for v in ("onnx", "int8")}
    assert size["int8"] < 0.5 * size["onnx"]
    assert read_json(folders[kind]["int8"] / "onnx.json")["quantisation"]["weights"] == "int8 (QInt8), per tensor"


def test_exported_folders_are_verified_and_carry_the_students_record(folders):
    student = read_json(folders["transformer"]["student"] / "manifest.json")
    for variant in ("onnx", "int8"):
        folder = folders["transformer"][variant]
        manifest = check_model_folder(folder)
        assert manifest["source"] == {"name": "transformer", "kind": "student"}
        assert manifest["labels"] == student["labels"] and manifest["method"] == "vanilla_kd"
        assert manifest["config"]["max_length"] == MAX_LENGTH and manifest["config"]["export"]["opset"] == 17
        assert {"model.onnx", "onnx.json", "tokenizer.json", "labels.json", "config.json"} <= set(manifest["checksums"])
        assert "README.md" not in manifest["checksums"]
        assert count_parameters(load_trained(folder)) == count_parameters(
            load_trained(folders["transformer"]["student"])
        )
    damaged = folders["bilstm"]["onnx"] / "labels.json"
    original = damaged.read_text()
    try:
        damaged.write_text(original.replace("sport", "sports"))
        with pytest.raises(ArtifactError, match="changed since kdpipe wrote it"):
            load_trained(folders["bilstm"]["onnx"])
    finally:
        damaged.write_text(original)


def test_cards_say_what_the_graphs_are(folders):
    card = (folders["multihead"]["int8"] / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: onnx\n")
    assert "The int8 dynamically quantised version of the ONNX export of the student multihead." in card
    assert "method `vanilla_kd` from ta." in card and "- opset: 17" in card
    assert "- exporter: torch.onnx.export (TorchScript-based, dynamo=False)" in card
    assert "weights int8 (QInt8), per tensor; activations uint8" in card
    assert "head_logits [heads, batch, classes]" in card and "its 2 heads' mean probability" in card
    card = (folders["bilstm"]["onnx"] / "README.md").read_text()
    assert "An ONNX export of the student bilstm (fp32)." in card and "- precision: fp32" in card


def test_the_trace_batch_has_padding_whatever_the_check_texts(folders):
    """Texts all longer than max_length tokenise to one length: the fixed check texts still pad the traced batch."""
    tokenizer = load_tokenizer(str(folders["transformer"]["student"]))
    batches = export.check_batches(tokenizer, MAX_LENGTH, ["word " * 50] * 3)
    assert len(batches) == 1 + 3 + len(CHECK_TEXTS)
    assert (batches[0]["attention_mask"] == 0).any() and batches[0]["input_ids"].shape[1] == MAX_LENGTH


class Cumulative(nn.Module):
    """A student with a layer ONNX has no operator for (a running maximum over the classes)."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config = model, model.config

    def forward(self, **inputs):
        return SequenceClassifierOutput(logits=torch.cummax(self.model(**inputs).logits, -1).values)


class PaddingBranch(nn.Module):
    """A student whose Python code branches on whether the batch has padding: the trace (a padded batch) keeps one
    branch for every input."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config = model, model.config

    def forward(self, attention_mask, **inputs):
        logits = self.model(attention_mask=attention_mask, **inputs).logits
        if bool((attention_mask == 0).any()):
            logits = logits + 1.0
        return SequenceClassifierOutput(logits=logits)


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        (Cumulative, "export transformer: ONNX cannot export this model (UnsupportedOperatorError: Exporting the "
         "operator 'aten::cummax' to ONNX opset version 17 is not supported"),
        (PaddingBranch, "export transformer: the ONNX graph's logits differ from PyTorch's by 1 on the check texts"),
    ],
)  # fmt: skip
def test_a_model_onnx_cannot_follow_stops_with_one_line_naming_it(folders, tmp_path, monkeypatch, layer, message):
    loaded = export.load_trained
    monkeypatch.setattr(export, "load_trained", lambda folder: layer(loaded(folder)))
    with pytest.raises(KdpipeError) as caught:
        export_onnx(folders["transformer"]["student"], tmp_path / "out")
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)
    assert not (tmp_path / "out").exists() and not list(tmp_path.iterdir())  # nothing left, not even a temporary


def test_an_exported_folder_without_its_graph_stops_predict_with_one_line(folders, tmp_path, capsys):
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in folders["transformer"]["onnx"].iterdir():
        if path.name != "model.onnx":
            (broken / path.name).write_bytes(path.read_bytes())
    pd.DataFrame({"text": ["a"]}).to_csv(tmp_path / "in.csv", index=False)
    status = main(
        ["predict", "--model", str(broken), "--input", str(tmp_path / "in.csv"), "--out", str(tmp_path / "o.csv")]
    )
    err = capsys.readouterr().err
    assert status == 2 and "model.onnx: missing, though" in err and len(err.strip().splitlines()) == 1


def evaluate_model(name, folder, tiny_data, root, reference=None):
    splits = ["validation", "test"]
    params = eval_settings(model=name, splits=splits, batch_size=4)
    out = root / name
    evaluate.run(
        params,
        folder,
        tiny_data,
        [out / f"{s}.json" for s in splits],
        [out / f"{s}.predictions.parquet" for s in splits],
        reference=reference,
    )
    return out


@pytest.mark.parametrize("kind", ["transformer", "multihead"])
def test_an_exported_folder_is_evaluated_like_any_model(folders, tiny_data, tmp_path, kind):
    student = evaluate_model(kind, folders[kind]["student"], tiny_data, tmp_path)
    for variant in ("onnx", "int8"):
        exported = evaluate_model(f"{kind}.{variant}", folders[kind][variant], tiny_data, tmp_path, reference=student)
        for split in ("validation", "test"):
            mine, theirs = read_json(exported / f"{split}.json"), read_json(student / f"{split}.json")
            assert set(mine) == set(theirs) | {"compared_with"} and set(mine["metrics"]) == set(theirs["metrics"])
            assert mine["params"] == theirs["params"] and mine["members"] == theirs["members"]
            threads = torch.get_num_threads()
            precision = {"onnx": "fp32", "int8": "int8"}[variant]
            assert mine["device"] == f"CPU, ONNX Runtime {precision}, {threads} thread{'s' if threads > 1 else ''}"
            rows = pd.read_parquet(exported / f"{split}.predictions.parquet")
            reference = pd.read_parquet(student / f"{split}.predictions.parquet")
            assert list(rows.columns) == list(reference.columns) and list(rows["row_id"]) == list(reference["row_id"])
            block = mine["compared_with"]
            assert block["model"] == kind and block["n"] == len(rows)
            assert block["agreement"] == pytest.approx((rows["pred"] == reference["pred"]).mean())
            difference = mine["metrics"]["accuracy"] - theirs["metrics"]["accuracy"]
            assert block["accuracy_difference"]["difference"] == pytest.approx(difference)
            if variant == "onnx":  # the same model: the same predictions, a zero-width interval
                assert block["agreement"] == 1.0 and block["max_abs_prob_diff"] < 1e-5
                assert block["accuracy_difference"]["low"] == block["accuracy_difference"]["high"] == 0.0
                assert mine["metrics"]["accuracy"] == theirs["metrics"]["accuracy"]


def test_kdpipe_predict_runs_an_exported_folder(folders, tiny_data, tmp_path, capsys):
    read_split(tiny_data, "test")[["row_id", "text"]].to_csv(tmp_path / "in.csv", index=False)
    for kind in KINDS:
        theirs = predict.run(PredictSettings(), folders[kind]["student"], tmp_path / "in.csv", tmp_path / f"{kind}.csv")
        out = tmp_path / f"{kind}.onnx.parquet"
        status = main(["predict", "--model", str(folders[kind]["onnx"]), "--input", str(tmp_path / "in.csv"),
                       "--out", str(out)])  # fmt: skip
        assert status == 0, capsys.readouterr().err
        mine = pd.read_parquet(out)
        assert list(mine["label"]) == list(theirs["label"])
        assert mine["score"].to_numpy() == pytest.approx(theirs["score"].to_numpy(), abs=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_the_torch_free_runner_tokenises_and_predicts_as_kdpipe(folders, tiny_data, kind):
    """OnnxRunner's tokenizer (`tokenizers`, from tokenizer.json) gives kdpipe's ids; its probabilities are the
    evaluation's."""
    runner = OnnxRunner(folders[kind]["onnx"], threads=1)
    texts = [*read_split(tiny_data, "test")["text"].head(5), "", "word " * 300]
    tokenizer = load_tokenizer(str(folders[kind]["student"]))
    separate = kind == "bilstm"
    encoded = encode(tokenizer, texts, max_length=MAX_LENGTH, separate_pairs=separate)
    want = {k: v.numpy() for k, v in model_inputs(collate(encoded, np.arange(len(texts)))).items()}
    got = runner.encode(texts)
    for name in want:
        assert np.array_equal(got[name], want[name]), name
    model = load_trained(folders[kind]["student"]).eval()
    with torch.inference_mode():
        probs = torch.softmax(model(**{k: torch.from_numpy(v) for k, v in want.items()}).logits, -1).numpy()
    assert runner.predict_proba(texts) == pytest.approx(probs, abs=1e-5)


def test_a_byte_level_bpe_classifier_tokenises_alike_in_the_runner(tmp_path):
    """A RoBERTa checkpoint (byte-level BPE, its own special tokens, no token types) from outside kdpipe: the
    runner's ids are kdpipe's, its logits PyTorch's; without a max_length the export asks for one."""
    folder = tiny_roberta(tmp_path / "roberta", ["neg", "pos"])
    (folder / "labels.json").write_text('["neg", "pos"]')
    with pytest.raises(KdpipeError, match="sets no max_length; give max_length"):
        export_onnx(folder, tmp_path / "none")
    export_onnx(folder, tmp_path / "roberta.onnx", max_length=12)
    runner = OnnxRunner(tmp_path / "roberta.onnx")
    texts = ["Shares rose after the results, said the bank.", "Goal!", "a " * 40]
    encoded = encode(load_tokenizer(str(folder)), texts, max_length=12)
    want = {k: v.numpy() for k, v in model_inputs(collate(encoded, np.arange(3))).items()}
    got = runner.encode(texts)
    assert all(np.array_equal(got[name], want[name]) for name in want) and got["input_ids"][0, 0] == 0  # <s>
    model = load_trained(folder).eval()
    with torch.inference_mode():
        logits = model(**{k: torch.from_numpy(v) for k, v in want.items()}).logits.numpy()
    assert np.abs(runner.run(got)["logits"] - logits).max() < 1e-5


def test_serving_an_exported_folder_imports_neither_torch_nor_transformers(folders):
    code = (
        "import sys; from kdpipe.models.onnx_runtime import OnnxRunner; "
        f"p = OnnxRunner({str(folders['multihead']['int8'])!r}).predict_proba(['a text', 'another one']); "
        "print(p.shape, round(float(p.sum()), 4), 'torch' in sys.modules, 'transformers' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.stdout.split() == ["(2,", "5)", "2.0", "False", "False"], done.stderr


PROFILE_FIELDS = {
    "model", "folder", "kind", "format", "precision", "source", "request", "max_length", "latency_ms", "throughput",
    "memory", "size", "load_s", "threads", "device", "runtime", "date",
}  # fmt: skip


def test_serving_profile_fields(folders, tiny_data):
    texts = read_split(tiny_data, "test")["text"].tolist()  # 8 rows
    for variant in ("student", "int8"):
        folder = folders["multihead"][variant]
        profile = serving_profile(folder, texts, name=f"m.{variant}", batch_size=4, warmup=2, threads=1)
        assert set(profile) == PROFILE_FIELDS and profile["model"] == f"m.{variant}"
        latency = profile["latency_ms"]
        assert latency["requests"] == 6 and latency["warmup"] == 2 and latency["batch_size"] == 1
        assert 0 < latency["median"] <= latency["p95"] and latency["mean"] > 0
        assert profile["throughput"] == {
            "batch_size": 4,
            "texts": 8,
            "texts_per_s": profile["throughput"]["texts_per_s"],
        }
        assert profile["throughput"]["texts_per_s"] > 0
        memory = profile["memory"]
        assert memory["peak_rss_mb"] >= memory["rss_before_load_mb"] > 0
        assert memory["model_mb"] == pytest.approx(memory["peak_rss_mb"] - memory["rss_before_load_mb"])
        weights = "model.safetensors" if variant == "student" else "model.onnx"
        assert profile["size"]["weights_mb"] == (folder / weights).stat().st_size / 1e6
        assert profile["size"]["folder_mb"] == sum(p.stat().st_size for p in folder.iterdir()) / 1e6
        assert profile["max_length"] == MAX_LENGTH and profile["threads"] == 1
    assert profile["format"] == "onnx" and profile["precision"] == "int8" and "onnxruntime" in profile["runtime"]
    assert profile["source"] == {"name": "multihead", "kind": "student"}
    with pytest.raises(KdpipeError, match="8 texts, but 8 go to the warm-up"):
        serving_profile(folder, texts, warmup=8)


def test_a_swapped_graph_is_not_profiled(folders, tiny_data, tmp_path):
    """A serving profile reads an exported folder as every reader does: the fp32 graph copied over the int8 one
    (its time kept) is refused in one line naming the file, not profiled as int8."""
    import shutil

    folder = tmp_path / "transformer.int8"
    shutil.copytree(folders["transformer"]["int8"], folder)
    graph = folder / "model.onnx"
    stat = graph.stat()
    shutil.copyfile(folders["transformer"]["onnx"] / "model.onnx", graph)
    os.utime(graph, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    texts = read_split(tiny_data, "test")["text"].tolist()
    with pytest.raises(ArtifactError, match=r"model\.onnx: changed since kdpipe wrote it"):
        serving_profile(folder, texts, warmup=2)


def test_a_profile_in_a_process_of_its_own(folders, tiny_data):
    texts = read_split(tiny_data, "test")["text"].tolist()[:6]
    profile = profile_in_subprocess(folders["transformer"]["int8"], texts, batch_size=3, warmup=1)
    assert profile["model"] == "transformer.int8" and profile["latency_ms"]["requests"] == 5
    # the peak is the fresh process's own (ONNX Runtime and tokenizers, no torch), not this one's, which it was forked
    # from (ru_maxrss would have said this process's peak, as it survives exec)
    assert profile["memory"]["peak_rss_mb"] < min(peak_rss_mb(), 300)
    assert profile["device"].startswith("CPU (") and profile["device"].endswith("ONNX Runtime int8")


def _predictions(path, pred, correct, confidence):
    n = len(pred)
    probs = [np.array([c, 1 - c], dtype=np.float32) for c in confidence]
    frame = pd.DataFrame({"row_id": np.arange(n), "pred": pred, "correct": correct, "confidence": confidence})
    frame.assign(probs=probs).to_parquet(path)
    return path


def test_agreement_and_the_paired_difference_by_hand(tmp_path):
    # 10 rows: the reference is right on rows 0-7, the other model on 0-6 and 9; they predict alike on 8 rows
    reference = _predictions(tmp_path / "r.parquet", list("aaaaaaaabb"), [1] * 8 + [0, 0], [0.9] * 10)
    mine = _predictions(tmp_path / "m.parquet", list("aaaaaaabba"), [1] * 7 + [0, 0, 1], [0.8] * 10)
    result = against_reference(mine, reference, ece_bins=5)
    assert result["n"] == 10 and result["agreement"] == 0.8
    assert result["accuracy"] == 0.8 and result["reference_accuracy"] == 0.8
    assert result["accuracy_difference"]["difference"] == 0.0
    assert result["accuracy_difference"]["low"] < 0 < result["accuracy_difference"]["high"]
    # ECE: |0.8 - 0.8| = 0 against |0.9 - 0.8| = 0.1 (one bin each)
    assert result["ece_difference"]["difference"] == pytest.approx(-0.1)
    assert result["max_abs_prob_diff"] == pytest.approx(0.1)
    other = _predictions(tmp_path / "o.parquet", list("aaaaaaaaa"), [1] * 9, [0.9] * 9)
    with pytest.raises(KdpipeError, match="its rows are not those of"):
        against_reference(other, reference)
    # one row: nothing to draw a paired interval from
    one, one_reference = (_predictions(tmp_path / f"{n}.parquet", ["a"], [1], [0.9]) for n in ("one", "one_r"))
    with pytest.raises(KdpipeError, match="1 row\\(s\\); a paired comparison with .* needs two or more"):
        against_reference(one, one_reference)


def _evaluation(path, model, accuracy, n=200, ece=0.05):
    record = {"model": model, "split": "test", "metrics": {"n": n, "accuracy": accuracy, "ece": ece, "nll": 0.3}}
    record["metrics"]["reliability"] = {"bin_edges": list(np.linspace(0, 1, 6))}
    write_json(path, record)
    return path


@pytest.mark.parametrize(
    ("int8_accuracy", "flagged"),
    [(0.885, True), (0.890, False), (0.895, False), (0.905, False)],  # drops of 1.5, 1.0 (not more), 0.5, -0.5 points
)
def test_a_quantised_model_is_flagged_when_it_loses_more_than_a_point(tmp_path, int8_accuracy, flagged):
    fp32 = _evaluation(tmp_path / "fp32.json", "s", 0.90)
    int8 = _evaluation(tmp_path / "int8.json", "s.int8", int8_accuracy, ece=0.07)
    flag = accuracy_drop(fp32, int8)
    assert flag["flagged"] is flagged and flag["margin"] == 0.01
    assert flag["difference"] == pytest.approx(int8_accuracy - 0.90) and flag["interval"] is None
    assert flag["ece"] == 0.07 and flag["reference_ece"] == 0.05
    assert accuracy_drop(fp32, int8, margin=0.02)["flagged"] is False


def test_the_flag_reaches_the_card_and_the_folder_stays_verified(folders, tiny_data, tmp_path):
    student = evaluate_model("transformer", folders["transformer"]["student"], tiny_data, tmp_path)
    int8 = evaluate_model("transformer.int8", folders["transformer"]["int8"], tiny_data, tmp_path, reference=student)
    record = read_json(int8 / "test.json")
    # as if the int8 model had lost 2 of the test rows the fp32 student got right
    record["metrics"]["accuracy"] = read_json(student / "test.json")["metrics"]["accuracy"] - 2 / record["metrics"]["n"]
    flag = accuracy_drop(student / "test.json", record)
    assert flag["flagged"] and flag["interval"] == [
        record["compared_with"]["accuracy_difference"]["low"],
        record["compared_with"]["accuracy_difference"]["high"],
    ]
    folder = folders["transformer"]["int8"]
    flag_card(folder, flag)
    card = (folder / "README.md").read_text()
    assert "## Accuracy check\n\n**Flagged**: accuracy falls by more than 1.0 points." in card
    assert f"On the test split ({flag['n']} rows) the int8 model is right for" in card
    check_model_folder(folder)  # (the card is not pinned by the manifest)
    assert json.loads((folder / "onnx.json").read_text())["precision"] == "int8"


def test_with_reference_reads_the_evaluations_bins(folders, tiny_data, tmp_path):
    student = evaluate_model("bilstm", folders["bilstm"]["student"], tiny_data, tmp_path)
    onnx = evaluate_model("bilstm.onnx", folders["bilstm"]["onnx"], tiny_data, tmp_path)
    record = with_reference(
        onnx / "test.json", onnx / "test.predictions.parquet", student / "test.predictions.parquet", "bilstm"
    )
    assert record["compared_with"]["ece_difference"]["difference"] == pytest.approx(
        record["metrics"]["ece"] - read_json(student / "test.json")["metrics"]["ece"], abs=1e-6
    )


def test_a_folder_kdpipe_did_not_write_is_refused_in_one_line(tmp_path):
    """A classifier saved by transformers alone (no labels.json): export names the folder and what to do instead."""
    from transformers import BertConfig, BertForSequenceClassification

    folder = tmp_path / "hf"
    config = BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=1, intermediate_size=8)
    BertForSequenceClassification(config).save_pretrained(folder)
    with pytest.raises(KdpipeError, match=r"^export hf: .*hf is not a model folder kdpipe wrote \(no labels\.json\)"):
        export_onnx(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()
