"""Judge scores are kept exactly and never defaulted to 0; PrefMatcher output variants."""

from __future__ import annotations

import pytest

from cupid_exp.evaluators.checklist import parse_match_labels
from cupid_exp.evaluators.judge import parse_judge_score
from cupid_exp.llm.replies import ParseError


@pytest.mark.parametrize("reply,score", [
    ("### Evaluation of AI Assistant's Response\n\nfine\n\n### Evaluation Score\n\n7.5", 7.5),
    ("### Evaluation Score\n7", 7.0),
    ("### **Evaluation Score**\n\n**8**", 8.0),
    ("**Evaluation Score:** 9/10", 9.0),
    ("### Evaluation Score\n\n6 out of 10\n\nThe response missed item 2.", 6.0),
    ("<think>### Evaluation Score\n2</think>\n### Evaluation Score\n\n8.25", 8.25),
    ("### Evaluation Score\n3\n...\n### Evaluation Score\n\n4", 4.0),  # the last header wins
    ('{"evaluation": "ok", "score": 6.5}', 6.5),
    ('```json\n{"evaluation": "ok", "score": "10"}\n```', 10.0),
])
def test_score_variants(reply: str, score: float) -> None:
    assert parse_judge_score(reply) == score


@pytest.mark.parametrize("reply,problem", [
    ("The response is good. 8", "no 'Evaluation Score'"),
    ("### Evaluation Score\n\nexcellent", "no number"),
    ("### Evaluation Score\n\n0", "outside"),
    ("### Evaluation Score\n\n11", "outside"),
    ('{"evaluation": "ok", "score": "high"}', "not a number"),
])
def test_unusable_judgments_raise_not_zero(reply: str, problem: str) -> None:
    with pytest.raises(ParseError, match=problem):
        parse_judge_score(reply)


@pytest.mark.parametrize("reply", [
    '[{"index": 1, "label": "Fully Covered"}, {"index": 2, "label": "Not Covered"}]',
    '{"results": [{"index": 1, "label": "Fully Covered"}, {"index": 2, "label": "Not Covered"}]}',
    '```json\n[{"entry": "a", "label": "fully covered"}, {"entry": "b", "label": "NOT COVERED"}]\n```',
    'Here you go:\n[{"label": "Fully_Covered"}, {"label": "not-covered"}]',
])
def test_prefmatcher_output_variants(reply: str) -> None:
    assert parse_match_labels(reply, 2) == [1.0, 0.0]


@pytest.mark.parametrize("reply,problem", [
    ('[{"label": "Fully Covered"}]', "1 results for 2"),
    ('[{"label": "Fully Covered"}, {"label": "Somewhat Covered"}, {"label": "Not Covered"}]', "3 results for 2"),
    ('[{"label": "Fully Covered"}, {"label": "Somewhat Covered"}]', "unknown coverage label"),
    ('{"matches": []}', "no 'results' list"),
])
def test_prefmatcher_bad_outputs_raise(reply: str, problem: str) -> None:
    with pytest.raises(ParseError, match=problem):
        parse_match_labels(reply, 2)


@pytest.mark.parametrize("reply,score", [
    ("### Evaluation Score (1-10)\n\n8", 8.0),
    ("### Evaluation Score (1–10)\n8", 8.0),
    ("**Evaluation Score (out of 10):** 7", 7.0),
    ("### Evaluation Score (scale 1 to 10)\n\n**9**", 9.0),
])
def test_a_scale_note_on_the_header_is_not_the_score(reply: str, score: float) -> None:
    assert parse_judge_score(reply) == score
