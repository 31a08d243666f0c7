"""The oracle rows of `dcoco heldout` and its markdown table.

The oracle re-selects within the drafter's own top-k by looking at the label: a slot counts as
right when the target's token is among the k candidates (teacher-forced context, so each slot is
judged on its own). Two rules: slot 1 kept (the paper's corrector rescores slots 2 and up), and
every slot re-selected (a corrector with start scores from the anchor). Each method's share of
the oracle's headroom is (τ - τ_drafter) / (τ_oracle - τ_drafter) at the table's largest cap.
"""

from __future__ import annotations

from torch import Tensor


def oracle_names(k: int, base: str) -> tuple[str, str]:
    """(slot 1 kept, every slot) row names of the top-k oracle over drafter method `base`."""
    return f"oracle top-{k}, slot 1 kept ({base})", f"oracle top-{k}, every slot ({base})"


def oracle_corrects(logits: Tensor, label_ids: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """logits [blocks, slots, vocab], labels [blocks, slots] -> (slot 1 kept, every slot), each
    [blocks, slots] bool: the label is among the top-k candidates (slot 1 kept: the argmax)."""
    top = logits.topk(k, dim=-1).indices  # [blocks, slots, k]
    covered = (top == label_ids[..., None]).any(dim=-1)
    kept = covered.clone()
    kept[:, 0] = top[:, 0, 0] == label_ids[:, 0]
    return kept, covered


def _shares(result: dict, cap: str) -> dict[str, str]:
    """Row -> its share of the two oracles' headroom at `cap` slots, as 'kept / every'."""
    oracle = result.get("oracle")
    rows = result["methods"]
    if not oracle or oracle["base"] not in rows:
        return {}
    base = rows[oracle["base"]]["tau"][cap]
    heads = [rows[name]["tau"][cap] - base for name in oracle_names(oracle["k"], oracle["base"])]
    return {
        method: " / ".join(f"{(row['tau'][cap] - base) / h:.0%}" if h > 0 else "–" for h in heads)
        for method, row in rows.items()
    }


def markdown_table(result: dict) -> str:
    config = result["config"]
    caps = config.get("num_draft_tokens", config.get("slots"))  # runs before the flag's rename
    rows = result["methods"]
    first = rows[next(iter(rows))]
    source = result["config"].get("bench_run")
    what = (
        f"blocks after reply positions of {source} (plain's T=0 replies)"
        if source
        else "held-out blocks"
    )
    shares = _shares(result, str(max(caps)))
    share_head = (
        f" share of the top-{result['oracle']['k']} headroom at {max(caps)} slots (slot 1 kept / "
        "every slot) |"
        if shares
        else ""
    )
    lines = [
        f"{first['blocks']} {what}, from {result['sequences']} sequences (the target's greedy "
        "replies), same anchors for every method.",
        "",
        "| method | "
        + " | ".join(f"τ ({c} slots)" for c in caps)
        + " | acceptance at slot 1 / 2 / 3 / 4 (given the earlier ones) | accuracy per slot |"
        + share_head,
        "|---|" + "--:|" * len(caps) + "---|---|" + ("--:|" if shares else ""),
    ]
    for method, row in rows.items():
        taus = " | ".join(f"{row['tau'][str(c)]:.3f}" for c in caps)
        positions = " / ".join(f"{v:.3f}" for v in row["per_position"][:4])
        accuracy = " / ".join(f"{v:.2f}" for v in row.get("slot_acc", []))  # older rows: none
        share = f" {shares.get(method, '–')} |" if shares else ""
        lines.append(f"| {method} | {taus} | {positions} | {accuracy} |{share}")
    if "suites" in first:
        lines += _suite_lines(rows, caps)
    return "\n".join(lines)


def _suite_lines(rows: dict, caps) -> list[str]:
    first = rows[next(iter(rows))]
    suites = list(first["suites"])
    caption = " / ".join(str(c) for c in caps)
    lines = [
        "",
        f"τ per suite ({caption} slots):",
        "",
        "| method | " + " | ".join(suites) + " |",
        "|---|" + "--:|" * len(suites),
    ]
    for method, row in rows.items():
        if "suites" not in row:  # the oracle rows: corpus blocks only
            continue
        cells = (
            " / ".join(f"{row['suites'][suite]['tau'][str(c)]:.3f}" for c in caps)
            for suite in suites
        )
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines
