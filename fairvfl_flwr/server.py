"""The ServerApp: config → labels → strategy → run folder."""

from __future__ import annotations

from logging import INFO
from pathlib import Path
from typing import Any, Mapping

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log

from . import reliability
from .checkpoint import labels_fingerprint
from .config import RunConfig
from .partydata import server_labels_for
from .problem import load_data, party_columns
from .results import RunRecorder, format_summary, run_folder
from .strategy import FairVFL


def run_server(grid: Grid, run_config: Mapping[str, Any], run_id: int | str | None = None) -> tuple[dict, Path]:
    """Run one FairVFL training job on ``grid``; return its summary and run folder.

    Every input is validated (config, data, partition) before the first message.
    """
    cfg = RunConfig.from_flower(run_config)
    if cfg.server_labels:  # deployment: the server holds only its label file, never a feature table
        ds, columns, labels = None, [], server_labels_for(cfg)
    else:
        ds = load_data(cfg)
        columns = party_columns(cfg, ds)  # validates num-parties / active-columns against the table
        labels = server_labels_for(cfg, ds)
    # resume-from: continue that run folder from its checkpoint (reliability.py, docs/reliability.md)
    resume = reliability.load_resume(cfg, labels, cfg.resume_from) if cfg.resume_from else None
    folder = Path(cfg.resume_from).expanduser().resolve() if resume else run_folder(cfg, run_id)
    recorder = RunRecorder(
        folder, cfg, extra={"party-columns": [len(c) for c in columns], "dataset-summary": ds.summary() if ds else None}
    )
    log(INFO, "FairVFL: writing results to %s", folder)
    strategy = FairVFL(cfg, labels, on_round=recorder.add)
    strategy.reliability = reliability.Reliability(folder, resume, labels_fingerprint(labels))
    if resume:
        recorder.rows = list(resume[0]["history"])
    try:
        strategy.start(grid)
    except Exception as exc:  # a party stayed away, a bad reply, divergence: say so, keep the history
        reliability.stopped(strategy, strategy.reliability, recorder, folder, exc)
        raise
    summary = recorder.finish(
        {"party_columns": [len(c) for c in columns], "setup_seconds": strategy.setup_seconds,
         "batch_size": strategy.batch_size}  # 0: full batch (also when batch-size >= the training rows)
    )
    text = format_summary(summary, folder)
    log(INFO, "%s", text)
    return summary, folder


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    if str(context.run_config.get("mode", "fairvfl")) != "fairvfl":  # baselines / scores (runner.py)
        from .runner import run_job

        run_job(grid, context.run_config, getattr(grid.run, "run_id", None))
        return
    run_server(grid, context.run_config, getattr(grid.run, "run_id", None))
