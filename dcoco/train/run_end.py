"""The end of a training run: the trained artefact, its provenance and the closing log line."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path

from dcoco.models.drafter.drafter_io import save_drafter
from dcoco.models.heads.head_io import save_with_head
from dcoco.train.run_dir import provenance


def save_artefact(run, directory: Path, heldout: dict | None) -> Path:
    """The run's drafter (with its head, if any) as a loadable checkpoint in `directory`."""
    extra = {"training": {"steps": run.step, "heldout": heldout}}
    if run.head is None:
        return save_drafter(directory, run.drafter, run.target.info, extra=extra)
    return save_with_head(directory, run.drafter, run.head, run.target.info, extra=extra)


def write_provenance(run, artefact: Path, initial: dict | None, final: dict | None) -> None:
    """`<artefact>/provenance.json`: the config, data, budget and held-out metrics so far."""
    config, head = run.config, run.head
    record = provenance(
        config=dataclasses.asdict(config),
        run_dir=str(Path(config.out).resolve()),
        drafter_config=dataclasses.asdict(run.drafter.config),
        head_config=dataclasses.asdict(head.config) if head is not None else None,
        target=dataclasses.asdict(run.target.info),
        features=type(run.features).__name__,
        started=datetime.fromtimestamp(run.started, UTC).isoformat(),
        finished=datetime.now(UTC).isoformat(),
        steps=run.step,
        total_steps=run.total_steps,
        tokens_seen=run.tokens,
        train_records=len(run.train_set),
        initial_heldout=initial,
        final_heldout=final,
    )
    (artefact / "provenance.json").write_text(json.dumps(record, indent=2) + "\n")


def artefact_dir(run) -> Path:
    """`<out>/drafter/`, or `<out>/<head kind>/` for a run with a head."""
    return Path(run.config.out) / ("drafter" if run.head is None else run.head.kind)


def finish_run(run, initial: dict | None, final: dict | None) -> dict:
    """Save `<out>/drafter/` (or `<out>/<head kind>/`) with its provenance; returns the summary
    `train()` hands back."""
    artefact = save_artefact(run, artefact_dir(run), final)
    write_provenance(run, artefact, initial, final)
    run.run_dir.log({"event": "done", "step": run.step})
    run.run_dir.close()
    return {
        "initial": initial,
        "final": final,
        "steps": run.step,
        "tokens": run.tokens,
        "drafter": str(artefact),
    }
