"""Figures: summaries of repeated measurements, the markdown table and the JSON file."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SYSTEMS = ("relaykit", "floor")


@dataclass
class Summary:
    """Median, min and max of repeated measurements (``values`` in the order taken)."""

    median: float
    min: float
    max: float
    n: int
    values: list[float]

    @classmethod
    def of(cls, values: list[float]) -> Summary:
        if not values:
            raise ValueError("no measurements")
        return cls(
            median=statistics.median(values),
            min=min(values),
            max=max(values),
            n=len(values),
            values=list(values),
        )


@dataclass
class Row:
    scenario: str
    metric: str
    unit: str
    relaykit: Summary | None
    floor: Summary | None = None
    target: str = ""
    ok: bool | None = None
    note: str = ""
    ratio_override: float | None = None
    """A ratio not computed as relaykit / floor of this row (e.g. growth between two rows)."""
    absolute: bool = False
    """The target is on relaykit's own figure (its max), not on the ratio to the floor."""

    @property
    def ratio(self) -> float | None:
        if self.ratio_override is not None:
            return self.ratio_override
        if self.relaykit is None or self.floor is None or not self.floor.median:
            return None
        return self.relaykit.median / self.floor.median


@dataclass
class Results:
    meta: dict[str, Any] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        return row


# --- formatting -------------------------------------------------------------------------------


def fmt_number(value: float, unit: str) -> str:
    if unit == "B":
        for size, suffix in ((1 << 20, "MiB"), (1 << 10, "KiB")):
            if abs(value) >= size:
                return f"{value / size:.1f} {suffix}"
        return f"{value:.0f} B"
    if unit == "MB":
        return f"{value:.1f} MB"
    if unit in ("ms", "s"):
        return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    if unit in ("events", "runs"):
        return f"{value:.0f}"
    if unit == "x":
        return f"{value:.2f}x"
    return f"{value:.3g} {unit}".strip()


def fmt_summary(summary: Summary | None, unit: str) -> str:
    if summary is None:
        return "–"
    text = fmt_number(summary.median, unit)
    if summary.n > 1 and summary.max != summary.min:
        text += f" ({fmt_number(summary.min, unit)} – {fmt_number(summary.max, unit)})"
    return text


def markdown_table(rows: list[Row]) -> str:
    lines = [
        "| scenario | metric | relaykit median (min – max) | floor median (min – max) | ratio | target |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        ratio = f"{row.ratio:.2f}x" if row.ratio is not None else ""
        target = row.target
        if row.ok is not None:
            target = f"{'met' if row.ok else '**missed**'}: {target}"
        metric = row.metric + (f" ({row.note})" if row.note else "")
        lines.append(
            f"| {row.scenario} | {metric} | {fmt_summary(row.relaykit, row.unit)} | "
            f"{fmt_summary(row.floor, row.unit)} | {ratio} | {target} |"
        )
    return "\n".join(lines)


def targets_table(rows: list[Row]) -> str:
    lines = ["| target | measured | status |", "|---|---|---|"]
    for row in rows:
        if row.ok is None:
            continue
        if row.absolute or row.ratio is None:
            assert row.relaykit is not None
            measured = f"{fmt_number(row.relaykit.max, row.unit)} (max)"
        else:
            measured = f"{row.ratio:.2f}x"
        lines.append(f"| {row.scenario}: {row.target} | {measured} | {'met' if row.ok else 'MISSED'} |")
    return "\n".join(lines)


def write_json(results: Results, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "meta": results.meta,
        "rows": [{**asdict(row), "ratio": row.ratio} for row in results.rows],
        "extra": results.extra,
        "failures": results.failures,
    }
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
