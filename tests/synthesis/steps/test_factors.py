"""Context factors: code-planned slots, one call per factor, a rejected factor regenerated alone with a
changed prompt, resume from a partial list; the changed preference; wrong-shaped replies refused."""

from __future__ import annotations

import asyncio

import pytest

from cupid_exp.llm.replies import Invalid
from cupid_exp.llm.steps import StepFailed
from cupid_exp.synthesis import taxonomy
from cupid_exp.synthesis.journey import plan_factors
from cupid_exp.synthesis.steps import factors as steps

from ..scripted import WRONG_SHAPES, ScriptedServer, assert_rejected, context, counts, reply


def factor(name: str, pref: str) -> dict:
    return {"background": "Something that happens in this person's life often.", "factor": name, "preference": pref}


PLAN = plan_factors(0, 1)
PAIR_PREFS = ("Replies for this client must be formal and long, with full citations.",
              "Replies for that client must be casual bullet points with no citations.")
GOOD = [f"Specific thing {c}" for c in "ABCDEFGH"]


def ordinary(name: str, i: int) -> dict:
    return factor(name, f"Answers about {name} must follow rule number {i} exactly.")


def factor_script(names: list[str]) -> list[tuple]:
    """Six ordinary factors, then the two members of the contrastive pair, one reply each."""
    return [reply(ordinary(n, i)) for i, n in enumerate(names[:6])] + [
        reply(factor(n, p)) for n, p in zip(names[6:], PAIR_PREFS, strict=False)]


def built(n: int) -> list[dict]:
    """The first ``n`` factors of GOOD, built as write_factors would."""
    out: list[dict] = []
    for i, name in enumerate(GOOD[:n]):
        out.append(steps.build_factor(out, "f", PLAN[i])(ordinary(name, i)))
    return out


def test_invalid_factor_is_regenerated_with_a_changed_prompt(tmp_path) -> None:
    """Factor 3 repeats factor 1's name: only factor 3 is asked again, with the reason and attempt number."""
    script = factor_script(GOOD)
    script.insert(2, reply(ordinary(GOOD[0], 0)))
    with ScriptedServer(script) as server:
        ctx = context(server.url, tmp_path)
        saved = []
        factors = asyncio.run(steps.write_factors(ctx, "A nurse.", PLAN, on_factor=lambda fs: saved.append(len(fs))))
    assert [f["factor"] for f in factors] == GOOD
    assert factors[6]["related_factor"] == GOOD[7] and factors[7]["related_factor"] == GOOD[6]
    assert [f["factor_type"] for f in factors] == [p["factor_type"] for p in PLAN]  # types come from code
    assert factors[6]["factor_type"] == factors[7]["factor_type"]
    assert len({f["factor_type"] for f in factors}) == 7
    assert all(f["related_factor"] == "N/A" for f in factors[:6])
    assert len(server.requests) == 9 and saved == [1, 2, 3, 4, 5, 6, 7]
    assert GOOD[6] not in server.requests[-1]["messages"][-1]["content"]  # the pair's name is not shown (copy bait)
    assert PAIR_PREFS[0] in server.requests[-1]["messages"][-1]["content"]  # its preference is, to contradict
    first, second = (r["messages"][-1]["content"] for r in server.requests[2:4])
    assert "Attempt" not in first
    assert "Attempt 2" in second and "names must all be different" in second  # so the cache key differs
    assert server.requests[3]["seed"] == 1 and "seed" not in server.requests[2]  # the retry resamples
    assert counts(ctx, "factors") == {**counts(ctx, "factors"), "calls": 9, "invalid_attempt": 1}
    assert "gave_up" not in counts(ctx, "factors")


def test_a_name_the_model_keeps_repeating_is_swapped_for_a_taxonomy_name(tmp_path) -> None:
    """Factor 3 repeats factor 1's name on all three attempts: the model gets NAME_ATTEMPTS tries (each
    retry hotter), then the third reply keeps its own background and preference under a taxonomy name."""
    script = factor_script(GOOD)
    repeated = [factor(GOOD[0], f"Answers about the third thing must follow rule {i}, always.") for i in range(3)]
    script[2:3] = [reply(r) for r in repeated]
    with ScriptedServer(script) as server:
        ctx = context(server.url, tmp_path)
        factors = asyncio.run(steps.write_factors(ctx, "A nurse.", PLAN))
    third = factors[2]
    assert third["name_source"] == "taxonomy" and third["model_name"] == GOOD[0]
    assert third["factor"] in taxonomy.FALLBACK_FACTOR_NAMES[PLAN[2]["factor_type"]]
    assert third["preference"] == repeated[2]["preference"] and third["background"] == repeated[2]["background"]
    assert [f["factor"] for f in factors[:2] + factors[3:]] == GOOD[:2] + GOOD[3:]
    assert steps.validate_factors(factors) == [] and "name_source" not in factors[0]
    assert len(server.requests) == 10 and counts(ctx, "factors")["invalid_attempt"] == 2
    assert [server.requests[i].get("temperature") for i in (2, 3, 4)] == [0.7, 1.0, 1.3]  # each retry hotter


def test_no_taxonomy_name_while_the_model_has_attempts_left_or_for_other_faults(tmp_path) -> None:
    taken = built(2)
    early = steps.build_factor(taken, "f", PLAN[2], steps.NameRepair(2, "k"))
    for _ in range(2):
        with pytest.raises(Invalid, match="is taken"):
            early(ordinary(GOOD[0], 2))
    assert early(ordinary(GOOD[0], 2))["name_source"] == "taxonomy"
    short = steps.build_factor(taken, "f", PLAN[2], steps.NameRepair(0, "k"))
    with pytest.raises(Invalid, match="full-sentence preference"):  # a name swap cannot fix the preference
        short(factor(GOOD[0], "Too short."))
    same = steps.build_factor(taken, "f", PLAN[2], steps.NameRepair(0, "k"))
    assert same(ordinary(GOOD[0], 2)) == same(ordinary(GOOD[0], 2))  # the pick is a pure function of the key


def test_fallback_names_avoid_taken_ones_and_exist_for_every_factor_type() -> None:
    for factor_type in taxonomy.FACTOR_TYPES:
        names = taxonomy.FALLBACK_FACTOR_NAMES[factor_type]
        assert len(set(names)) >= 4 and not any(steps._GENERIC_NAME.match(n) for n in names)
        assert steps.fallback_name(factor_type, names[:-1], "k") == names[-1]
        assert steps.fallback_name(factor_type, [n.upper() + "." for n in names], "k") is None


def test_factors_resume_from_a_partial_list(tmp_path) -> None:
    with ScriptedServer(factor_script(GOOD)[4:]) as server:
        factors = asyncio.run(steps.write_factors(context(server.url, tmp_path), "A nurse.", PLAN, done=built(4)))
    assert [f["factor"] for f in factors] == GOOD and len(server.requests) == 4


def test_resume_keeps_the_pairs_first_member(tmp_path) -> None:
    done = built(6) + [steps.build_factor(built(6), "f", PLAN[6])(factor(GOOD[6], PAIR_PREFS[0]))]
    with ScriptedServer(factor_script(GOOD)[7:]) as server:
        factors = asyncio.run(steps.write_factors(context(server.url, tmp_path), "A nurse.", PLAN, done=done))
    assert [f["factor"] for f in factors] == GOOD and len(server.requests) == 1


def test_regeneration_stops_after_max_retries_and_is_counted(tmp_path) -> None:
    with ScriptedServer([reply("no json here")]) as server:
        ctx = context(server.url, tmp_path, max_retries=1)
        with pytest.raises(StepFailed) as err:
            asyncio.run(steps.write_factors(ctx, "A nurse.", PLAN))
    assert len(server.requests) == 2
    assert err.value.kind == "unparseable" and err.value.step == "factors"
    c = counts(ctx, "factors")
    assert (c["calls"], c["unparseable_attempt"], c["gave_up"]) == (2, 2, 1)


def test_factor_rules() -> None:
    good = built(6)
    first = steps.build_factor(good, "f", PLAN[6])(factor(GOOD[6], PAIR_PREFS[0]))
    second = steps.build_second(good, first, PLAN[7])(factor(GOOD[7], PAIR_PREFS[1]))
    good += [dict(first, related_factor=second["factor"]), second]
    assert steps.validate_factors(good) == []
    broken = [dict(f) for f in good]
    broken[7]["related_factor"] = "N/A"
    broken[6]["factor_type"] = "Location/Place"
    problems = steps.validate_factors(broken)
    assert any("share one factor type" in p for p in problems)
    assert any("name each other" in p for p in problems)
    assert steps.validate_factors(good[:7]) == ["there must be exactly 8 context factors, got 7"]
    with pytest.raises(Invalid, match="specific name"):
        steps.build_factor([], "f", PLAN[0])(factor("...", "A long enough preference sentence here."))
    with pytest.raises(Invalid, match="contradict each other"):
        steps.build_second(good[:6], first, PLAN[7])(factor(GOOD[7], PAIR_PREFS[0] + " Always."))


FACTOR_SHAPES = [*WRONG_SHAPES, [factor("Thing", "A long enough preference sentence here.")],
                 {"factor": ["Thing"], "background": "A background sentence.", "preference": "A preference, long."},
                 {"factor": "Thing", "background": 3, "preference": "A preference that is long enough."},
                 {"factor": "Thing", "background": "A background sentence."}]


@pytest.mark.parametrize("data", FACTOR_SHAPES)
def test_factor_builders_refuse_wrong_shapes(data) -> None:
    assert_rejected(steps.build_factor([], "f", PLAN[0]), data)
    first = built(7)[6]
    assert_rejected(steps.build_second(built(6), first, PLAN[7]), data)


OLD = "Explanations must use three bullet points."


def test_changed_preference_rules() -> None:
    build = steps.build_changed(OLD, ["Another factor's preference, written in full."])
    new = {"reason": "She started a new job.", "preference": "Explanations must be one flowing paragraph."}
    assert build(new) == new
    for pref, rule in ((OLD, "differ from the old one"), ("Another factor's preference, written in full", "other"),
                       ("No longer three bullet points, please.", "instead of negating"), ("Short.", "full sentence"),
                       # a hot retry of the 135M model drifted into French here once (seed 1): the decomposer
                       # could not turn it into English questions and the persona was lost
                       ("Je veux des explications en un seul paragraphe pour la cuisine.", "in English")):
        with pytest.raises(Invalid, match=rule):
            build({"reason": "She started a new job.", "preference": pref})


@pytest.mark.parametrize("data", [*WRONG_SHAPES, [{"reason": "r", "preference": "p"}],
                                  {"reason": None, "preference": "A new preference, long enough."},
                                  {"reason": "A reason.", "preference": {"text": "nested"}}])
def test_changed_preference_refuses_wrong_shapes(data) -> None:
    assert_rejected(steps.build_changed(OLD, []), data)
