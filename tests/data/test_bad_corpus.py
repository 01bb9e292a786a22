"""A corpus of malformed inputs, through the real CLI: one clear log line per bad input naming where it is,
the instance key when it can be known, and the field; the valid rows (a 5 MB one included) still run;
``data.strict=true`` stops before the first model call. The loader's own cases live in test_loading.py;
this reuses them and adds the rest of the corpus."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from helpers.cli_runner import cli_command, job_dirs, metrics_of, read_jsonl, run_job
from test_loading import BAD_KEY, ROW_CASES, _bad_row, make_row

from cupid_exp.testing.cupid_data import delete_at, make_rows, set_at
from cupid_exp.testing.inprocess import InProcessModel

pytestmark = pytest.mark.slow


def _mutated(persona: str, mutate) -> object:
    return mutate(copy.deepcopy(make_row(persona)))


# (label, raw line or row, field named, key named in the line or None)
EXTRA_ROWS: list[tuple[str, object, str, str | None]] = [
    ("one_sided_dialogue", _mutated("51+bad", set_at(["prior_interactions", 0, "dialogue"],
                                                    [{"role": "user", "content": "Hello?"}])),
     "prior_interactions[0].dialogue", "51+bad/consistent"),
    ("checklist_item_not_text", _mutated("52+bad", set_at(["current_checklist", 0], 7)), "current_checklist[0]",
     "52+bad/consistent"),
    ("missing_persona_id", _mutated("53+bad", delete_at(["persona_id"])), "persona_id", None),
    ("persona_id_not_text", _mutated("54+bad", set_at(["persona_id"], 54)), "persona_id", None),
    ("empty_preference", _mutated("55+bad", set_at(["current_contextual_preference"], "  ")),
     "current_contextual_preference", "55+bad/consistent"),
    ("turn_content_not_text", _mutated("56+bad", set_at(["prior_interactions", 0, "dialogue", 1, "content"], 3.5)),
     "prior_interactions[0].dialogue[1].content", "56+bad/consistent"),
    ("turn_without_role", _mutated("57+bad", delete_at(["prior_interactions", 0, "dialogue", 0, "role"])),
     "prior_interactions[0].dialogue[0].role", "57+bad/consistent"),
    ("no_prior_sessions", _mutated("58+bad", set_at(["prior_interactions"], [])), "prior_interactions",
     "58+bad/consistent"),
    ("prior_sessions_not_a_list", _mutated("59+bad", set_at(["prior_interactions"], {"0": "x"})),
     "prior_interactions", "59+bad/consistent"),
    ("session_not_an_object", _mutated("60+bad", set_at(["prior_interactions", 0], "session")),
     "prior_interactions[0]", "60+bad/consistent"),
    ("null_instance_type", _mutated("61+bad", set_at(["instance_type"], None)), "instance_type", None),
    ("row_is_a_list", ["persona_id", "62+bad"], "<row>", None),
    ("invalid_json", b'{"persona_id": "63+bad", "instance_type": "consistent",', "<row>", None),
    ("invalid_utf8", json.dumps(make_row("64+bad")).encode().replace(b"factor A", b"factor \xc3\x28", 1), "<row>",
     None),
    ("duplicate_json_key", json.dumps(make_row("65+bad")).encode()[:-1] + b', "current_request": "again"}', "<row>",
     None),
    ("nan_literal", json.dumps(make_row("66+bad")).encode()[:-1] + b', "score": NaN}', "<row>", None),
    ("all_turns_empty", _mutated("67+bad", set_at(["prior_interactions", 1, "dialogue"],
                                                [{"role": "user", "content": " "},
                                                 {"role": "assistant", "content": ""}])),
     "prior_interactions[1].dialogue", "67+bad/consistent"),
]


def build_corpus(folder: Path) -> tuple[list[str], list[tuple[str, str, str | None]]]:
    """Valid keys in load order, and per bad input (where, field, key or None)."""
    folder.mkdir()
    valid = make_rows(4)
    huge = make_rows(1, start=200)[0]
    huge["prior_interactions"][0]["dialogue"][1]["content"] = "lorem ipsum dolor " * 300_000  # 5.4 MB
    lines: list[bytes] = []
    expected: list[tuple[str, str, str | None]] = []

    def add(raw: object, field: str, key: str | None) -> None:
        lines.append(raw if isinstance(raw, bytes) else json.dumps(raw).encode())
        expected.append((f"rows.jsonl:{len(lines)}", field, key))

    for i, row in enumerate(valid):
        lines.append(json.dumps(row).encode())
        label, mutate, field, key_known, _ = ROW_CASES[2 * i]
        add(_bad_row(mutate), field, BAD_KEY if key_known else None)
        label, mutate, field, key_known, _ = ROW_CASES[2 * i + 1]
        add(_bad_row(mutate), field, BAD_KEY if key_known else None)
    for _label, raw, field, key in EXTRA_ROWS:
        add(raw, field, key)
    duplicate = copy.deepcopy(valid[1])
    duplicate["current_request"] = "a different request under the same key"
    add(duplicate, "persona_id+instance_type", f"{valid[1]['persona_id']}/{valid[1]['instance_type']}")
    (folder / "rows.jsonl").write_bytes(b"\xef\xbb\xbf" + b"\n".join(lines) + b"\n")  # a BOM loses no row
    (folder / "huge.jsonl").write_text(json.dumps(huge) + "\n", encoding="utf-8")
    (folder / "empty.jsonl").write_bytes(b"")
    (folder / "blank.jsonl").write_bytes(b"\n   \n\n")
    (folder / "empty.json").write_bytes(b"")
    expected = [("blank.jsonl", "<file>", None), ("empty.json", "<file>", None), ("empty.jsonl", "<file>", None),
                *expected]
    keys = [f"{huge['persona_id']}/{huge['instance_type']}"] + [f"{r['persona_id']}/{r['instance_type']}"
                                                                  for r in valid]
    return keys, expected


def bad_lines(output: str) -> list[str]:
    return re.findall(r"bad data row: (.*)$", output, re.MULTILINE)


def test_malformed_corpus_is_reported_line_by_line_and_valid_rows_run(tmp_path: Path) -> None:
    keys, expected = build_corpus(tmp_path / "corpus")
    assert len(expected) >= 20
    root = tmp_path / "out"
    with InProcessModel() as stub:
        proc = run_job(cli_command(stub, root, "tracking=none", cache_dir=tmp_path / "cache",
                                   data=tmp_path / "corpus"), timeout=180)
        assert stub.stats()["received"]["infer"] == len(keys)

    lines = bad_lines(proc.stdout + proc.stderr)
    assert len(lines) == len(expected), "\n".join(lines)
    for line, (where, field, key) in zip(lines, expected, strict=False):
        assert line.startswith(where + " ") or line.startswith(where + ":"), (line, where)
        assert f"field '{field}'" in line, (line, field)
        if key is not None:
            assert f"[{key}]" in line, (line, key)
        assert len(line) < 400  # one clear line, not a dump of the row

    (job,) = job_dirs(root)
    records = read_jsonl(job / "instances.jsonl")
    assert [r["key"] for r in records] == keys  # the valid rows ran, the 5 MB one included
    assert all(not r["errors"] and 0 <= r["f1"] <= 1 for r in records)
    assert records[0]["history_words"] > 900_000
    assert metrics_of(job)["data/bad_rows"] == len(expected)
    assert f"bad data rows skipped: {len(expected)}" in proc.stdout


def test_strict_stops_before_the_first_model_call(tmp_path: Path) -> None:
    build_corpus(tmp_path / "corpus")
    root = tmp_path / "out"
    with InProcessModel() as stub:
        proc = run_job(cli_command(stub, root, "tracking=none", "data.strict=true", cache_dir=tmp_path / "cache",
                                   data=tmp_path / "corpus"), check=False)
        assert stub.stats()["total_received"] == 0
    assert proc.returncode == 2
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("cupid_exp:")]
    assert "data.strict=true" in line and "blank.jsonl: field '<file>'" in line and "Traceback" not in proc.stderr
    assert not job_dirs(root)
