"""Load CUPID instances from the Hub, a local file or directory, or the shipped sample.

Every row goes through ``validate_row``; bad rows become one-line ``DataError``s that
the caller reports and counts, and the valid rows still run (``strict`` stops instead).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from cupid_exp.data.schema import INSTANCE_TYPES, DataError, Instance, validate_row

if TYPE_CHECKING:
    from cupid_exp.config import DataConfig

log = logging.getLogger(__name__)

SAMPLE_PATH = Path(__file__).parent / "sample" / "cupid_sample.jsonl"
LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass
class LoadedData:
    instances: list[Instance]
    errors: list[DataError] = field(default_factory=list)
    digest: str = ""  # sha256 over the valid rows, order included
    source: str = ""

    @property
    def n_rows(self) -> int:
        return len(self.instances) + len(self.errors)


def _raw_rows_from_file(path: Path) -> Iterator[tuple[str, Any]]:
    """Yield (where, row) pairs; an unreadable line is yielded as a DataError."""
    where_file = path.name
    if path.suffix == ".jsonl":
        seen_line = False
        with path.open("rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                where = f"{where_file}:{lineno}"
                if not raw.strip():
                    continue
                seen_line = True
                try:
                    yield where, json.loads(raw.decode("utf-8"))
                except UnicodeDecodeError as exc:
                    yield where, DataError(where, "<row>", f"is not valid UTF-8 ({exc.reason})")
                except json.JSONDecodeError as exc:
                    yield where, DataError(where, "<row>", f"is not valid JSON ({exc.msg})")
        if not seen_line:  # an empty file is a mistake to report, not a silent zero-row dataset
            yield where_file, DataError(where_file, "<file>", "is empty (no rows)")
    elif path.suffix == ".json":
        try:
            payload = json.loads(path.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            yield where_file, DataError(where_file, "<file>", f"cannot be read as JSON ({exc})")
            return
        if payload == []:
            yield where_file, DataError(where_file, "<file>", "is empty (no rows)")
            return
        rows = payload if isinstance(payload, list) else [payload]
        for i, row in enumerate(rows):
            yield (f"{where_file}[{i}]" if isinstance(payload, list) else where_file), row
    elif path.suffix == ".parquet":
        import pandas as pd

        records = pd.read_parquet(path).to_dict(orient="records")
        if not records:
            yield where_file, DataError(where_file, "<file>", "is empty (no rows)")
        for i, row in enumerate(records):
            yield f"{where_file} row {i}", _plain(row)
    else:
        yield where_file, DataError(where_file, "<file>", f"has unsupported suffix; use one of {LOCAL_SUFFIXES}")


def _plain(value: Any) -> Any:
    """numpy/pyarrow containers (from parquet or datasets) -> plain lists and dicts."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and value != value:  # pandas reads a null string cell back as NaN
        return None
    return value


def _raw_rows_local(path_str: str) -> Iterator[tuple[str, Any]]:
    path = Path(path_str).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"data.path does not exist: {path}")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in LOCAL_SUFFIXES)
        if not files:
            raise FileNotFoundError(f"data.path {path} holds no {'/'.join(LOCAL_SUFFIXES)} files")
        for f in files:
            yield from _raw_rows_from_file(f)
    else:
        yield from _raw_rows_from_file(path)


def _raw_rows_hub(cfg: DataConfig) -> Iterator[tuple[str, Any]]:
    import datasets

    ds = datasets.load_dataset(cfg.hf_name, split=cfg.split, revision=cfg.revision)
    for i, row in enumerate(ds):
        yield f"{cfg.hf_name}[{cfg.split}] row {i}", _plain(row)


def raw_rows(cfg: DataConfig) -> Iterator[tuple[str, Any]]:
    if cfg.source == "sample":
        return _raw_rows_from_file(SAMPLE_PATH)
    if cfg.source == "local":
        if not cfg.path:
            raise ValueError("data=local needs data.path=<file or directory>")
        return _raw_rows_local(cfg.path)
    if cfg.source == "hf":
        return _raw_rows_hub(cfg)
    raise ValueError(f"data.source={cfg.source!r} is not one of: sample, local, hf")


def load_instances(cfg: DataConfig) -> LoadedData:
    """Validate every row, drop duplicates by key, then apply the type filter and limit."""
    unknown = sorted(set(cfg.instance_types) - set(INSTANCE_TYPES))
    if unknown:
        raise ValueError(f"data.instance_types has unknown types {unknown}; expected {list(INSTANCE_TYPES)}")
    instances: list[Instance] = []
    errors: list[DataError] = []
    seen: dict[str, str] = {}
    digest = hashlib.sha256()
    for where, row in raw_rows(cfg):
        if isinstance(row, DataError):
            errors.append(row)
            continue
        try:
            inst = validate_row(row, where)
        except DataError as exc:
            errors.append(exc)
            continue
        if inst.key in seen:
            errors.append(DataError(f"{where} [{inst.key}]", "persona_id+instance_type",
                                    f"duplicates the key first seen at {seen[inst.key]}"))
            continue
        seen[inst.key] = where
        digest.update(json.dumps(inst.to_dict(), sort_keys=True, ensure_ascii=False).encode())
        instances.append(inst)
    for err in errors:
        log.error("bad data row: %s", err)
    if cfg.strict and errors:
        raise DataError(errors[0].where, errors[0].field,
                        f"{errors[0].problem} (and {len(errors) - 1} more bad rows; data.strict=true)")
    if cfg.instance_types:
        instances = [i for i in instances if i.instance_type in cfg.instance_types]
    if cfg.limit is not None:
        instances = instances[: cfg.limit]
    return LoadedData(instances=instances, errors=errors, digest=digest.hexdigest()[:16],
                      source=cfg.hf_name if cfg.source == "hf" else (cfg.path or str(SAMPLE_PATH)))
