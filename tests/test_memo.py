"""What the workflow remembers between runs in .snakemake/
(docs/caching-and-reruns.md, "What the workflow remembers between runs"): the caches never serve a value made from
anything else, and a broken or unwritable file is only a cache miss."""

import copy
import json
import os

import pytest
import yaml

from kdpipe.core.memo import JsonMemo
from kdpipe.core.store import KdpipeError
from kdpipe.plan import checked_plan
from tests.conftest import REPO

SCHEMA = REPO / "kdpipe/config.schema.yaml"
TINY = yaml.safe_load((REPO / "tests/configs/tiny.yaml").read_text())


# ---- JsonMemo


def test_a_memo_keeps_what_a_run_put_and_reads_it_back(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    memo = JsonMemo("m.json")
    assert memo.get("a") is None
    memo.put("a", [1, 2])
    memo.save()
    assert JsonMemo("m.json").get("a") == [1, 2]
    assert os.listdir(tmp_path / ".snakemake") == ["m.json"]  # no temporary file left


def test_a_torn_or_foreign_memo_file_is_an_empty_cache(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".snakemake").mkdir()
    for text in ('{"a": [1, 2', "[1, 2]", "\x00\x01"):
        (tmp_path / ".snakemake" / "m.json").write_text(text)
        memo = JsonMemo("m.json")
        assert memo.get("a") is None
        memo.put("a", 1)
        memo.save()
        assert JsonMemo("m.json").get("a") == 1


def test_an_entry_edited_or_damaged_in_place_is_a_miss(tmp_path, monkeypatch):
    """Valid JSON of any shape where a value was is never served: each entry carries a digest of key and value."""
    monkeypatch.chdir(tmp_path)
    memo = JsonMemo("m.json")
    memo.put("k", ["kdpipe.core.store"])
    memo.save()
    path = tmp_path / ".snakemake" / "m.json"
    good = json.loads(path.read_text())["k"]
    for damaged in ("not a list", [], [1, 2], {"a": 1}, [good[0], []], [good[0], ["kdpipe.core.memo"]], good[1]):
        path.write_text(json.dumps({"k": damaged}))
        assert JsonMemo("m.json").get("k") is None, damaged
    path.write_text(json.dumps({"k": good}))
    assert JsonMemo("m.json").get("k") == ["kdpipe.core.store"]


def test_past_its_limit_a_memo_drops_the_oldest_entries_the_run_did_not_use(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    memo = JsonMemo("m.json")
    for key in "abcde":
        memo.put(key, key)
    memo.save()
    memo = JsonMemo("m.json", limit=3)
    assert memo.get("a") == "a"  # used in this run: kept although it is the oldest
    memo.put("f", "f")
    memo.save()
    kept = json.loads((tmp_path / ".snakemake" / "m.json").read_text())
    assert set(kept) == {"a", "e", "f"}


def test_a_memo_that_cannot_be_written_is_no_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".snakemake").write_text("not a folder")  # (permissions would not stop root)
    memo = JsonMemo("m.json")
    memo.put("a", 1)
    memo.save()  # the value is computed again next time
    assert os.listdir(tmp_path) == [".snakemake"] and (tmp_path / ".snakemake").read_text() == "not a folder"


# ---- the checked plan


def snakemake_validate(config):
    from snakemake.utils import validate

    return lambda: validate(config, str(SCHEMA), set_default=True)


def plan_of(config, schema=SCHEMA):
    return checked_plan(config, schema, snakemake_validate(config))


def test_a_config_is_checked_entry_by_entry():
    text_number = copy.deepcopy(TINY)
    text_number["student_defaults"]["lr"] = "1e-3"
    with pytest.raises(KdpipeError, match="student_defaults.lr"):
        plan_of(text_number)
    out_of_range = copy.deepcopy(TINY)
    out_of_range["students"]["s_vkd"]["epochs"] = -1
    with pytest.raises(KdpipeError, match="epochs"):
        plan_of(out_of_range)
    reordered = copy.deepcopy(TINY)
    reordered["teachers"] = dict(reversed(list(reordered["teachers"].items())))
    assert list(plan_of(reordered).teachers) == list(reordered["teachers"])  # order is part of the key


def test_a_config_is_checked_against_the_schema_it_is_given(tmp_path):
    schema = yaml.safe_load(SCHEMA.read_text())
    schema["properties"]["student_defaults"]["properties"]["epochs"]["maximum"] = 0
    stricter = tmp_path / "schema.yaml"
    stricter.write_text(yaml.safe_dump(schema))
    with pytest.raises(KdpipeError, match="epochs"):
        plan_of(copy.deepcopy(TINY), stricter)
