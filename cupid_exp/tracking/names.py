"""A run's name and description, so MLflow's runs list tells runs apart and shows how each scored."""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from cupid_exp.data.schema import INSTANCE_TYPES
from cupid_exp.secrets import is_headers_key, is_secret_key, mask_url_credentials

SEP = " · "
SCORES_SEP = " | "  #: between a job run's identity and its results in its name


def override_pairs(overrides: Iterable[str]) -> list[tuple[str, str]]:
    """(key, value) of each ``key=value`` override, its ``+``/``++``/``~`` prefix dropped."""
    return [(key.lstrip("+~"), value) for key, sep, value in (str(text).partition("=") for text in overrides) if sep]


def scoring_overrides(overrides: Iterable[str]) -> list[str]:
    """The command's decoding and prompt overrides, as a row label names them (``temperature=0.4``)."""
    from cupid_exp.identity import short_key  # (it imports the model layer: not where a sweep starts)

    shown = []
    for key, value in override_pairs(overrides):
        path = key.split(".")
        if any(is_secret_key(part) or is_headers_key(part) for part in path):
            continue  # a key or a header (``model.params.extra_headers.x-api-key``) never enters a name
        value = mask_url_credentials(value)
        root = path[0]
        if root == "prompts" or (root in ("model", "evaluator") and any(p.endswith("params") for p in path[1:-1])):
            shown.append(f"{short_key(key)}={value}")
    return shown


def subset_of(limit: int | None, types: Sequence[str] | None) -> str:
    """'data.limit=2' for a part of the data; empty for all."""
    from cupid_exp.identity import subset_text

    kept = tuple(sorted(set(types or ()))) if types and not set(types) >= set(INSTANCE_TYPES) else ()
    return subset_text(limit if limit else None, kept)


def job_run_name(model: str, task: str, setting: str, evaluator: str, data: str, subset: str = "",
                 overrides: Iterable[str] = (), epochs: int = 1) -> str:
    """'gpt4o · inference · standard · eval gpt4o · sample [data.limit=2] · temperature=0.4 · 3 epochs'."""
    parts = [model, task, setting, f"eval {evaluator}", f"{data} [{subset}]" if subset else data,
             *scoring_overrides(overrides)]
    if epochs and int(epochs) > 1:
        parts.append(f"{int(epochs)} epochs")
    return SEP.join(parts)


def hydra_overrides() -> list[str]:
    """This Hydra job's command-line overrides (none outside a Hydra app: tests, notebooks)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return list(HydraConfig.get().overrides.task)
    except (ImportError, ValueError):
        return []


def headline(metrics: Mapping[str, float], done: int, total: int, unit: str) -> str:
    """'inference f1 0.620 · $0.0123 · 3 of 3 instances'."""
    from cupid_exp.scoring.names import metric_key
    from cupid_exp.scoring.statistics import HEADLINE

    parts = [f"{task} {name} {metrics[key]:.3f}" for task, name in HEADLINE.items()
             if (key := metric_key(task, "all", name)) in metrics and metrics[key] == metrics[key]]
    return SEP.join([*parts, f"${metrics.get('cost/usd', 0.0):.4f}", f"{done} of {total} {unit}"])


def scored_name(name: str, line: str) -> str:
    """The run's name with its results after it (a resumed run's earlier results replaced)."""
    return f"{name.split(SCORES_SEP)[0]}{SCORES_SEP}{line}"


def link_name(name: str, run_id: str) -> str:
    """A sweep's link child: says it is a link, and to which run."""
    return f"link → {run_id[:8]}{SEP}{name.split(SCORES_SEP)[0]}"
