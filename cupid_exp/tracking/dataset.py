"""The evaluated data as an MLflow dataset input; a subset's digest includes its keys."""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cupid_exp.config import DataConfig
from cupid_exp.data.loading import LoadedData
from cupid_exp.tracking.names import subset_of

if TYPE_CHECKING:
    from mlflow.entities import Dataset


def dataset_name(cfg: DataConfig, data: LoadedData) -> str:
    """The file's name, with the part taken for a subset (``h2.jsonl [data.limit=2]``)."""
    name = {"hf": str(cfg.hf_name), "sample": "cupid-sample"}.get(cfg.source) or Path(data.source).name or data.source
    subset = subset_of(cfg.limit, cfg.instance_types)
    return f"{name} [{subset}]" if subset else name


def dataset_digest(cfg: DataConfig, data: LoadedData) -> str:
    if not cfg.limit and not cfg.instance_types:
        return data.digest
    keys = "\n".join(i.key for i in data.instances)
    return hashlib.sha256(f"{data.digest}\n{keys}".encode()).hexdigest()[:16]


@dataclass
class DatasetInput:
    """The dataset input as plain data, turned into MLflow's entity where the run is logged."""

    name: str
    digest: str
    rows: list[dict[str, Any]]
    local_path: str | None = None  #: the file the rows came from
    hub: dict[str, Any] | None = None  #: path, split and revision on the Hugging Face Hub

    def entity(self) -> Dataset:
        """The dataset entity (``mlflow.entities.Dataset``): name, source, digest, schema and row count."""
        import mlflow.data
        import pandas as pd

        if self.hub is not None:
            from mlflow.data.huggingface_dataset_source import HuggingFaceDatasetSource

            source: HuggingFaceDatasetSource | str | None = HuggingFaceDatasetSource(**self.hub)
        else:
            source = self.local_path  # MLflow makes it a "local" source
        with warnings.catch_warnings():  # hints meant for model signatures, and a local path "read two ways"
            warnings.simplefilter("ignore", UserWarning)
            dataset = mlflow.data.from_pandas(pd.DataFrame(self.rows), source=source, name=self.name,
                                              digest=self.digest)
            return dataset._to_mlflow_entity()


def dataset_input(cfg: DataConfig, data: LoadedData) -> DatasetInput:
    """The instances run, one row each with its key fields, with their name, digest and source."""
    rows = [{"key": i.key, "persona_id": i.persona_id, "instance_type": i.instance_type,
             "current_context_factor": i.current_context_factor, "current_request": i.current_request,
             "n_prior_sessions": len(i.prior_interactions), "n_checklist_items": len(i.current_checklist)}
            for i in data.instances]
    if cfg.source == "hf":
        hub = {"path": str(cfg.hf_name), "split": cfg.split, "revision": cfg.revision}
        return DatasetInput(dataset_name(cfg, data), dataset_digest(cfg, data), rows, hub=hub)
    return DatasetInput(dataset_name(cfg, data), dataset_digest(cfg, data), rows,
                        local_path=str(Path(data.source).expanduser().resolve()))
