"""Pictures of a bench run (:mod:`diversed_hf.lab.bench`): trade-off plots, acceptance by position, and an
HTML view of generated text shaded by the target weight ``w`` chosen at each token.

They read plain result rows (the dicts of ``results.json``) and, for :func:`plot_all`, anything with the
``task``, ``rows``, ``examples`` and ``meta`` of a :class:`~diversed_hf.lab.bench.schema.BenchResult`.
Needs matplotlib (``pip install "diversed_hf[bench]"``); the HTML view needs nothing.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ..tasks import metric_label

if TYPE_CHECKING:  # type only: plots import nothing of the bench at run time
    from .schema import BenchResult

__all__ = ["plot_all", "plot_position_acceptance", "plot_tradeoffs", "target_weight_html"]

# One marker per family; colours are per method (_colors), the same in every plot.
_MARKERS = {
    "target-only": "s",
    "sd": "o",
    "lossy-sd": "^",
    "static-ensemble": ".",
    "speccascade": "v",
    "typical": "D",
    "fuzzy": "h",
    "topk-relaxed": "<",
    "judge": ">",
    "sd-finetuned": "P",
    "diversed": "*",
    "block": "X",
}
#: families whose swept runs are joined into a front of their own (the static ensemble's is drawn grey, apart)
SWEPT_FRONTS = ("lossy-sd", "speccascade", "typical", "fuzzy", "topk-relaxed", "judge")
# tab10 without its red (DIVERSED's) and grey (the static front's)
_PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#17becf",
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#dbdb8d",
    "#9edae5",
)


def _colors(rows: Sequence[dict]) -> dict[str, str]:
    colors, others = {}, 0
    for row in rows:
        if row["family"] == "target-only":
            colors[row["method"]] = "black"
        elif row["family"] == "diversed":
            colors[row["method"]] = "#d62728"
        elif row["family"] == "static-ensemble":  # darker grey for a larger weight on the target
            colors[row["method"]] = str(round(0.75 - 0.55 * (row["param"] if row["param"] is not None else 0.5), 3))
        else:
            colors[row["method"]] = _PALETTE[others % len(_PALETTE)]
            others += 1
    return colors


def _pyplot():
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError(
            "Plots need matplotlib: pip install 'diversed_hf[bench]' (or run the bench with --no-plots)."
        ) from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _front(rows: Sequence[dict], axis: str) -> list[tuple[float, float, str]]:
    """Static-ensemble sweep plus SD (w = 1), sorted by target weight: the front."""
    points = []
    for row in rows:
        if row["family"] == "static-ensemble" or row["family"] == "sd":
            if row.get(axis) is not None:
                points.append(
                    (row["param"] if row["param"] is not None else 1.0, row[axis], 100 * row["quality"], row["method"])
                )
    points.sort()
    return [(x, y, name) for _, x, y, name in points]


def _scatter_axis(ax, rows: Sequence[dict], axis: str, xlabel: str, percent: bool = False) -> None:
    scale = 100.0 if percent else 1.0
    colors = _colors(rows)
    front = _front(rows, axis)
    if front:
        ax.plot(
            [x * scale for x, _, _ in front],
            [y for _, y, _ in front],
            "-",
            color="gray",
            marker=".",
            label="static ensemble (sweep w; SD is w = 1)",
            zorder=1,
        )
        for x, y, name in front:
            if name.startswith("static"):
                ax.annotate(
                    name.replace("static ", ""),
                    (x * scale, y),
                    fontsize=7,
                    color="dimgray",
                    xytext=(3, -9),
                    textcoords="offset points",
                )
    for family in SWEPT_FRONTS:  # every other rule swept over its knob: its own front, dashed
        members = [row for row in rows if row["family"] == family and row.get(axis) is not None]
        if len(members) > 1:
            points = sorted((row[axis] * scale, 100 * row["quality"]) for row in members)
            color = colors[members[0]["method"]]
            ax.plot(*zip(*points), "--", color=color, alpha=0.6, zorder=2)
    for row in rows:
        if row["family"] == "static-ensemble" or row.get(axis) is None:
            continue
        diversed = row["family"] == "diversed"
        ax.scatter(
            [row[axis] * scale],
            [100 * row["quality"]],
            color=colors[row["method"]],
            marker=_MARKERS[row["family"]],
            s=160 if diversed else 45,
            label=row["method"],
            zorder=4 if diversed else 3,
            edgecolors="black" if diversed else "none",
        )
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)


def plot_tradeoffs(rows: Sequence[dict], path: str | Path, title: str = "", quality_label: str | None = None) -> Path:
    """Two panels: quality vs seconds per sample, and quality vs acceptance rate; the static-ensemble sweep is
    drawn as a line (the front) and every other method as a point."""
    plt = _pyplot()
    metric = quality_label or metric_label(rows[0]["quality_metric"] if rows else None)
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    _scatter_axis(left, rows, "seconds_per_sample", "seconds per sample (lower is faster)")
    _scatter_axis(right, rows, "acceptance_rate", "acceptance rate (%)", percent=True)
    left.set_ylabel(metric)
    right.set_ylabel(metric)
    handles, labels = right.get_legend_handles_labels()
    handles_left, labels_left = left.get_legend_handles_labels()
    for handle, label in zip(handles_left, labels_left):
        if label not in labels:
            handles.append(handle)
            labels.append(label)
    figure.legend(handles, labels, fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return path


def plot_position_acceptance(rows: Sequence[dict], path: str | Path, title: str = "") -> Path:
    """Acceptance of the draft at position k among the rounds that examined it (the k - 1 drafts before it
    were accepted), per method: how acceptance decays along a round, which the i.i.d. formula ignores."""
    plt = _pyplot()
    figure, ax = plt.subplots(figsize=(7, 4.5))
    colors = _colors(rows)
    for row in rows:
        values = row.get("position_acceptance") or []
        if not values:
            continue
        marker, color = _MARKERS[row["family"]], colors[row["method"]]
        positions = list(range(1, len(values) + 1))
        style = "--" if row["family"] == "static-ensemble" else "-"
        alpha = 0.5 if row["family"] == "static-ensemble" else 1.0
        ax.plot(
            positions, [100 * v for v in values], style, color=color, marker=marker, alpha=alpha, label=row["method"]
        )
    ax.set_xlabel("draft position k")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("acceptance (%) at position k, given examined")
    lowest = min((100 * v for row in rows for v in (row.get("position_acceptance") or [])), default=0.0)
    ax.set_ylim(max(0.0, 10 * math.floor(lowest / 10) - 5), 100.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    if title:
        ax.set_title(title)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return path


def _shade(weight: float | None) -> str:
    """w = 1 (trust the target): blue; w = 0 (trust the draft): orange; bonus token (no w): grey."""
    if weight is None or (isinstance(weight, float) and math.isnan(weight)):
        return "rgb(225,225,225)"
    w = min(max(float(weight), 0.0), 1.0)
    # interpolate orange (255,170,80) -> white -> blue (90,150,255) through the middle
    if w < 0.5:
        t = w / 0.5
        r, g, b = 255, int(170 + (255 - 170) * t), int(80 + (255 - 80) * t)
    else:
        t = (w - 0.5) / 0.5
        r, g, b = int(255 - (255 - 90) * t), int(255 - (255 - 150) * t), 255
    return f"rgb({r},{g},{b})"


def target_weight_html(examples: dict[str, list[dict]], title: str = "") -> str:
    """HTML of generated text, each token shaded by the ``w`` (weight on the target) used when it was emitted.

    ``examples`` maps a method name to records with ``prompt``, ``tokens`` (strings) and
    ``target_weights`` (floats, ``None`` for bonus tokens).
    """
    legend = "".join(
        f'<span class="tok" style="background:{_shade(w)}">w = {label}</span> '
        for w, label in (
            (0.0, "0 (draft)"),
            (0.25, "0.25"),
            (0.5, "0.5"),
            (0.75, "0.75"),
            (1.0, "1 (target)"),
            (None, "– (bonus)"),
        )
    )
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title or 'target weights')}</title>",
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}"
        ".tok{white-space:pre-wrap;border-radius:2px;font-family:monospace}"
        ".prompt{color:#555;white-space:pre-wrap;font-family:monospace;font-size:90%}"
        ".ex{margin:1em 0;padding:.5em;border:1px solid #ddd}</style></head><body>",
        f"<h1>{html.escape(title or 'Target weight per emitted token')}</h1>",
        "<p>Each emitted token is shaded by the weight <code>w</code> on the target in the verification "
        "distribution <code>w p + (1 - w) q</code> at its position. Hover a token for its value.</p>",
        f"<p>{legend}</p>",
    ]
    for method, records in examples.items():
        parts.append(f"<h2>{html.escape(method)}</h2>")
        for record in records:
            tokens = record.get("tokens") or []
            weights = record.get("target_weights") or [None] * len(tokens)
            spans = []
            for token, weight in zip(tokens, weights):
                tip = "bonus token (from the target)" if weight is None else f"w = {weight:.3f}"
                spans.append(
                    f'<span class="tok" title="{tip}" style="background:{_shade(weight)}">{html.escape(token)}</span>'
                )
            parts.append(
                f"<div class='ex'><div class='prompt'>{html.escape(record.get('prompt', ''))}</div>"
                f"<div>{''.join(spans)}</div></div>"
            )
    parts.append("</body></html>")
    return "\n".join(parts)


def plot_all(result: "BenchResult", output_dir: str | Path) -> dict[str, Path]:
    """Every picture of one task's result: ``<task>_tradeoffs.png``, ``<task>_positions.png`` and
    ``<task>_weights.html`` (the latter for the DIVERSED run, or else any run that recorded weights)."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    task = result.task
    paths = {
        f"{task}_tradeoffs": plot_tradeoffs(
            result.rows,
            output_dir / f"{task}_tradeoffs.png",
            title=task,
            quality_label=result.meta.get("quality_label"),
        ),
        f"{task}_positions": plot_position_acceptance(result.rows, output_dir / f"{task}_positions.png", title=task),
    }
    families = {row["method"]: row["family"] for row in result.rows}
    shown = {m: r for m, r in result.examples.items() if families.get(m) == "diversed"}
    if not shown:  # no head: show the cascades / one static point, whose w is also defined
        shown = {m: r for m, r in result.examples.items() if families.get(m) in ("speccascade",)}
    if shown:
        path = output_dir / f"{task}_weights.html"
        path.write_text(target_weight_html(shown, title=f"{task}: target weight per emitted token"))
        paths[f"{task}_weights"] = path
    return paths
