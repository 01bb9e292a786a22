"""Which data a run ran on: the rows' digest and the part taken; a subset never stands in for the full run."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import PurePath
from typing import Iterable, Mapping

from cupid_exp.data.schema import INSTANCE_TYPES
from cupid_exp.identity import subset_text

DIGEST_SHOWN = 8  # characters of the content digest a label shows


@dataclass(frozen=True)
class DataIdentity:
    """One data set as runs saw it: its name, its content, and the subset taken (empty: all of it)."""

    name: str  #: ``data.name`` (sample, local, cupid)
    content: str  #: the rows' digest; for a run that did not record one, where the rows came from
    where: str = field(compare=False)  #: the file's name, or the Hub id and split, for people (not identity)
    limit: int | None = None  #: ``data.limit``
    types: tuple[str, ...] = ()  #: ``data.instance_types``, sorted; empty: every type

    @property
    def subset(self) -> str:
        """'data.limit=1, data.instance_types=[changing]'; empty for the whole data set."""
        return subset_text(self.limit, self.types)

    @property
    def full(self) -> DataIdentity:
        """The whole data set this is (a part of)."""
        return replace(self, limit=None, types=())

    @property
    def label(self) -> str:
        """'sample [cupid_sample.jsonl #1a2b3c4d]', 'local [synth.jsonl #… ; subset data.limit=1]'."""
        digest = f" #{self.content[:DIGEST_SHOWN]}" if self.content != self.where else ""
        subset = f"; subset {self.subset}" if self.subset else ""
        return f"{self.name} [{self.where}{digest}{subset}]"

    @property
    def slug(self) -> str:
        """The label as a file-name part: 'sample-1a2b3c4d', 'local-1a2b3c4d-limit1'."""
        text = "-".join([self.name, self.content[:DIGEST_SHOWN] if self.content != self.where else self.where,
                         *([f"limit{self.limit}"] if self.limit is not None else []), *self.types])
        return re.sub(r"[^A-Za-z0-9.-]+", "_", text).strip("_")


def one_name_per_content(identities: Iterable[DataIdentity]) -> dict[DataIdentity, DataIdentity]:
    """Each identity with one ``where`` per content: one set of rows under two names is 'a.jsonl = b.jsonl'."""
    names: dict[DataIdentity, set[str]] = {}
    for identity in identities:
        names.setdefault(identity.full, set()).add(identity.where)
    return {i: replace(i, where=" = ".join(sorted(names[i.full]))) for i in identities}


def _limit(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "", "None", "null") else None
    except ValueError:
        return None


def _types(value: str | None) -> tuple[str, ...]:
    try:
        types = tuple(sorted(set(json.loads(value)))) if value else ()
    except (ValueError, TypeError):
        types = ()
    return () if set(types) >= set(INSTANCE_TYPES) else types


def data_identity(params: Mapping[str, str], tags: Mapping[str, str]) -> DataIdentity:
    """A run's data from its params (``data.*``) and tags (``dataset_digest``, ``dataset_source``)."""
    name = params.get("data.name") or "?"
    kind = params.get("data.source") or ("hf" if params.get("data.hf_name") not in (None, "", "None") else "")
    if kind == "hf":
        where = f"{params.get('data.hf_name')}:{params.get('data.split')}"
        revision = params.get("data.revision")
        where += f"@{revision}" if revision not in (None, "", "None") else ""
    else:
        source = tags.get("dataset_source") or params.get("data.path") or ""
        where = PurePath(source).name if source not in ("", "None") else name
    return DataIdentity(name=name, content=tags.get("dataset_digest") or where, where=where,
                        limit=_limit(params.get("data.limit")), types=_types(params.get("data.instance_types")))
