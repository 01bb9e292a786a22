"""A generated bad-input suite: malformed variants of a valid row, one kind per case.

For every kind: no traceback and no hang, exactly one DataError line naming file:line, the key when it
can be known, and the field, with the intended problem; the valid rows around it still load. Kinds
that are harmless (a BOM, CRLF line ends, extra fields) must load instead. ``test_loading.py`` has
the per-format cases; the CLI runs the combined corpus in ``test_bad_corpus.py``.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any, Callable

import pytest
from test_loading import make_row

from cupid_exp.config import DataConfig
from cupid_exp.data.loading import load_instances
from cupid_exp.data.schema import DataError
from cupid_exp.testing.cupid_data import delete_at, set_at

KEY = "7+bad_row/consistent"
Row = dict[str, Any]


def turns(session: int, value: Any) -> Callable[[Row], Row]:
    return set_at(["prior_interactions", session, "dialogue"], value)


D0 = ["prior_interactions", 0, "dialogue"]
TOP_TEXT = ("current_request", "current_context_factor", "current_contextual_preference")

# (kind, mutation of a valid row of persona 7+bad_row, field named in the error, message fragment, key known?)
ROW_KINDS: list[tuple[str, Callable[[Row], Any], str, str, bool]] = [
    *[(f"{f}_missing", delete_at([f]), f, "is missing", True) for f in TOP_TEXT],
    *[(f"{f}_null", set_at([f], None), f, "is missing", True) for f in TOP_TEXT],
    *[(f"{f}_blank", set_at([f], " \t\n"), f, "is empty", True) for f in TOP_TEXT],
    *[(f"{f}_number", set_at([f], 42), f, "must be a string, got int", True) for f in TOP_TEXT],
    *[(f"{f}_list", set_at([f], ["a", "b"]), f, "must be a string, got list", True) for f in TOP_TEXT],
    ("persona_id_missing", delete_at(["persona_id"]), "persona_id", "is missing", False),
    ("persona_id_blank", set_at(["persona_id"], "  "), "persona_id", "is empty", False),
    ("persona_id_number", set_at(["persona_id"], 7), "persona_id", "must be a string", False),
    ("instance_type_missing", delete_at(["instance_type"]), "instance_type", "is missing", False),
    ("instance_type_unknown", set_at(["instance_type"], "evolving"), "instance_type", "expected one of", False),
    ("instance_type_capitalised", set_at(["instance_type"], "Consistent"), "instance_type", "expected one of", False),
    ("checklist_missing", delete_at(["current_checklist"]), "current_checklist", "is missing", True),
    ("checklist_string", set_at(["current_checklist"], "Is it short?"), "current_checklist", "must be a list", True),
    ("checklist_empty", set_at(["current_checklist"], []), "current_checklist", "empty list", True),
    ("checklist_item_blank", set_at(["current_checklist", 1], ""), "current_checklist[1]", "non-empty string", True),
    ("checklist_item_number", set_at(["current_checklist", 0], 3), "current_checklist[0]", "non-empty string", True),
    ("checklist_item_null", set_at(["current_checklist", 0], None), "current_checklist[0]", "non-empty string", True),
    ("checklist_object", set_at(["current_checklist"], {"a": 1}), "current_checklist", "must be a list", True),
    ("priors_missing", delete_at(["prior_interactions"]), "prior_interactions", "is missing", True),
    ("priors_empty", set_at(["prior_interactions"], []), "prior_interactions", "empty list", True),
    ("priors_object", set_at(["prior_interactions"], {"0": {}}), "prior_interactions", "must be a list", True),
    ("prior_string", set_at(["prior_interactions", 1], "a session"), "prior_interactions[1]", "must be an object",
     True),
    ("prior_factor_missing", delete_at(["prior_interactions", 0, "context_factor"]),
     "prior_interactions[0].context_factor", "is missing", True),
    ("prior_preference_blank", set_at(["prior_interactions", 1, "contextual_preference"], ""),
     "prior_interactions[1].contextual_preference", "is empty", True),
    ("prior_preference_number", set_at(["prior_interactions", 0, "contextual_preference"], 1.5),
     "prior_interactions[0].contextual_preference", "must be a string", True),
    ("dialogue_missing", delete_at(["prior_interactions", 0, "dialogue"]), "prior_interactions[0].dialogue",
     "is missing", True),
    ("dialogue_empty", turns(1, []), "prior_interactions[1].dialogue", "empty list", True),
    ("dialogue_string", turns(0, "User: hi"), "prior_interactions[0].dialogue", "must be a list", True),
    ("dialogue_user_only", turns(0, [{"role": "user", "content": "hello?"}]), "prior_interactions[0].dialogue",
     "no assistant message", True),
    ("dialogue_starts_with_assistant", set_at(D0 + [0, "role"], "assistant"), "prior_interactions[0].dialogue[0].role",
     "must be 'user'", True),
    ("dialogue_all_turns_empty", turns(0, [{"role": "user", "content": ""}, {"role": "assistant", "content": " "}]),
     "prior_interactions[0].dialogue", "only empty turns", True),
    ("turn_string", set_at(D0 + [1], "assistant: ok"), "prior_interactions[0].dialogue[1]", "must be an object", True),
    ("turn_role_missing", delete_at(D0 + [1, "role"]), "prior_interactions[0].dialogue[1].role", "is missing", True),
    ("turn_role_system", set_at(D0 + [1, "role"], "system"), "prior_interactions[0].dialogue[1].role",
     "expected one of", True),
    ("turn_role_uppercase", set_at(D0 + [0, "role"], "User"), "prior_interactions[0].dialogue[0].role",
     "expected one of", True),
    ("turn_content_missing", delete_at(D0 + [1, "content"]), "prior_interactions[0].dialogue[1].content", "is missing",
     True),
    ("turn_content_number", set_at(D0 + [1, "content"], 3.5), "prior_interactions[0].dialogue[1].content",
     "must be a string", True),
    ("turn_content_list", set_at(D0 + [1, "content"], [{"type": "text", "text": "hi"}]),
     "prior_interactions[0].dialogue[1].content", "must be a string", True),
    ("row_is_a_list", lambda row: list(row), "<row>", "must be an object", False),
    ("row_is_a_string", lambda row: "a row", "<row>", "must be an object", False),
    ("row_is_null", lambda row: None, "<row>", "must be an object", False),
]

# (kind, raw line for line 2 of the file, field, message fragment)
RAW_KINDS: list[tuple[str, bytes, str, str]] = [
    ("truncated_json", json.dumps(make_row("7+bad_row")).encode()[:-40], "<row>", "is not valid JSON"),
    ("trailing_comma", b'{"persona_id": "7+bad_row",}', "<row>", "is not valid JSON"),
    ("single_quotes", b"{'persona_id': '7+bad_row'}", "<row>", "is not valid JSON"),
    ("invalid_utf8", json.dumps(make_row("7+bad_row")).encode().replace(b"factor A", b"factor \xff", 1), "<row>",
     "not valid UTF-8"),
    ("duplicate_key", json.dumps(make_row("7+bad_row")).encode()[:-1] + b', "current_request": "other"}', "<row>",
     "has the key 'current_request' twice"),
    ("nested_duplicate_key", json.dumps(make_row("7+bad_row")).encode().replace(
        b'"role": "user"', b'"role": "user", "role": "assistant"', 1), "<row>", "has the key 'role' twice"),
    ("nan_literal", json.dumps(make_row("7+bad_row")).encode()[:-1] + b', "extra": NaN}', "<row>", "holds NaN"),
    ("infinity_literal", json.dumps(make_row("7+bad_row")).encode()[:-1] + b', "x": -Infinity}', "<row>",
     "holds -Infinity"),
    ("two_rows_on_one_line", (json.dumps(make_row("7+bad_row")) + json.dumps(make_row("8+bad_row"))).encode(),
     "<row>", "is not valid JSON"),
]


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def good(persona: str) -> bytes:
    return json.dumps(make_row(persona)).encode()


def load(path: Path):
    return load_instances(DataConfig(name="local", source="local", path=str(path)))


def assert_one_line(data, where: str, field: str, fragment: str, key: str | None) -> None:
    assert [i.key for i in data.instances] == ["1+good/consistent", "2+good/consistent"]
    (err,) = data.errors
    text = str(err)
    assert text.startswith(f"{where}"), text
    assert f"field '{field}'" in text and fragment in text, text
    assert (f"[{key}]" in text) if key else ("7+bad_row/" not in text), text
    assert "\n" not in text and len(text) < 400


def test_the_suite_covers_at_least_fifty_kinds() -> None:
    assert len(ROW_KINDS) + len(RAW_KINDS) + len(FILE_KINDS) >= 50


@pytest.mark.parametrize("mutate,field,fragment,key_known", [k[1:] for k in ROW_KINDS], ids=[k[0] for k in ROW_KINDS])
def test_each_malformed_row_is_one_line_and_the_rest_loads(tmp_path, mutate, field, fragment, key_known) -> None:
    bad = mutate(copy.deepcopy(make_row("7+bad_row")))
    path = write_lines(tmp_path / "rows.jsonl", [good("1+good"), json.dumps(bad).encode(), good("2+good")])
    assert_one_line(load(path), "rows.jsonl:2", field, fragment, KEY if key_known else None)


@pytest.mark.parametrize("raw,field,fragment", [k[1:] for k in RAW_KINDS], ids=[k[0] for k in RAW_KINDS])
def test_each_malformed_line_is_one_line_and_the_rest_loads(tmp_path, raw, field, fragment) -> None:
    path = write_lines(tmp_path / "rows.jsonl", [good("1+good"), raw, good("2+good")])
    assert_one_line(load(path), "rows.jsonl:2", field, fragment, None)


def _bom(tmp_path: Path) -> Path:
    return write_lines(tmp_path / "bom.jsonl", [b"\xef\xbb\xbf" + good("1+good"), good("2+good")])


def _crlf(tmp_path: Path) -> Path:
    path = tmp_path / "crlf.jsonl"
    path.write_bytes(good("1+good") + b"\r\n" + good("2+good") + b"\r\n")
    return path


def _extra_fields(tmp_path: Path) -> Path:
    row = make_row("1+good")
    row["annotator_notes"] = "fine"
    return write_lines(tmp_path / "extra.jsonl", [json.dumps(row).encode(), good("2+good")])


def _bom_json(tmp_path: Path) -> Path:
    path = tmp_path / "rows.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps([make_row("1+good"), make_row("2+good")]).encode())
    return path


# (kind, builder of a path whose two valid rows must load as they are)
HARMLESS: list[tuple[str, Callable[[Path], Path]]] = [("utf8_bom", _bom), ("crlf_line_ends", _crlf),
                                                     ("extra_fields", _extra_fields), ("bom_json_file", _bom_json)]


@pytest.mark.parametrize("build", [h[1] for h in HARMLESS], ids=[h[0] for h in HARMLESS])
def test_harmless_variants_load_every_row(tmp_path, build) -> None:
    data = load(build(tmp_path))
    assert [i.key for i in data.instances] == ["1+good/consistent", "2+good/consistent"] and not data.errors


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "rows.jsonl"
    os.mkfifo(path)
    return path


def _corrupt_parquet(tmp_path: Path) -> Path:
    path = tmp_path / "rows.parquet"
    path.write_bytes(b"PAR1 this is not a parquet body PAR1")
    return path


def _only_bad_rows(tmp_path: Path) -> Path:
    return write_lines(tmp_path / "rows.jsonl", [b"{", b'{"persona_id": 1}'])


def _json_object_of_garbage(tmp_path: Path) -> Path:
    path = tmp_path / "rows.json"
    path.write_text('{"not": "a row"}', encoding="utf-8")
    return path


# (kind, builder of a bad path, message fragment): the whole input is refused, in one line, before any call
FILE_KINDS: list[tuple[str, Callable[[Path], Path], str]] = [
    ("named_pipe", _fifo, "is not a regular file or directory"),
    ("corrupt_parquet", _corrupt_parquet, "cannot be read as parquet"),
    ("no_valid_row", _only_bad_rows, "has no valid row (2 bad rows; the first: rows.jsonl:1"),
    ("nonexistent", lambda p: p / "missing.jsonl", "does not exist"),
    ("empty_dir", lambda p: p, "holds no .jsonl/.json/.parquet files"),
    ("wrong_suffix", lambda p: (p / "rows.csv").write_text("a,b") and p / "rows.csv", "has unsupported suffix"),
    ("json_object_not_a_row", _json_object_of_garbage, "has no valid row"),
]


@pytest.mark.parametrize("build,fragment", [k[1:] for k in FILE_KINDS], ids=[k[0] for k in FILE_KINDS])
def test_bad_inputs_are_refused_in_one_line_without_hanging(tmp_path, build, fragment) -> None:
    path = build(tmp_path)
    with pytest.raises(DataError) as err:
        load(path)
    assert fragment in str(err.value) and "\n" not in str(err.value)
