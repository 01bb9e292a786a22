"""Scoring: the statistics and the failure policy (defined once), a job's metrics, bootstrap intervals."""

from cupid_exp.scoring.bootstrap import (Comparison, Estimate, bootstrap_ci, bootstrap_distribution, ci_metrics,
                                         paired_compare, point_estimate, task_cis)
from cupid_exp.scoring.metrics import error_counts, flat_metrics, task_metrics
from cupid_exp.scoring.names import metric_key
from cupid_exp.scoring.statistics import (FAILURE_POLICIES, HEADLINE, TASK_METRICS, harmonic_mean, task_frame,
                                          treatment)

__all__ = ["Comparison", "Estimate", "FAILURE_POLICIES", "HEADLINE", "TASK_METRICS", "bootstrap_ci",
           "bootstrap_distribution", "ci_metrics", "error_counts", "flat_metrics", "harmonic_mean", "metric_key",
           "paired_compare", "point_estimate", "task_cis", "task_frame", "task_metrics", "treatment"]
