"""A data set from the Hugging Face Hub, or one line saying why not: offline mode reads only the cache, else one quick
metadata request reports an unreachable Hub at once rather than after huggingface_hub's backoff."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datasets import Dataset

OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
LOCAL_COPY = "use a local copy (data=local data.path=<file or folder>)"


class HubUnavailable(Exception):
    """The data set cannot be had from the Hub or its cache; the message (one line) says what to do."""


def offline_declared() -> str | None:
    """The variable that puts ``datasets`` in offline mode, as ``NAME=value``; None when online."""
    import datasets.config

    if not datasets.config.HF_HUB_OFFLINE:
        return None
    for name in OFFLINE_VARIABLES:
        if os.environ.get(name, "").strip().upper() in datasets.config.ENV_VARS_TRUE_VALUES:
            return f"{name}={os.environ[name]}"
    return "offline mode"


def _one_line(exc: BaseException, limit: int = 160) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}" if text else type(exc).__name__


def probe(name: str, revision: str | None) -> None:
    """One metadata request: HubUnavailable when the Hub is unreachable or lacks the set; 5xx left to ``datasets``."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError
    from huggingface_hub.utils import httpx  # the HTTP client huggingface_hub calls with (its exceptions)

    timeout = constants.HF_HUB_ETAG_TIMEOUT
    try:
        HfApi().dataset_info(name, revision=revision, timeout=timeout)
    except httpx.TransportError as exc:  # no route, no DNS, refused, timed out: retrying will not help soon
        raise HubUnavailable(
            f"cannot reach the Hugging Face Hub at {constants.ENDPOINT} to load {name} ({_one_line(exc)}; tried once, "
            f"HF_HUB_ETAG_TIMEOUT={timeout:g} s): {LOCAL_COPY}, or download it once where the Hub is reachable and "
            "rerun with HF_HUB_OFFLINE=1 to read it from the Hugging Face cache") from None
    except GatedRepoError:
        raise HubUnavailable(f"{name} is gated on the Hugging Face Hub: ask for access at "
                             f"{constants.ENDPOINT}/datasets/{name} and log in (hf auth login), or "
                             f"{LOCAL_COPY}") from None
    except RevisionNotFoundError:
        raise HubUnavailable(f"{name} has no revision {revision!r} on the Hugging Face Hub (data.revision)") from None
    except RepositoryNotFoundError:
        raise HubUnavailable(f"{name} does not exist on the Hugging Face Hub, or is private (data.hf_name)") from None


def load_hub_dataset(name: str, split: str, revision: str | None) -> Dataset:
    """``datasets.load_dataset(name, split=...)``, its failures to find the data as one-line HubUnavailable."""
    import datasets
    from datasets.exceptions import DatasetNotFoundError

    offline = offline_declared()
    if offline is None:
        probe(name, revision)
    try:
        return datasets.load_dataset(name, split=split, revision=revision)
    except ConnectionError as exc:  # datasets' own: the Hub unreachable (or forbidden) and no cached copy
        if offline is not None:
            raise HubUnavailable(
                f"{name} is not in the Hugging Face cache and {offline} forbids downloading it: download it once "
                f"with the network on (run the same command without {offline.split('=')[0]}), or {LOCAL_COPY}"
            ) from None
        raise HubUnavailable(f"lost the Hugging Face Hub while loading {name} ({_one_line(exc)}): {LOCAL_COPY}, "
                             f"or retry; with a complete download in the cache, HF_HUB_OFFLINE=1 reads it") from None
    except DatasetNotFoundError as exc:
        raise HubUnavailable(f"{name}: {_one_line(exc)} (data.hf_name)") from None
    except ValueError as exc:
        if str(exc).startswith("Unknown split"):  # datasets' message for a split the data set does not have
            raise HubUnavailable(f"{name} has no split {split!r} (data.split): {_one_line(exc)}") from None
        raise
