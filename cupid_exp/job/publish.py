"""Phase 4 of a job: write its files, print its report, finish its MLflow run (and, before phase 2, open that run:
``start_tracking``), whatever the kind of work.

The kind's files land in the Hydra job folder first (atomically: ``Work.publish``), so a tracking failure can
never cost the results; the run worker draws any plots while the report is computed and printed.
"""

from __future__ import annotations

import logging
from typing import Any

from cupid_exp import console
from cupid_exp.job.budgets import BudgetReport, fit_line
from cupid_exp.job.plan import Job
from cupid_exp.job.spec import Summary
from cupid_exp.tracking.attempts import whole_job_metrics, whole_job_usage
from cupid_exp.tracking.live import FinalLog
from cupid_exp.tracking.mlflow import SweepParent, flatten
from cupid_exp.tracking.signals import shielded

log = logging.getLogger(__name__)


def start_tracking(job: Job) -> Any:
    """Have the job's MLflow run opened before any model is called: params, tags and the dataset input first,
    then progress while the job works. A resumed job reopens its earlier attempt's run (``tracking.attempts``).

    The run is kept by a worker process (``tracking.run_worker``), asked here and waited for only before the
    first call (``wait_opened``), so that opening it overlaps the job's own start; without a worker, here.
    """
    from cupid_exp.tracking import attempts, run_worker
    from cupid_exp.tracking.live import RunRequest, open_run

    cfg, spec, attempt = job.cfg, job.spec, job.attempt
    if not cfg.tracking.enabled or job.dry_run:
        return None
    # first: its own Python and `import mlflow` overlap everything after; a sweep's job (it has a parent run)
    # takes the worker the previous job left, and leaves it to the next
    worker = run_worker.start(keep=spec.parent_run is not None)
    claim = None
    try:
        # the job's lock (``tracking.job_lock``) makes this the only attempt: a resumed job reopens the earlier run
        claim = attempts.Claim(spec.run_key, attempt.lock if cfg.runtime.resume else None)
        view = job.work.tracking(job)
        params = flatten(dict(spec.resolved))
        params.update({f"choice.{k}": str(v) for k, v in spec.choices.items()})
        tags = {**view.tags, "output_dir": str(job.output_dir.resolve()), "job_identity": spec.identity}
        request = RunRequest(
            tracking=cfg.tracking, secrets=list(spec.secrets), run_name=view.run_name, params=params, tags=tags,
            config=dict(spec.resolved), parent=spec.parent_run, run_key=spec.run_key, exclusive=claim.exclusive,
            dataset=view.dataset, total=len(job.work.units), parts=view.parts, policy=view.policy,
            done=list(attempt.done.values()), earlier=attempts.earlier_spend(attempt.earlier),
            traces=bool(cfg.tracking.traces and job.todo), trace_tags=view.trace_tags, judges=view.judges,
            plots=view.plots, unit=f"{job.work.noun}s")
        if worker is not None:
            worker.open(request, claim, attempt.meter)
            return worker
        return open_run(request, claim, attempt.meter)
    except BaseException:
        if worker is not None:
            worker.abandon()
        if claim is not None:
            claim.release()
        raise


def publish(job: Job, summary: Summary, tracker: Any, spending: BudgetReport | None = None) -> None:
    """Files, then the console report, then MLflow (metrics, tags, artifacts, table, plots) and the run's end. A
    job its budget stopped (``spending``) is not complete, whatever the units it ran."""
    live = tracker
    stopped = spending is not None and spending.stopped
    complete = summary.complete and not stopped
    published = job.work.publish(job, summary, complete)
    meter = job.attempt.meter
    if job.dry_run:
        estimate = meter.totals().get("cost_usd", 0.0)
        parent = job.spec.parent_run
        sweep = parent.sweep_dir if isinstance(parent, SweepParent) else None
        print(console.dry_run_report(job.work.title(job), meter, fit_line(job.cfg.runtime, estimate, sweep)))
        return
    where = str(job.output_dir)
    if live is not None:
        live.wait_opened()
        where += f" | MLflow run {live.run_id} at {job.cfg.tracking.uri}"
    print(job.work.report(job, summary, where, spending.status_line() if stopped else summary.status_line()),
          flush=True)
    if live is None:
        return
    # The results are on disk and printed: logging them is held together, an interrupt waits for it (a few
    # seconds) and is delivered once the run has ended FINISHED. Raised half-way through MLflow's store
    # writes, it could leave a SQLite transaction or a lock behind and the run RUNNING.
    with shielded():
        m = summary.metrics
        # the run spans every attempt: usage for the whole job (the folder's metrics.json: this attempt's)
        whole = {**m, **whole_job_usage(job.attempt.earlier, meter), **whole_job_metrics(m)}
        batch_ids = {"cupid.batch_ids": " ".join(meter.batches.ids)[:5000]} if meter.batches.ids else {}
        live.finish(FinalLog(
            metrics=whole, step=summary.n_units,
            tags={"cupid.complete": str(complete).lower(), **published.tags, **batch_ids},
            artifacts=[([str(f) for f in published.files], None),
                       ([str(p) for p in sorted((job.output_dir / ".hydra").glob("*.yaml"))], ".hydra")],
            table=published.table, plots=published.plots,
            summary={"calls": int(m.get("calls/total", 0)), "cost_usd": round(m.get("cost/usd", 0.0), 6)}))
