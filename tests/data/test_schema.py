"""validate_row: one valid row in, an Instance out; one defect in, one DataError naming where and what."""

from __future__ import annotations

import copy

import pytest

from cupid_exp.data.schema import (
    INSTANCE_TYPES,
    DataError,
    Instance,
    Message,
    PriorSession,
    normalize_text,
    validate_row,
)

WHERE = "rows.jsonl:7"


def make_row(persona_id: str = "9+test_persona", instance_type: str = "consistent") -> dict:
    return {
        "persona_id": persona_id,
        "instance_type": instance_type,
        "current_request": "Draft the agenda for Monday's meeting.",
        "current_context_factor": "the Monday team meeting",
        "current_contextual_preference": "For Monday meetings the user wants a five-item agenda with timings.",
        "current_checklist": ["Does the agenda have five items?", "Does each item have a timing?"],
        "prior_interactions": [
            {
                "context_factor": "the Monday team meeting",
                "contextual_preference": "For Monday meetings the user wants a five-item agenda with timings.",
                "dialogue": [
                    {"role": "user", "content": "Agenda please."},
                    {"role": "assistant", "content": "1. Intro"},
                    {"role": "user", "content": "Add timings."},
                ],
            },
            {
                "context_factor": "a client email",
                "contextual_preference": "Client emails should be short.",
                "dialogue": [
                    {"role": "user", "content": "Email the client."},
                    {"role": "assistant", "content": ""},  # empty content is allowed
                ],
            },
        ],
    }


def test_valid_row_becomes_instance_with_tuples_and_key():
    inst = validate_row(make_row(), WHERE)
    assert isinstance(inst, Instance)
    assert inst.key == "9+test_persona/consistent"
    assert inst.current_checklist == ("Does the agenda have five items?", "Does each item have a timing?")
    assert len(inst.prior_interactions) == 2
    first = inst.prior_interactions[0]
    assert isinstance(first, PriorSession)
    assert first.context_factor == "the Monday team meeting"
    assert first.dialogue[0] == Message(role="user", content="Agenda please.")
    assert [m.role for m in first.dialogue] == ["user", "assistant", "user"]
    assert inst.prior_interactions[1].dialogue[1].content == ""
    # to_dict round-trips every field (the loader hashes it for the digest)
    d = inst.to_dict()
    assert d["persona_id"] == "9+test_persona"
    assert d["prior_interactions"][1]["dialogue"][0] == {"role": "user", "content": "Email the client."}


@pytest.mark.parametrize("itype", INSTANCE_TYPES)
def test_every_instance_type_is_accepted(itype):
    assert validate_row(make_row(instance_type=itype), WHERE).instance_type == itype


def test_instance_types_are_the_three_cupid_types():
    assert set(INSTANCE_TYPES) == {"consistent", "contrastive", "changing"}


def _mutate(path, value=None, delete=False):
    """Return a function that sets (or deletes) row[path...]."""

    def apply(row):
        target = row
        for part in path[:-1]:
            target = target[part]
        if delete:
            del target[path[-1]]
        else:
            target[path[-1]] = value
        return row

    return apply


KEY = "9+test_persona/consistent"

# (id, mutation, expected field, substring of the problem, key expected in the location?)
BAD_ROWS = [
    ("missing_request", _mutate(["current_request"], delete=True), "current_request", "is missing", True),
    ("null_preference", _mutate(["current_contextual_preference"], None),
     "current_contextual_preference", "is missing", True),
    ("blank_factor", _mutate(["current_context_factor"], "   "), "current_context_factor", "is empty", True),
    ("request_is_int", _mutate(["current_request"], 42), "current_request", "must be a string, got int", True),
    ("checklist_is_string", _mutate(["current_checklist"], "Is it short?"),
     "current_checklist", "must be a list, got str", True),
    ("empty_checklist", _mutate(["current_checklist"], []), "current_checklist", "is an empty list", True),
    ("blank_checklist_item", _mutate(["current_checklist", 1], " "),
     "current_checklist[1]", "non-empty string", True),
    ("checklist_item_not_str", _mutate(["current_checklist", 0], 3), "current_checklist[0]", "non-empty string",
     True),
    ("missing_priors", _mutate(["prior_interactions"], delete=True), "prior_interactions", "is missing", True),
    ("empty_priors", _mutate(["prior_interactions"], []), "prior_interactions", "is an empty list", True),
    ("prior_not_object", _mutate(["prior_interactions", 1], "session"), "prior_interactions[1]",
     "must be an object, got str", True),
    ("prior_missing_factor", _mutate(["prior_interactions", 0, "context_factor"], delete=True),
     "prior_interactions[0].context_factor", "is missing", True),
    ("empty_dialogue", _mutate(["prior_interactions", 1, "dialogue"], []),
     "prior_interactions[1].dialogue", "is an empty list", True),
    ("unknown_role", _mutate(["prior_interactions", 0, "dialogue", 1, "role"], "system"),
     "prior_interactions[0].dialogue[1].role", "'system'", True),
    ("turn_not_object", _mutate(["prior_interactions", 0, "dialogue", 2], "hi"),
     "prior_interactions[0].dialogue[2]", "must be an object", True),
    ("turn_missing_content", _mutate(["prior_interactions", 0, "dialogue", 0, "content"], delete=True),
     "prior_interactions[0].dialogue[0].content", "is missing", True),
    ("starts_with_assistant", _mutate(["prior_interactions", 1, "dialogue", 0, "role"], "assistant"),
     "prior_interactions[1].dialogue[0].role", "must be 'user'", True),
    ("no_assistant_turn", _mutate(["prior_interactions", 1, "dialogue", 1, "role"], "user"),
     "prior_interactions[1].dialogue", "has no assistant message", True),
    ("unknown_instance_type", _mutate(["instance_type"], "evolving"), "instance_type", "'evolving'", False),
    ("missing_instance_type", _mutate(["instance_type"], delete=True), "instance_type", "is missing", False),
    ("missing_persona_id", _mutate(["persona_id"], delete=True), "persona_id", "is missing", False),
]


@pytest.mark.parametrize("mutate,field,problem,has_key", [b[1:] for b in BAD_ROWS], ids=[b[0] for b in BAD_ROWS])
def test_bad_row_raises_one_data_error_naming_location_and_field(mutate, field, problem, has_key):
    row = mutate(copy.deepcopy(make_row()))
    with pytest.raises(DataError) as info:
        validate_row(row, WHERE)
    err = info.value
    assert err.field == field
    assert problem in err.problem
    text = str(err)
    assert text.startswith(WHERE)
    assert f"field '{field}'" in text
    if has_key:
        assert f"[{KEY}]" in err.where
    else:
        assert KEY not in text


def test_unknown_instance_type_still_names_the_persona():
    row = make_row()
    row["instance_type"] = "evolving"
    with pytest.raises(DataError) as info:
        validate_row(row, WHERE)
    assert info.value.where == f"{WHERE} [9+test_persona]"


@pytest.mark.parametrize("row", [["persona_id", "x"], "a string", 17, None])
def test_non_object_row(row):
    with pytest.raises(DataError) as info:
        validate_row(row, WHERE)
    assert info.value.field == "<row>"
    assert str(info.value).startswith(f"{WHERE}: field '<row>' must be an object")


def test_data_error_message_format():
    err = DataError("f.jsonl:3 [1+a/changing]", "current_checklist", "is an empty list")
    assert str(err) == "f.jsonl:3 [1+a/changing]: field 'current_checklist' is an empty list"
    assert isinstance(err, ValueError)
    assert (err.where, err.field, err.problem) == ("f.jsonl:3 [1+a/changing]", "current_checklist",
                                                    "is an empty list")


@pytest.mark.parametrize("raw,expected", [
    ("Fully  Covered.", "Fully Covered"),
    ("  a\n\tb  ", "a b"),
    ("ends with two..", "ends with two."),
    ("no period", "no period"),
])
def test_normalize_text(raw, expected):
    assert normalize_text(raw) == expected
