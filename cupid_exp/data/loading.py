"""Load CUPID instances from the Hub, a local file or directory, or the shipped sample. A bad row is one counted
``DataError`` line (file:line, key, field) and the rest run (``data.strict`` stops); duplicate keys, NaN, a BOM,
non-regular files and data without a valid row are refused."""

from __future__ import annotations

import codecs
import hashlib
import json
import logging
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, NoReturn

from cupid_exp.data.hub import HubUnavailable, load_hub_dataset
from cupid_exp.data.schema import DataError, Instance, validate_row
from cupid_exp.errors import first_line

if TYPE_CHECKING:
    from cupid_exp.config import DataConfig

log = logging.getLogger(__name__)

SAMPLE_PATH = Path(__file__).parent / "sample" / "cupid_sample.jsonl"  # data=sample: the 3-row demo set
SAMPLE_FULL_PATH = SAMPLE_PATH.with_name("cupid_sample_full.jsonl")  # 9 rows: three personas x three types
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


class _Rejected(ValueError):
    """A JSON text that parses but must not be taken as it is."""


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _Rejected(f"has the key {key!r} twice in one object (JSON would keep the last silently)")
        seen.add(key)
    return dict(pairs)


def _no_constants(name: str) -> NoReturn:
    raise _Rejected(f"holds {name}, which is not JSON")


def parse_json(text: str | bytes) -> object:
    """Strict JSON: no duplicate keys, no NaN/Infinity."""
    return json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constants)


def _parse_line(raw: bytes, where: str) -> object:
    try:
        return parse_json(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return DataError(where, "<row>", f"is not valid UTF-8 ({exc.reason})")
    except json.JSONDecodeError as exc:
        return DataError(where, "<row>", f"is not valid JSON ({exc.msg} at column {exc.colno})")
    except _Rejected as exc:
        return DataError(where, "<row>", str(exc))


def _jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    seen_line = False
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if lineno == 1:
                raw = raw.removeprefix(codecs.BOM_UTF8)  # a BOM would make the first row invalid JSON
            if not raw.strip():
                continue
            seen_line = True
            where = f"{path.name}:{lineno}"
            yield where, _parse_line(raw, where)
    if not seen_line:  # an empty file is a mistake to report, not a silent zero-row dataset
        yield path.name, DataError(path.name, "<file>", "is empty (no rows)")


def _json_rows(path: Path) -> Iterator[tuple[str, Any]]:
    raw = path.read_bytes()
    payload = _parse_line(raw.removeprefix(codecs.BOM_UTF8), path.name) if raw.strip() else None
    if isinstance(payload, DataError):
        yield path.name, DataError(path.name, "<file>", f"cannot be read: {payload.problem}")
    elif payload in ([], {}, None):
        yield path.name, DataError(path.name, "<file>", "is empty (no rows)")
    elif isinstance(payload, list):
        for i, row in enumerate(payload):
            yield f"{path.name}[{i}]", row
    else:
        yield path.name, payload


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    import pandas as pd
    import pyarrow

    try:
        records = pd.read_parquet(path).to_dict(orient="records")
    except (pyarrow.ArrowException, OSError, ValueError) as exc:
        yield path.name, DataError(path.name, "<file>", f"cannot be read as parquet ({type(exc).__name__}: "
                                                        f"{first_line(exc, 160)})")
        return
    if not records:
        yield path.name, DataError(path.name, "<file>", "is empty (no rows)")
    for i, row in enumerate(records):
        yield f"{path.name} row {i}", _plain(row)


def _plain(value: object) -> object:
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


def check_path(path_str: str | None) -> Path:
    """The data path if it is a readable regular file or directory, else one DataError line (a pipe could block)."""
    if not path_str:
        raise DataError("data.path", "<path>", "is empty; give a file or directory (data=local data.path=...)")
    path = Path(path_str).expanduser()
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise DataError(str(path), "<path>", "does not exist") from None
    except OSError as exc:
        raise DataError(str(path), "<path>", f"cannot be read ({exc.strerror})") from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise DataError(str(path), "<path>", "is not a regular file or directory (a pipe or device is refused)")
    if stat.S_ISDIR(mode):
        if not any(p.suffix in LOCAL_SUFFIXES and p.is_file() for p in path.iterdir()):
            raise DataError(str(path), "<path>", f"holds no {'/'.join(LOCAL_SUFFIXES)} files")
    elif path.suffix not in LOCAL_SUFFIXES:
        raise DataError(str(path), "<path>", f"has unsupported suffix; use one of {LOCAL_SUFFIXES}")
    return path


class HubDataError(DataError):
    """The Hub data set cannot be had: one line naming the data choice, what failed and what to do."""

    def __init__(self, where: str, problem: str):
        self.where, self.field, self.problem = where, "<hub>", problem
        ValueError.__init__(self, f"{where}: {problem}")


def raw_rows(cfg: DataConfig) -> Iterator[tuple[str, Any]]:
    if cfg.source == "sample":
        yield from _jsonl_rows(SAMPLE_PATH)
    elif cfg.source == "local":
        path = check_path(cfg.path)
        readers = {".jsonl": _jsonl_rows, ".json": _json_rows, ".parquet": _parquet_rows}  # LOCAL_SUFFIXES' readers
        for file in sorted(path.iterdir()) if path.is_dir() else [path]:
            if file.suffix in readers and file.is_file():
                yield from readers[file.suffix](file)
    else:
        try:
            ds = load_hub_dataset(cfg.hf_name, cfg.split, cfg.revision)
        except HubUnavailable as exc:
            raise HubDataError(f"data={cfg.name}", str(exc)) from None
        for i, row in enumerate(ds):
            yield f"{cfg.hf_name}[{cfg.split}] row {i}", _plain(row)


def load_instances(cfg: DataConfig) -> LoadedData:
    """Validate every row, drop duplicates by key, then apply the type filter and limit."""
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
    source = cfg.hf_name if cfg.source == "hf" else (cfg.path or str(SAMPLE_PATH))
    if cfg.strict and errors:
        raise DataError(errors[0].where, errors[0].field,
                        f"{errors[0].problem} (and {len(errors) - 1} more bad rows; data.strict=true)")
    if not instances:
        first = f"; the first: {errors[0]}" if errors else ""
        raise DataError(source, "<data>", f"has no valid row ({len(errors)} bad rows{first})")
    if cfg.instance_types:
        instances = [i for i in instances if i.instance_type in cfg.instance_types]
        if not instances:
            raise DataError(source, "<data>", f"has no instance of data.instance_types={list(cfg.instance_types)}")
    if cfg.limit is not None:
        instances = instances[: cfg.limit]
    return LoadedData(instances=instances, errors=errors, digest=digest.hexdigest()[:16], source=source)
