"""load_instances: the shipped samples, local files in every supported format, and a corpus of bad rows.

Every malformed row must become exactly one DataError that names where it is and which
field is wrong, and the valid rows around it must still load.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path
from typing import Callable

import pandas as pd
import pytest

from cupid_exp.config import ConfigError, DataConfig
from cupid_exp.data.loading import SAMPLE_FULL_PATH, SAMPLE_PATH, load_instances
from cupid_exp.data.schema import INSTANCE_TYPES, DataError
from cupid_exp.testing.cupid_data import delete_at, set_at

SAMPLE_PERSONAS = {"1+high_school_chemistry_teacher", "2+freelance_landscape_architect", "3+community_pharmacist"}


def sample_cfg(**kw) -> DataConfig:
    return DataConfig(name="sample", source="sample", **kw)


def full_cfg(**kw) -> DataConfig:
    """The 9-row sample (three personas x three types); data=sample is its first 3 rows."""
    return DataConfig(name="local", source="local", path=str(SAMPLE_FULL_PATH), **kw)


def local_cfg(path: Path, **kw) -> DataConfig:
    return DataConfig(name="local", source="local", path=str(path), **kw)


def sample_rows() -> list[dict]:
    """The rows of the 9-row sample."""
    return [json.loads(line) for line in SAMPLE_FULL_PATH.read_text(encoding="utf-8").splitlines() if line.strip()]


def make_row(persona_id: str, instance_type: str = "consistent") -> dict:
    return {
        "persona_id": persona_id,
        "instance_type": instance_type,
        "current_request": f"Request from {persona_id}",
        "current_context_factor": "factor A",
        "current_contextual_preference": "The user wants short answers for factor A.",
        "current_checklist": ["Is the answer short?", "Does it mention factor A?"],
        "prior_interactions": [
            {
                "context_factor": "factor A",
                "contextual_preference": "The user wants short answers for factor A.",
                "dialogue": [
                    {"role": "user", "content": "Help with factor A."},
                    {"role": "assistant", "content": "A long answer."},
                    {"role": "user", "content": "Shorter, please."},
                ],
            },
            {
                "context_factor": "factor B",
                "contextual_preference": "The user wants tables for factor B.",
                "dialogue": [
                    {"role": "user", "content": "Help with factor B."},
                    {"role": "assistant", "content": "Here is a table."},
                ],
            },
        ],
    }


# ---------------------------------------------------------------- the shipped sample


def test_demo_sample_is_one_persona_by_three_types_the_full_samples_first_rows():
    data = load_instances(sample_cfg())
    assert len(data.instances) == 3
    assert data.errors == []
    assert data.n_rows == 3
    assert [i.key for i in data.instances] == [f"1+high_school_chemistry_teacher/{t}" for t in INSTANCE_TYPES]
    assert data.source == str(SAMPLE_PATH)
    assert data.instances == load_instances(full_cfg()).instances[:3]


def test_full_sample_loads_nine_instances_three_personas_by_three_types():
    data = load_instances(full_cfg())
    assert len(data.instances) == 9
    assert data.errors == []
    assert data.n_rows == 9
    assert {i.persona_id for i in data.instances} == SAMPLE_PERSONAS
    assert Counter(i.instance_type for i in data.instances) == {t: 3 for t in INSTANCE_TYPES}
    pairs = {(i.persona_id, i.instance_type) for i in data.instances}
    assert len(pairs) == 9  # every persona has every type
    assert data.source == str(SAMPLE_FULL_PATH)


def test_full_sample_keys_are_unique_persona_slash_type():
    data = load_instances(full_cfg())
    keys = [i.key for i in data.instances]
    assert len(set(keys)) == 9
    assert all(k == f"{i.persona_id}/{i.instance_type}" for k, i in zip(keys, data.instances, strict=False))
    assert "1+high_school_chemistry_teacher/changing" in keys
    # persona_id alone is NOT unique (upstream's collision): each repeats 3 times
    assert Counter(i.persona_id for i in data.instances) == {p: 3 for p in SAMPLE_PERSONAS}


def test_sample_rows_have_eight_priors_each_starting_with_user():
    for inst in load_instances(full_cfg()).instances:  # the demo's rows are its first 3
        assert len(inst.prior_interactions) == 8, inst.key
        assert inst.current_checklist, inst.key
        for session in inst.prior_interactions:
            assert session.dialogue[0].role == "user"
            assert any(m.role == "assistant" for m in session.dialogue)


def test_digest_is_stable_and_independent_of_source_path(tmp_path):
    a, b = load_instances(sample_cfg()), load_instances(sample_cfg())
    assert a.digest == b.digest
    assert len(a.digest) == 16 and int(a.digest, 16) >= 0
    copy_path = tmp_path / "copy.jsonl"
    copy_path.write_bytes(SAMPLE_PATH.read_bytes())
    assert load_instances(local_cfg(copy_path)).digest == a.digest
    assert load_instances(full_cfg()).digest != a.digest


def test_digest_changes_when_one_row_changes(tmp_path):
    base = load_instances(full_cfg()).digest
    rows = sample_rows()
    rows[4]["current_checklist"][0] += " (edited)"
    path = tmp_path / "edited.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    edited = load_instances(local_cfg(path))
    assert len(edited.instances) == 9
    assert edited.digest != base


def test_digest_changes_when_a_dialogue_turn_changes(tmp_path):
    base = load_instances(full_cfg()).digest
    rows = sample_rows()
    rows[0]["prior_interactions"][7]["dialogue"][-1]["content"] += "!"
    path = tmp_path / "edited.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    assert load_instances(local_cfg(path)).digest != base


def test_digest_depends_on_row_order(tmp_path):
    base = load_instances(full_cfg()).digest
    rows = sample_rows()
    rows[0], rows[1] = rows[1], rows[0]
    path = tmp_path / "swapped.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    assert load_instances(local_cfg(path)).digest != base


def test_sample_written_as_parquet_loads_identically(tmp_path):
    path = tmp_path / "sample.parquet"
    pd.DataFrame(sample_rows()).to_parquet(path)
    data = load_instances(local_cfg(path))
    assert data.errors == []
    assert len(data.instances) == 9
    assert data.instances == load_instances(full_cfg()).instances
    assert data.digest == load_instances(full_cfg()).digest


def test_sample_as_json_list_and_directory_load_identically(tmp_path):
    rows = sample_rows()
    (tmp_path / "all.json").write_text(json.dumps(rows), encoding="utf-8")
    expected = load_instances(full_cfg())
    as_list = load_instances(local_cfg(tmp_path / "all.json"))
    assert as_list.digest == expected.digest and as_list.errors == []
    folder = tmp_path / "per_instance"
    folder.mkdir()
    for i, row in enumerate(rows):
        (folder / f"{i:02d}.json").write_text(json.dumps(row), encoding="utf-8")
    (folder / "README.md").write_text("not data")  # ignored: unsupported suffix in a directory
    as_dir = load_instances(local_cfg(folder))
    assert as_dir.errors == []
    assert [i.key for i in as_dir.instances] == [i.key for i in expected.instances]
    assert as_dir.digest == expected.digest


# ---------------------------------------------------------------- filters


def test_instance_types_filter():
    data = load_instances(full_cfg(instance_types=["changing"]))
    assert len(data.instances) == 3
    assert {i.instance_type for i in data.instances} == {"changing"}
    two = load_instances(full_cfg(instance_types=["consistent", "contrastive"]))
    assert Counter(i.instance_type for i in two.instances) == {"consistent": 3, "contrastive": 3}


def test_limit_keeps_file_order():
    data = load_instances(full_cfg(limit=2))
    assert [i.key for i in data.instances] == [
        "1+high_school_chemistry_teacher/consistent",
        "1+high_school_chemistry_teacher/contrastive",
    ]
    assert load_instances(full_cfg(limit=0)).instances == []
    assert len(load_instances(full_cfg(limit=100)).instances) == 9


def test_limit_applies_after_type_filter():
    data = load_instances(full_cfg(instance_types=["changing"], limit=2))
    assert [i.key for i in data.instances] == [
        "1+high_school_chemistry_teacher/changing",
        "2+freelance_landscape_architect/changing",
    ]


def test_unknown_instance_type_in_filter_is_a_config_error():
    with pytest.raises(ConfigError, match="evolving"):
        sample_cfg(instance_types=["changing", "evolving"]).check("data")


def test_a_filter_that_keeps_nothing_is_an_error(tmp_path):
    rows = [r for r in sample_rows() if r["instance_type"] != "changing"]
    path = tmp_path / "no_changing.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match="no instance of data.instance_types=.'changing'."):
        load_instances(local_cfg(path, instance_types=["changing"]))


# ---------------------------------------------------------------- config / path errors


def test_local_without_path_raises():
    with pytest.raises(DataError, match="data.path"):
        load_instances(DataConfig(name="local", source="local"))
    with pytest.raises(ConfigError, match="data.path"):
        DataConfig(name="local", source="local").check("data")


def test_unknown_source_is_a_config_error():
    with pytest.raises(ConfigError, match="ftp"):
        DataConfig(name="x", source="ftp").check("data")


def test_missing_path_is_one_line(tmp_path):
    with pytest.raises(DataError, match="nope.jsonl: field '<path>' does not exist"):
        load_instances(local_cfg(tmp_path / "nope.jsonl"))


def test_directory_without_data_files_is_one_line(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(DataError, match="holds no .jsonl/.json/.parquet files"):
        load_instances(local_cfg(tmp_path))


def test_unsupported_suffix_is_one_line(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("persona_id\n1")
    with pytest.raises(DataError, match="rows.csv: field '<path>' has unsupported suffix"):
        load_instances(local_cfg(path))


# ---------------------------------------------------------------- the malformed corpus

BAD_PERSONA = "7+bad_row"
BAD_KEY = f"{BAD_PERSONA}/consistent"


# (id, mutation of a valid row with persona BAD_PERSONA, field named, key known?, representable in parquet?)
ROW_CASES: list[tuple[str, Callable[[dict], object], str, bool, bool]] = [
    ("missing_field", delete_at(["current_request"]), "current_request", True, True),
    ("wrong_type_checklist_string", set_at(["current_checklist"], "Is it short?"), "current_checklist", True, False),
    ("empty_checklist", set_at(["current_checklist"], []), "current_checklist", True, True),
    ("unknown_instance_type", set_at(["instance_type"], "evolving"), "instance_type", False, True),
    ("unknown_role", set_at(["prior_interactions", 0, "dialogue", 1, "role"], "system"),
     "prior_interactions[0].dialogue[1].role", True, True),
    ("dialogue_starts_with_assistant", set_at(["prior_interactions", 1, "dialogue", 0, "role"], "assistant"),
     "prior_interactions[1].dialogue[0].role", True, True),
    ("empty_dialogue", set_at(["prior_interactions", 1, "dialogue"], []), "prior_interactions[1].dialogue", True,
     True),
    ("non_object_row", lambda row: "not a row", "<row>", False, False),
]


def _bad_row(mutate) -> object:
    return mutate(copy.deepcopy(make_row(BAD_PERSONA)))


def _assert_one_error(data, location: str, field: str, key_known: bool, key: str = BAD_KEY):
    assert [i.key for i in data.instances] == ["1+good/consistent", "2+good/changing"]
    assert len(data.errors) == 1, [str(e) for e in data.errors]
    err = data.errors[0]
    assert isinstance(err, DataError)
    text = str(err)
    assert text.startswith(location), text
    assert f"field '{field}'" in text
    if key_known:
        assert f"[{key}]" in text
    else:
        assert key not in text
    assert data.n_rows == 3


def _good_rows() -> tuple[dict, dict]:
    return make_row("1+good", "consistent"), make_row("2+good", "changing")


@pytest.mark.parametrize("mutate,field,key_known", [c[1:4] for c in ROW_CASES], ids=[c[0] for c in ROW_CASES])
def test_bad_row_in_jsonl(tmp_path, mutate, field, key_known):
    first, last = _good_rows()
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (first, _bad_row(mutate), last)) + "\n", encoding="utf-8")
    _assert_one_error(load_instances(local_cfg(path)), "rows.jsonl:2", field, key_known)


@pytest.mark.parametrize("mutate,field,key_known", [c[1:4] for c in ROW_CASES], ids=[c[0] for c in ROW_CASES])
def test_bad_row_in_json_list(tmp_path, mutate, field, key_known):
    first, last = _good_rows()
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([first, _bad_row(mutate), last]), encoding="utf-8")
    _assert_one_error(load_instances(local_cfg(path)), "rows.json[1]", field, key_known)


@pytest.mark.parametrize("mutate,field,key_known", [c[1:4] for c in ROW_CASES], ids=[c[0] for c in ROW_CASES])
def test_bad_row_in_directory_of_json_files(tmp_path, mutate, field, key_known):
    first, last = _good_rows()
    (tmp_path / "a.json").write_text(json.dumps(first), encoding="utf-8")
    (tmp_path / "b.json").write_text(json.dumps(_bad_row(mutate)), encoding="utf-8")
    (tmp_path / "c.json").write_text(json.dumps(last), encoding="utf-8")
    _assert_one_error(load_instances(local_cfg(tmp_path)), "b.json", field, key_known)


PARQUET_CASES = [c for c in ROW_CASES if c[4]]


@pytest.mark.parametrize("mutate,field,key_known", [c[1:4] for c in PARQUET_CASES],
                         ids=[c[0] for c in PARQUET_CASES])
def test_bad_row_in_parquet(tmp_path, mutate, field, key_known):
    first, last = _good_rows()
    bad = _bad_row(mutate)
    bad.setdefault("current_request", None)  # a missing column value is a null cell in parquet
    path = tmp_path / "rows.parquet"
    pd.DataFrame([first, bad, last]).to_parquet(path)
    data = load_instances(local_cfg(path))
    _assert_one_error(data, "rows.parquet row 1", field, key_known)


def test_missing_field_in_parquet_is_reported_as_missing(tmp_path):
    first, last = _good_rows()
    bad = make_row(BAD_PERSONA)
    bad["current_contextual_preference"] = None
    path = tmp_path / "rows.parquet"
    pd.DataFrame([first, bad, last]).to_parquet(path)
    data = load_instances(local_cfg(path))
    assert len(data.errors) == 1
    assert data.errors[0].field == "current_contextual_preference"
    assert data.errors[0].problem == "is missing"


def test_duplicate_key_in_jsonl_keeps_first(tmp_path):
    first, last = _good_rows()
    dup = make_row("1+good", "consistent")
    dup["current_request"] = "a different request"
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (first, dup, last)), encoding="utf-8")
    data = load_instances(local_cfg(path))
    _assert_one_error(data, "rows.jsonl:2", "persona_id+instance_type", True, key="1+good/consistent")
    assert "rows.jsonl:1" in data.errors[0].problem  # points at the first occurrence
    assert data.instances[0].current_request == "Request from 1+good"


def test_duplicate_key_in_parquet(tmp_path):
    first, last = _good_rows()
    path = tmp_path / "rows.parquet"
    pd.DataFrame([first, make_row("1+good", "consistent"), last]).to_parquet(path)
    _assert_one_error(load_instances(local_cfg(path)), "rows.parquet row 1", "persona_id+instance_type", True,
                      key="1+good/consistent")


def test_duplicate_key_across_directory_files(tmp_path):
    first, last = _good_rows()
    (tmp_path / "a.json").write_text(json.dumps(first), encoding="utf-8")
    (tmp_path / "b.json").write_text(json.dumps(make_row("1+good", "consistent")), encoding="utf-8")
    (tmp_path / "c.jsonl").write_text(json.dumps(last), encoding="utf-8")
    _assert_one_error(load_instances(local_cfg(tmp_path)), "b.json", "persona_id+instance_type", True,
                      key="1+good/consistent")


def test_invalid_json_line(tmp_path):
    first, last = _good_rows()
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(first) + "\n" + '{"persona_id": "7+bad_row", \n' + json.dumps(last) + "\n",
                    encoding="utf-8")
    data = load_instances(local_cfg(path))
    _assert_one_error(data, "rows.jsonl:2", "<row>", False)
    assert "not valid JSON" in data.errors[0].problem


def test_invalid_utf8_line(tmp_path):
    first, last = _good_rows()
    bad = json.dumps(make_row(BAD_PERSONA)).encode("utf-8").replace(b"factor A", b"factor \xff\xfe", 1)
    path = tmp_path / "rows.jsonl"
    path.write_bytes(json.dumps(first).encode() + b"\n" + bad + b"\n" + json.dumps(last).encode() + b"\n")
    data = load_instances(local_cfg(path))
    _assert_one_error(data, "rows.jsonl:2", "<row>", False)
    assert "UTF-8" in data.errors[0].problem


def test_blank_lines_in_jsonl_are_skipped_but_line_numbers_kept(tmp_path):
    first, last = _good_rows()
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(first) + "\n\n   \n" + json.dumps(_bad_row(set_at(["current_checklist"], [])))
                    + "\n" + json.dumps(last) + "\n", encoding="utf-8")
    _assert_one_error(load_instances(local_cfg(path)), "rows.jsonl:4", "current_checklist", True)


def test_unreadable_files_in_a_directory(tmp_path):
    """Invalid JSON, invalid UTF-8 and an empty file: one error each, the good files still load."""
    first, last = _good_rows()
    (tmp_path / "a.json").write_text(json.dumps(first), encoding="utf-8")
    (tmp_path / "b.json").write_text('{"persona_id": "7+bad_row",', encoding="utf-8")
    (tmp_path / "c.json").write_bytes(b'{"persona_id": "\xff"}')
    (tmp_path / "d.json").write_bytes(b"")
    (tmp_path / "e.jsonl").write_bytes(b"")
    (tmp_path / "f.json").write_text(json.dumps(last), encoding="utf-8")
    data = load_instances(local_cfg(tmp_path))
    assert [i.key for i in data.instances] == ["1+good/consistent", "2+good/changing"]
    texts = sorted(str(e) for e in data.errors)
    assert len(texts) == 4, texts
    assert [t.split(":")[0] for t in texts] == ["b.json", "c.json", "d.json", "e.jsonl"]
    assert all("field '<file>'" in t for t in texts)


@pytest.mark.parametrize("name,content", [
    ("empty.jsonl", b""),
    ("blank.jsonl", b"\n  \n\n"),
    ("empty.json", b""),
    ("empty_list.json", b"[]"),
])
def test_empty_file_is_one_error(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DataError) as err:
        load_instances(local_cfg(path))
    assert "has no valid row (1 bad rows; the first: " in str(err.value)
    assert f"{name}: field '<file>' is empty" in str(err.value) and "\n" not in str(err.value)


def test_empty_parquet_is_one_error(tmp_path):
    path = tmp_path / "empty.parquet"
    pd.DataFrame(sample_rows()).iloc[:0].to_parquet(path)
    with pytest.raises(DataError, match="empty.parquet: field '<file>' is empty"):
        load_instances(local_cfg(path))


def test_whole_corpus_in_one_file_one_error_per_bad_row(tmp_path):
    """Every malformed kind together: exactly one error per bad line, each at its own line."""
    first, last = _good_rows()
    lines = [json.dumps(first).encode()]
    for _, mutate, *_ in ROW_CASES:
        lines.append(json.dumps(_bad_row(mutate)).encode())
    lines.append(b"{not json")
    lines.append(b'{"persona_id": "\xc3\x28"}')
    lines.append(json.dumps(make_row("1+good", "consistent")).encode())  # duplicate
    lines.append(json.dumps(last).encode())
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    data = load_instances(local_cfg(path))
    assert [i.key for i in data.instances] == ["1+good/consistent", "2+good/changing"]
    n_bad = len(ROW_CASES) + 3
    assert len(data.errors) == n_bad
    assert [e.where.split(" ")[0] for e in data.errors] == [f"corpus.jsonl:{n}" for n in range(2, 2 + n_bad)]


def test_strict_raises_before_returning(tmp_path):
    first, last = _good_rows()
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (first, _bad_row(set_at(["current_checklist"], [])), last,
                                                       "oops")), encoding="utf-8")
    assert len(load_instances(local_cfg(path)).errors) == 2
    with pytest.raises(DataError) as info:
        load_instances(local_cfg(path, strict=True))
    err = info.value
    assert err.where.startswith("rows.jsonl:2")
    assert err.field == "current_checklist"
    assert "1 more bad rows" in str(err)


def test_strict_with_clean_data_returns():
    assert len(load_instances(full_cfg(strict=True)).instances) == 9
    assert len(load_instances(sample_cfg(strict=True)).instances) == 3
