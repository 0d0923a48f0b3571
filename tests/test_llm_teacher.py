"""Prompted causal-LM teachers (docs/methods.md §7) on tiny random Llama and Qwen2 models with a BPE tokenizer trained
in-process and a chat template: the import from a folder and from a GGUF file, the prefix-reuse pass against the
naive per-row forward, multi-token verbalizers, calibration, few-shot draws, the ensemble's signals, shards, and every
bad input's one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM

from kdpipe.core.store import ArtifactError, KdpipeError
from kdpipe.data.batching import Batches, inference_batches
from kdpipe.data.dataset import read_labels, read_split
from kdpipe.models.causal_lm import check_causal_lm_folder, import_causal_lm, load_causal_lm
from kdpipe.models.causal_lm_source import CausalLmImportSettings
from kdpipe.signals.io import read_logits, read_mc
from kdpipe.signals.mc_dropout import SCORES, summarise
from kdpipe.signals.prompt_members import gather, read_members
from kdpipe.signals.prompt_settings import PromptPassSettings
from kdpipe.signals.prompted import (
    calibrated,
    check_tokenizer,
    encode_rows,
    ensemble_signals,
    member_log_scores,
    naive_log_scores,
    prepare_members,
    run_pass,
    run_shard,
    score_split,
)
from kdpipe.signals.prompts import check_prompt_teacher, draw_shots, prompt_settings, typed
from tests.conftest import REPO
from tests.tiny_models import byte_level_bpe, family_config, tiny_distilbert, wordpiece

CHAT = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)
CLASSES = ["business", "sport", "tech"]
TEMPLATE = "Classify the article into one of: {labels}.\n\nArticle: {text}\nTopic:"
CPU = torch.device("cpu")
SHOTS = pd.DataFrame(
    {
        "row_id": [10, 11, 12, 13, 14, 15],
        "text": ["Shares rose.", "The match ended 2-1.", "A new phone.", "Profits fell.", "He won.", "Chips."],
        "label": ["business", "sport", "tech", "business", "sport", "tech"],
    }
)
TEXTS = [
    "Markets rallied today after the bank cut its rates.",
    "Goal!",
    "The laptop has a new chip, and the software is faster than ever before.",
    "x",
    "The minister said the economy would grow.",
]


def chat_tokenizer():
    tokenizer = byte_level_bpe()
    tokenizer.chat_template = CHAT
    return tokenizer


def tiny_causal_lm(family: str = "llama", *, seed: int = 0, attn: str = "sdpa"):
    """A 2-layer random causal LM of ``family`` over the tiny BPE's 400 ids, with room for long few-shot prompts."""
    config = family_config(family, 400, layers=2)
    config.max_position_embeddings = 1024
    config.architectures = [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[family]]
    config._attn_implementation = attn
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn).eval()


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llm") / "tiny-llama"
    tiny_causal_lm().save_pretrained(folder)
    chat_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def imported(model_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("imported") / "llm"
    import_causal_lm(str(model_folder), out, settings=CausalLmImportSettings(source=str(model_folder)))
    return out


def settings(**prompt):
    return typed({"model": "m", "templates": [TEMPLATE], **prompt}, classes=CLASSES, pairs="pairs" in prompt, where="t")


def pass_settings(params: dict, data) -> PromptPassSettings:
    """A pass's typed settings from ``params`` (split, batch_size, prompt), scoring every class of ``data``."""
    labels = read_labels(data)
    prompt = prompt_settings(params["prompt"], classes=labels, pairs=False, where="t")
    return PromptPassSettings.from_params({**params, "classes": labels, "prompt": prompt})


def member_and_rows(prompt: dict, texts=TEXTS, *, pairs=None):
    tokenizer = chat_tokenizer()
    s = typed({"model": "m", "templates": [TEMPLATE], **prompt}, classes=CLASSES, pairs=bool(pairs), where="t")
    [member, *_] = prepare_members(s, tokenizer, CLASSES, pairs=bool(pairs), shots_frame=SHOTS, where="t")
    rows = encode_rows(
        tokenizer, texts, pairs, text_space=member.text_space, pair_space=member.pair_space, max_length=s.max_length
    )
    return member, rows


# -- import ----------------------------------------------------------------------------------------------------------


def test_import_from_a_local_folder_writes_safetensors_a_tokenizer_and_checksums(model_folder, imported):
    manifest = check_causal_lm_folder(imported)
    assert manifest["kind"] == "causal_lm" and manifest["source_kind"] == "folder"
    assert manifest["model_type"] == "llama" and manifest["architectures"] == ["LlamaForCausalLM"]
    assert manifest["chat_template"] is True and manifest["gold_labels"] == {"checkpoint": "trained outside kdpipe"}
    assert "model.safetensors" in manifest["checksums"] and "tokenizer.json" in manifest["checksums"]
    ids = torch.tensor([[5, 17, 99, 3, 250]])
    original = AutoModelForCausalLM.from_pretrained(model_folder).eval()
    with torch.no_grad():
        assert torch.equal(load_causal_lm(imported, CPU)(input_ids=ids).logits, original(input_ids=ids).logits)
    (imported / "config.json").write_text((imported / "config.json").read_text())  # the same bytes: still fine
    check_causal_lm_folder(imported)


def test_a_damaged_import_is_refused(imported, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(imported, copy)
    (copy / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ArtifactError, match="tokenizer_config.json: changed since kdpipe wrote it"):
        check_causal_lm_folder(copy)


def _write_gguf(path, model, tokenizer) -> None:
    """A GGUF file of the tiny Llama, float32, in llama.cpp's layout: q and k rows in rotary pairs (i, i + d/2)
    interleaved, the BPE's vocabulary, merges and chat template."""
    import gguf

    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = config.hidden_size // heads

    def interleaved(weight, n):  # rows (i, i + d/2) of every head next to each other
        w = weight.detach().numpy()
        return w.reshape(n, 2, head_dim // 2, -1).swapaxes(1, 2).reshape(w.shape)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    backend = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    vocab = sorted(backend["vocab"].items(), key=lambda item: item[1])
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([token for token, _ in vocab])
    specials = set(tokenizer.all_special_ids)
    writer.add_token_types([3 if i in specials else 1 for _, i in vocab])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in backend["merges"]])
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(False)
    writer.add_add_space_prefix(True)
    writer.add_chat_template(CHAT)
    state = model.state_dict()
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"].numpy())
    writer.add_tensor("output_norm.weight", state["model.norm.weight"].numpy())
    writer.add_tensor("output.weight", state["lm_head.weight"].numpy())
    for layer in range(config.num_hidden_layers):
        p = f"model.layers.{layer}."
        names = {
            "attn_norm": "input_layernorm",
            "ffn_norm": "post_attention_layernorm",
            "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj",
            "ffn_gate": "mlp.gate_proj",
            "ffn_up": "mlp.up_proj",
            "ffn_down": "mlp.down_proj",
        }
        for ours, theirs in names.items():
            writer.add_tensor(f"blk.{layer}.{ours}.weight", state[p + theirs + ".weight"].numpy())
        writer.add_tensor(f"blk.{layer}.attn_q.weight", interleaved(state[p + "self_attn.q_proj.weight"], heads))
        writer.add_tensor(f"blk.{layer}.attn_k.weight", interleaved(state[p + "self_attn.k_proj.weight"], kv_heads))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_import_from_a_gguf_file_gives_the_same_model(tmp_path):
    model, tokenizer = tiny_causal_lm(seed=3), chat_tokenizer()
    _write_gguf(tmp_path / "tiny.gguf", model, tokenizer)
    manifest = import_causal_lm(str(tmp_path / "tiny.gguf"), tmp_path / "out")
    assert manifest["source_kind"] == "gguf" and manifest["source_checksum"].startswith("xxh3_64:")
    assert manifest["chat_template"] is True and (tmp_path / "out" / "model.safetensors").is_file()
    ids = torch.tensor([[5, 17, 99, 3, 250, 7]])
    with torch.no_grad():
        ours = load_causal_lm(tmp_path / "out", CPU)(input_ids=ids).logits
        assert torch.allclose(ours, model(input_ids=ids).logits, atol=1e-5)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out")  # a plain transformers folder
    assert reloaded.config.model_type == "llama"
    from transformers import AutoTokenizer

    imported_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert tokenizer.get_vocab().items() <= imported_tokenizer.get_vocab().items()  # (GPT-2's <|endoftext|> added)
    assert imported_tokenizer.chat_template == CHAT
    text = " Shares in the bank rose after its results."  # (the GGUF tokenizer adds no space before a first word)
    ids = imported_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]


# -- scoring ---------------------------------------------------------------------------------------------------------

VERBALIZERS = {"business": ["business", "the economy"], "sport": "sport", "tech": ["tech", "technology"]}


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("chat", [False, True])
def test_prefix_reuse_equals_the_naive_forward_of_the_whole_prompt(family, chat):
    model = tiny_causal_lm(family)
    member, rows = member_and_rows({"verbalizers": VERBALIZERS, "shots": 1, "chat": chat, "max_length": 24})
    assert len(set(map(len, (rows.segment(member, i) for i in range(len(TEXTS)))))) >= 4  # rows of several lengths
    assert any(len(v) > 1 for v in member.verbalizers) and len(member.prefix) > 20
    naive = naive_log_scores(model, member, rows, np.arange(len(TEXTS)), 3, device=CPU)
    for batch_size in (1, 2, 3, 5):
        batches = inference_batches(rows.lengths(member), batch_size)
        fast = member_log_scores(model, member, rows, batches, 3, device=CPU, pad_id=1)
        np.testing.assert_allclose(fast, naive, atol=2e-5, rtol=0)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_pooled_states_are_the_mean_last_layer_state_of_each_rows_own_ids(attn):
    """The pass's ``pooled`` signal: each row's last hidden layer, averaged over its own ids (the prefix's last id,
    its text, what follows it), as the whole prompt run on its own gives it, whatever the batch and its padding."""
    model = tiny_causal_lm("llama", attn=attn)
    member, rows = member_and_rows({"verbalizers": VERBALIZERS, "shots": 1, "chat": False, "max_length": 24})
    expected = []
    with torch.inference_mode():
        for i in range(len(TEXTS)):
            segment = rows.segment(member, i).tolist()
            ids = torch.tensor([list(member.prefix[:-1]) + segment])
            hidden = model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0]
            expected.append(hidden[-len(segment) :].mean(0).numpy())
    for batch_size in (1, 3, 5):
        pooled = np.zeros((len(TEXTS), model.config.hidden_size), dtype=np.float32)
        batches = inference_batches(rows.lengths(member), batch_size)
        member_log_scores(model, member, rows, batches, 3, device=CPU, pad_id=1, pooled=pooled)
        np.testing.assert_allclose(pooled, np.stack(expected), atol=5e-5, rtol=0)


def test_prefix_reuse_with_eager_attention_and_sentence_pairs():
    model = tiny_causal_lm("llama", attn="eager")
    pairs = ["It was a fine day.", "Nothing happened.", "Yes", "The chips are made in Taiwan and sold worldwide.", ""]
    prompt = {"templates": ["Premise: {text}\nHypothesis: {text_pair}\nTopic:"], "verbalizers": VERBALIZERS}
    tokenizer = chat_tokenizer()
    s = typed({"model": "m", **prompt, "chat": False, "max_length": 12}, classes=CLASSES, pairs=True, where="t")
    [member] = prepare_members(s, tokenizer, CLASSES, pairs=True, where="t")
    rows = encode_rows(
        tokenizer, TEXTS, pairs, text_space=member.text_space, pair_space=member.pair_space, max_length=12
    )
    assert all(len(a) + len(b) <= 12 for a, b in zip(rows.text, rows.pair))
    naive = naive_log_scores(model, member, rows, np.arange(5), 3, device=CPU)
    fast = member_log_scores(model, member, rows, inference_batches(rows.lengths(member), 2), 3, device=CPU, pad_id=1)
    np.testing.assert_allclose(fast, naive, atol=2e-5, rtol=0)


def test_multi_token_verbalizers_against_a_hand_computation():
    """A class's log-score is the log-sum-exp over its verbalizers of the sum of each token's log-probability given
    the prompt and the verbalizer's earlier tokens, read here from one plain forward of prompt + verbalizer."""
    model = tiny_causal_lm(seed=1)
    member, rows = member_and_rows({"verbalizers": VERBALIZERS, "chat": False, "max_length": 16})
    tokenizer = chat_tokenizer()
    prompt = member.prefix + rows.text[0].tolist() + member.suffix
    assert tokenizer.decode(prompt[1:]).endswith("Topic:")
    by_hand = []
    for name in CLASSES:
        words = VERBALIZERS[name] if isinstance(VERBALIZERS[name], list) else [VERBALIZERS[name]]
        sums = []
        for word in words:
            ids = tokenizer(" " + word, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=torch.tensor([prompt + ids])).logits[0], -1)
            sums.append(sum(float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(ids)))
        by_hand.append(np.logaddexp.reduce(sums))
    fast = member_log_scores(model, member, rows, Batches.cut(np.arange(len(TEXTS)), 5), 3, device=CPU, pad_id=1)
    np.testing.assert_allclose(fast[0], by_hand, atol=2e-5, rtol=0)


class ForwardCounter:
    def __init__(self, model):
        self.calls = 0
        model.register_forward_pre_hook(self)

    def __call__(self, module, args):
        self.calls += 1


@pytest.mark.parametrize("verbalizers", [{"business": "the", "sport": "to", "tech": "of"}, VERBALIZERS])
def test_every_batch_is_one_forward_and_the_prefix_runs_once(verbalizers):
    model = tiny_causal_lm()
    member, rows = member_and_rows({"verbalizers": verbalizers, "shots": 1, "chat": False, "max_length": 16})
    single = all(len(v) == 1 for v in member.verbalizers)
    assert single == (verbalizers != VERBALIZERS)  # " the", " to", " of" are one token each in the tiny BPE
    counter = ForwardCounter(model)
    member_log_scores(model, member, rows, inference_batches(rows.lengths(member), 2), 3, device=CPU, pad_id=1)
    assert counter.calls == 1 + 3  # the prefix, then 3 batches of 5 rows


# -- calibration, few-shot, the ensemble -----------------------------------------------------------------------------


def test_content_free_calibration_against_a_hand_computation(imported, tiny_data):
    params = {
        "split": "validation",
        "batch_size": 4,
        "prompt": {"model": "m", "templates": [TEMPLATE], "chat": False, "max_length": 12, "calibrate": ["N/A", ""]},
    }
    plain = score_split(
        pass_settings({**params, "prompt": {**params["prompt"], "calibrate": False}}, tiny_data), imported, tiny_data
    )
    result = score_split(pass_settings(params, tiny_data), imported, tiny_data)
    labels = read_labels(tiny_data)
    # p_cf by hand: each content-free input scored as a row's text, its class probabilities averaged
    tokenizer, model = chat_tokenizer(), load_causal_lm(imported, CPU)
    s = typed(params["prompt"], classes=labels, pairs=False, where="t")
    [member] = prepare_members(s, tokenizer, labels, pairs=False, where="t")
    rows = encode_rows(tokenizer, ["N/A", ""], None, text_space=member.text_space, pair_space="", max_length=12)
    cf = naive_log_scores(model, member, rows, [0, 1], len(labels), device=CPU)
    p_cf = (np.exp(cf) / np.exp(cf).sum(1, keepdims=True)).mean(0)
    np.testing.assert_allclose(result.content_free[0], p_cf, rtol=1e-5)
    p = np.exp(plain.log_probs[0])
    q = (p / p_cf) / (p / p_cf).sum(1, keepdims=True)
    np.testing.assert_allclose(np.exp(result.log_probs[0]), q, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(calibrated(np.log([[0.6, 0.4]]), np.array([0.75, 0.25])), np.log([[1 / 3, 2 / 3]]))


def test_few_shot_draws_are_fixed_by_the_seed_and_recorded(imported, tiny_data):
    train = read_split(tiny_data, "train")
    labels = read_labels(tiny_data)
    first = draw_shots(train["label"], labels, shots=2, draw=0, seed=5, where="t")
    assert np.array_equal(first, draw_shots(train["label"], labels, shots=2, draw=0, seed=5, where="t"))
    assert not np.array_equal(first, draw_shots(train["label"], labels, shots=2, draw=1, seed=5, where="t"))
    assert sorted(train["label"].to_numpy()[first]) == sorted(labels * 2)
    prompt = {"model": "m", "templates": [TEMPLATE], "chat": False, "max_length": 8, "shots": 2, "shot_draws": 2}
    result = score_split(
        pass_settings({"split": "validation", "batch_size": 8, "prompt": {**prompt, "seed": 5}}, tiny_data),
        imported,
        tiny_data,
    )
    ids = train["row_id"].to_numpy()
    assert result.shots == {
        "t0.v0.d0": ids[first].tolist(),
        "t0.v0.d1": ids[draw_shots(train["label"], labels, shots=2, draw=1, seed=5, where="t")].tolist(),
    }
    read = set(result.shots["t0.v0.d0"]) | set(result.shots["t0.v0.d1"])
    assert result.gold_labels == {"train": len(read), "checkpoint": "trained outside kdpipe"}
    zero = score_split(
        pass_settings(
            {"split": "validation", "batch_size": 8, "prompt": {**prompt, "shots": 0, "shot_draws": 1}}, tiny_data
        ),
        imported,
        tiny_data,
    )
    assert zero.shots == {"t0.v0.d0": []} and "train" not in zero.gold_labels


def test_the_ensemble_writes_logits_and_mc_as_every_method_reads_them(imported, tiny_data, tmp_path):
    prompt = {
        "model": "m",
        "templates": [TEMPLATE, "{text}\nThe topic of this article, one of {labels}, is"],
        "chat": False,
        "max_length": 10,
        "shots": 1,
        "shot_draws": 2,
    }
    params = {"split": "validation", "batch_size": 3, "prompt": prompt}
    manifests = run_pass(pass_settings(params, tiny_data), imported, tiny_data, tmp_path / "sig")
    labels = read_labels(tiny_data)
    row_ids = read_split(tiny_data, "validation")["row_id"].to_numpy()
    members, prompt_manifest = read_members(tmp_path / "sig" / "prompt.npy", row_ids, labels)
    assert members.shape == (4, len(row_ids), len(labels))  # 2 templates x 2 draws
    assert prompt_manifest["members"] == ["t0.v0.d0", "t0.v0.d1", "t1.v0.d0", "t1.v0.d1"]
    np.testing.assert_allclose(members.sum(-1), 1, atol=1e-5)
    logits, _ = read_logits(tmp_path / "sig" / "logits.parquet", row_ids, labels)
    softmax = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    np.testing.assert_allclose(softmax, members.mean(0), atol=1e-6)
    mean, scores = read_mc(tmp_path / "sig" / "mc.npy", row_ids, labels)
    expected = summarise(torch.from_numpy(np.ascontiguousarray(members)))
    np.testing.assert_allclose(mean, expected["mean"], atol=1e-6)
    for key in SCORES:
        np.testing.assert_allclose(scores[key], expected[key], atol=1e-5)
    assert scores["mutual_info"].max() > 0  # the members disagree
    read = {row for rows in manifests["prompt"]["shots"].values() for row in rows}
    assert 5 <= len(read) <= 10 and manifests["logits"]["gold_labels"]["train"] == len(read)
    assert manifests["mc"]["ensemble"] == "prompt"
    pooled = np.load(tmp_path / "sig" / "pooled.npy")
    assert pooled.shape == (len(row_ids), 32) and manifests["pooled"]["hidden_size"] == 32  # (the tiny Llama's)
    assert np.abs(pooled).sum(1).min() > 0  # every row's states
    # sharded: the same bytes
    parts = [tmp_path / f"part{k}" for k in (1, 2)]
    for k, part in enumerate(parts, 1):
        run_shard(pass_settings(params, tiny_data), imported, tiny_data, f"{k}-of-2", part)
    gather(pass_settings(params, tiny_data), parts, tmp_path / "sharded")
    for name in ("logits.parquet", "mc.npy", "mc.parquet", "pooled.npy", "prompt.npy"):
        assert (tmp_path / "sharded" / name).read_bytes() == (tmp_path / "sig" / name).read_bytes(), name


def test_ensemble_signals_by_hand():
    log_probs = np.log([[[0.5, 0.5], [0.9, 0.1]], [[0.7, 0.3], [0.1, 0.9]]])  # 2 members, 2 rows
    out = ensemble_signals(log_probs)
    np.testing.assert_allclose(np.exp(out["logits"]), [[0.6, 0.4], [0.5, 0.5]], rtol=1e-6)
    np.testing.assert_allclose(out["mean"], [[0.6, 0.4], [0.5, 0.5]], rtol=1e-6)
    entropy = -(0.6 * np.log(0.6) + 0.4 * np.log(0.4)) / np.log(2)
    np.testing.assert_allclose(out["entropy"], [entropy, 1.0], rtol=1e-5)
    assert out["mutual_info"][1] > out["mutual_info"][0] > 0


# -- bad input -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "pairs", "message"),
    [
        ({"templates": ["Classify: {labels}"]}, False, r"t\.templates\[0\]: the template needs the row's text slot"),
        ({"templates": ["{text} {txt}"]}, False, r"unknown slot \{txt\} \(did you mean \{text\}\?\)"),
        ({"templates": ["{text} and {text_pair}"]}, False, "names {text_pair}, but the dataset has no sentence pairs"),
        ({"templates": ["{text}"]}, True, "needs {text_pair} exactly once"),
        ({"verbalizers": {"business": "b", "sport": "s"}}, False, "class 'tech' has no verbalizer"),
        ({"verbalizers": {**VERBALIZERS, "sports": "x"}}, False, r"'sports' is not a class of this teacher \(did you"),
        ({"verbalizers": {**VERBALIZERS, "tech": ["tech", " "]}}, False, r"t\.verbalizers\.tech: ' ' is not a word"),
        ({"verbalizers": {**VERBALIZERS, "tech": "sport"}}, False, "'sport' names both 'sport' and 'tech'"),
        ({"shot_draws": 2}, False, "2 draws of no example are the same prompt"),
        ({"calibrate": "yes"}, False, r"t\.calibrate: true, false or a list"),
        ({"chat": "yes"}, False, r"t\.chat: 'yes' is not one of"),
        ({"shot": 2}, False, r"unknown key 'shot' \(did you mean 'shots'\?\)"),
    ],
)
def test_settings_errors_are_one_line_before_any_job(prompt, pairs, message):
    with pytest.raises(KdpipeError, match=message) as err:
        prompt_settings({"model": "m", "templates": [TEMPLATE], **prompt}, classes=CLASSES, pairs=pairs, where="t")
    assert "\n" not in str(err.value)


def test_a_model_that_is_not_a_causal_lm_is_refused_before_and_at_import(tmp_path):
    folder = tiny_distilbert(tmp_path / "bert", CLASSES)
    prompt = {"model": str(folder), "templates": [TEMPLATE]}
    with pytest.raises(KdpipeError, match=r"teachers\.smol\.prompt\.model: .*DistilBertForSequenceClassification"):
        check_prompt_teacher(prompt, classes=CLASSES, pairs=False, where="teachers.smol.prompt")
    with pytest.raises(KdpipeError, match="not a causal language model"):
        import_causal_lm(str(folder), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04")
    with pytest.raises(KdpipeError, match="not a GGUF file"):
        check_prompt_teacher({**prompt, "model": str(tmp_path / "x.gguf")}, classes=CLASSES, pairs=False, where="t")


def test_tokenizer_checks_name_the_verbalizer_and_the_template():
    lowercase = wordpiece()  # lower-cases, and drops control characters
    with pytest.raises(KdpipeError, match=r"t\.verbalizers\.tech: '\\x07' tokenises to nothing"):
        check_tokenizer(
            {"model": "m", "templates": [TEMPLATE], "verbalizers": {**VERBALIZERS, "tech": "\x07"}},
            lowercase,
            classes=CLASSES,
            pairs=False,
            where="t",
        )
    with pytest.raises(KdpipeError, match=r"'sport' \(sport\) and 'Sport' \(tech\) tokenise to the same ids"):
        check_tokenizer(
            {"model": "m", "templates": [TEMPLATE], "verbalizers": {**VERBALIZERS, "tech": "Sport"}},
            lowercase,
            classes=CLASSES,
            pairs=False,
            where="t",
        )
    broken = chat_tokenizer()
    broken.chat_template = "{{ raise_exception('Conversation roles must alternate') }}"
    with pytest.raises(
        KdpipeError,
        match=r"t\.templates\[0\]: the tokenizer's chat template fails to render the "
        r"prompt \(Conversation roles must alternate\); set chat: false",
    ):
        check_tokenizer({"model": "m", "templates": [TEMPLATE]}, broken, classes=CLASSES, pairs=False, where="t")
    broken.chat_template = CHAT.replace("m['content']", "m['content'] | upper")
    with pytest.raises(KdpipeError, match=r"the chat template does not keep the row's text as it is given"):
        check_tokenizer({"model": "m", "templates": [TEMPLATE]}, broken, classes=CLASSES, pairs=False, where="t")
    with pytest.raises(KdpipeError, match=r"t\.chat: true, but the model's tokenizer has no chat template"):
        check_tokenizer(
            {"model": "m", "templates": [TEMPLATE], "chat": True},
            byte_level_bpe(),
            classes=CLASSES,
            pairs=False,
            where="t",
        )


def test_too_few_rows_of_a_class_for_the_shots(imported, tiny_data):
    prompt = {"model": "m", "templates": [TEMPLATE], "shots": 50}
    with pytest.raises(KdpipeError, match=r"prompt\.shots: 50 examples per class, but the train split has \d+ rows"):
        score_split(
            pass_settings({"split": "validation", "batch_size": 4, "prompt": prompt}, tiny_data), imported, tiny_data
        )


def test_the_plan_side_imports_neither_torch_nor_transformers():
    code = (
        "import sys, kdpipe.signals.prompts, kdpipe.models.causal_lm_source\n"
        "assert not {'torch', 'transformers'} & set(sys.modules), sorted({'torch', 'transformers'} & set(sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# -- the plan of a config with prompted teachers (tests/configs/tiny_llm.yaml) ---------------------------------------

BBC_LABELS = ["business", "entertainment", "politics", "sport", "tech"]  # builtin:bbc_news, in their order


def planned(monkeypatch, tmp_path, edit=None, name: str = "tiny_llm.yaml"):
    """The plan of ``tests/configs/<name>`` (edited by ``edit``) as the workflow makes it, in ``tmp_path``."""
    import yaml
    from snakemake.utils import validate

    from kdpipe.plan import Plan
    from kdpipe.plan.entries import validate_entry

    config = yaml.safe_load((REPO / "tests/configs" / name).read_text())
    monkeypatch.chdir(tmp_path)
    if edit is not None:
        edit(config)
    schema = REPO / "kdpipe/config.schema.yaml"
    validate_entry(config, yaml.safe_load(schema.read_text()))
    validate(config, str(schema), set_default=True)
    monkeypatch.setattr(Plan, "data_labels", lambda self: BBC_LABELS)
    return Plan(config)


def test_the_plan_of_prompted_teachers(monkeypatch, tmp_path):
    from kdpipe.plan.prompted import llm_name

    plan = planned(monkeypatch, tmp_path)
    assert plan.prompted_teachers() == ["llm_a", "llm_b"] and plan.classifier_teachers() == []
    assert plan.llms() == {llm_name("data/tiny-llm"): "data/tiny-llm"}  # one import for both teachers
    assert plan.llm_params(llm_name("data/tiny-llm")) == {"source": "data/tiny-llm"}  # (no such folder here)
    assert plan.passes() == {}  # no classifier teacher's pass
    splits = ["train", "transfer", "validation", "test"]
    assert plan.prompt_passes() == [(t, s) for t in ("llm_a", "llm_b") for s in splits]
    params = plan.prompt_params("llm_b", "transfer")
    assert params["batch_size"] == 16 and params["classes"] == ["politics", "sport", "tech"]
    assert params["prompt"]["verbalizers"] == [
        {"politics": ["politics", "government"], "sport": ["sport"], "tech": ["tech", "technology"]}
    ]
    assert params["prompt"]["calibrate"] == [] and params["prompt"]["shot_draws"] == 2
    assert plan.prompt_shots("transfer") == ["results/data/tiny_bbc"] and plan.prompt_shots("train") == []
    assert plan.eval_params("llm_a")["seed"] == 0 and "mc_samples" not in plan.eval_params("llm_a")
    assert plan.prompt_members_count("llm_a") == plan.prompt_members_count("llm_b") == 2 and plan.has_members()
    assert "results/teachers/llm_a" not in plan.trained_models()
    # a config without a prompted teacher: no teacher's slice names the key
    tiny = planned(monkeypatch, tmp_path, name="tiny.yaml")
    assert all("prompt" not in tiny.teacher_params(t) for t in tiny.teachers) and tiny.llms() == {}


def _dynamic_objective(config):
    """Dynamic KD's objective adjustment (hidden states) from one prompted teacher of every class."""
    config["teachers"]["llm_a"].pop("classes")
    config["students"] = {"s_vkd": {"method": "dynamic_objective", "teachers": ["llm_a"]}}


def _not_a_causal_lm(config):
    folder = Path("bert")
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["BertForSequenceClassification"]}))
    config["teachers"]["llm_a"]["prompt"]["model"] = "bert"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda c: c["teachers"]["llm_a"]["prompt"].update(templates=["Classify: {labels}"]),
            r"^teachers\.llm_a\.prompt\.templates\[0\]: the template needs the row's text slot \{text\} exactly once",
        ),
        (
            lambda c: c["teachers"]["llm_b"]["prompt"]["verbalizers"].pop("tech"),
            r"^teachers\.llm_b\.prompt\.verbalizers: class 'tech' has no verbalizer",
        ),
        (
            lambda c: c["teachers"]["llm_b"]["prompt"]["verbalizers"].update(sport=["sport", "government"]),
            r"^teachers\.llm_b\.prompt\.verbalizers: the word 'government' names both 'politics' and 'sport'",
        ),
        (
            lambda c: c["teachers"]["llm_a"]["prompt"].update(shot=2),
            r"^teachers\.llm_a\.prompt: unknown key 'shot' \(did you mean 'shots'\?\)",
        ),
        (_not_a_causal_lm, r"^teachers\.llm_a\.prompt\.model: bert: it is a BertForSequenceClassification"),
        (
            lambda c: c["teachers"]["llm_a"].update(checkpoint="some/classifier"),
            r"^teachers\.llm_a\.checkpoint: a prompted teacher \(prompt\) is an instruction-tuned LLM used as it is",
        ),
        (
            lambda c: c["teachers"]["llm_a"].update(ensemble={"size": 2}),
            r"^teachers\.llm_a\.ensemble: a prompted teacher",
        ),
        (
            lambda c: c["students"]["s_vkd"].update(method="dfa"),
            r"^students\.s_vkd: method 'dfa' reads the teachers' hidden signal, which a prompted teacher \(llm_a\) "
            r"does not have: its tokens are not the student's",
        ),
        (
            _dynamic_objective,
            r"^students\.s_vkd: method 'dynamic_objective' reads the teachers' hidden signal",
        ),
        (
            lambda c: c["evaluate"].update(ood={"classes": ["tech"]}),
            r"^evaluate\.ood: the OOD evaluation runs each model on the OOD rows",
        ),
    ],
    ids=[
        "no-text-slot",
        "class-without-verbalizer",
        "word-of-two-classes",
        "unknown-key",
        "not-a-causal-lm",
        "checkpoint",
        "ensemble",
        "token-level-method",
        "dynamic-kd-objective",
        "ood",
    ],
)
def test_a_bad_prompted_config_is_one_line_from_the_plan(monkeypatch, tmp_path, edit, message):
    with pytest.raises(KdpipeError, match=message) as caught:
        planned(monkeypatch, tmp_path, edit)
    assert "\n" not in str(caught.value)
