"""The report's pictures, drawn by matplotlib (Agg backend) on the bot host.

Each function takes plain numbers and returns an inline SVG string (``<svg …>…</svg>``,
no XML prolog, no metadata, no external reference) or, for Slack, PNG bytes. matplotlib is
imported inside the functions, so importing this module costs nothing and the runner never
needs it.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Sequence
from functools import lru_cache, wraps
from typing import Any, TypeVar

COLORS = {"passed": "#2e7d32", "failed": "#c62828", "skipped": "#9e9e9e",
          "running": "#1565c0", "accepted": "#2e7d32", "refused": "#ef6c00"}
_PROLOG = re.compile(r"^.*?(?=<svg)", re.S)
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.S)


F = TypeVar("F", bound=Callable[..., Any])


def cached(fn: F) -> F:
    """Draw a picture once per distinct input in this process: a report rewritten after a
    decision reuses the plots drawn when the run finished (lists become tuples as keys)."""
    memo = lru_cache(maxsize=128)(fn)

    @wraps(fn)
    def call(*args: Any) -> Any:
        return memo(*(_frozen(a) for a in args))
    return call  # type: ignore[return-value]


def _frozen(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    return value


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    # text.parse_math off: a label is drawn as written, never parsed as mathtext (a stage
    # name from a node like "$x^{x^{...}}$" made the parser fail and the report vanish)
    matplotlib.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "preflight",
                                "text.parse_math": False,
                                "font.size": 9, "axes.spines.top": False,
                                "axes.spines.right": False})
    import matplotlib.pyplot as plt

    return plt


def _figure(width: float, height: float, rows: int = 1, left: float = 1.2) -> tuple[Any, Any]:
    """A figure with fixed margins in inches: no automatic layout pass (which measures
    every text twice and is most of the drawing time)."""
    plt = _pyplot()
    fig, axes = plt.subplots(rows, 1, figsize=(width, height), squeeze=False)
    fig.subplots_adjust(left=left / width, right=1 - 0.9 / width, top=1 - 0.35 / height,
                        bottom=0.55 / height, hspace=0.9 / max(height / rows, 1.0))
    return fig, axes


def _svg(fig: Any) -> str:
    plt = _pyplot()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    return _METADATA.sub("", _PROLOG.sub("", buf.getvalue(), count=1))


@cached
def stage_timeline(stages: Sequence[tuple[str, float, float, str]]) -> str:
    """A Gantt bar per stage: (name, start s, duration s, state), from the run's start."""
    fig, axes = _figure(7.5, 0.28 * max(len(stages), 3) + 0.9)
    _timeline_axes(axes[0][0], stages)
    return _svg(fig)


def _timeline_axes(ax: Any, stages: Sequence[tuple[str, float, float, str]]) -> None:
    names = [s[0] for s in stages][::-1]
    for row, (_name, start, length, state) in enumerate(stages[::-1]):
        ax.barh(row, max(length, 0.001), left=start, color=COLORS.get(state, "#607d8b"),
                height=0.6)
        ax.text(start + length, row, f" {length:.2f} s", va="center", fontsize=7)
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("seconds since the run started")
    ax.set_title("Stages", loc="left", fontsize=10)


PLOT_POINTS = 2000  # the most points one curve or scatter of a report draws


def _evenly(count: int) -> list[int]:
    """Indexes of at most ``PLOT_POINTS`` of ``count`` values, evenly spaced, the last kept."""
    if count <= PLOT_POINTS:
        return list(range(count))
    step = (count - 1) / (PLOT_POINTS - 1)
    return sorted({round(k * step) for k in range(PLOT_POINTS)})


@cached
def throughput(times: Sequence[float]) -> str:
    """Items done against seconds since the first item started (a cumulative curve)."""
    fig, axes = _figure(7.5, 2.6, left=0.8)
    _throughput_axes(axes[0][0], times)
    return _svg(fig)


def _throughput_axes(ax: Any, times: Sequence[float]) -> None:
    ordered = sorted(times)
    # at most PLOT_POINTS steps drawn (evenly spaced ranks, the last one kept): a million
    # items drawn one by one made a ~20 MB picture of the same curve
    ranks = _evenly(len(ordered))
    ax.step([ordered[i] for i in ranks], [i + 1 for i in ranks], where="post", color="#1565c0")
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("items done")
    span = (ordered[-1] - ordered[0]) if len(ordered) > 1 else 0.0
    rate = f", {(len(ordered) - 1) / span:.2f} items/s" if span > 0 else ""
    ax.set_title(f"Throughput: {len(ordered)} items{rate}", loc="left", fontsize=10)


@cached
def summary_png(stages: Sequence[tuple[str, float, float, str]], times: Sequence[float]) -> bytes:
    """The picture that goes with the verdict in Slack: stage timeline and throughput."""
    plt = _pyplot()
    rows = 2 if times else 1
    height = 0.28 * max(len(stages), 3) + 1 + 2.4 * (rows - 1)
    fig, axes = _figure(8, height, rows)
    _timeline_axes(axes[0][0], stages)
    if times:
        _throughput_axes(axes[1][0], times)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


@cached
def bars_against(label: str, pairs: Sequence[tuple[str, float, float | None]], unit: str) -> str:
    """Measured bars with their reference (a card's peak, its memory) as a hollow bar."""
    fig, axes = _figure(7.5, 0.45 * max(len(pairs), 2) + 0.9, left=1.5)
    ax = axes[0][0]
    names = [p[0] for p in pairs]
    for row, (_name, measured, reference) in enumerate(pairs):
        if reference:
            ax.barh(row, reference, color="none", edgecolor="#424242", height=0.6)
            ax.text(reference, row, f" {reference:g} {unit}", va="center", fontsize=7)
        ax.barh(row, measured, color="#1565c0", height=0.45)
        share = f" ({measured / reference:.0%})" if reference else ""
        ax.text(measured, row - 0.32, f" {measured:.3g} {unit}{share}", fontsize=7)
    ax.set_yticks(range(len(names)), names)
    ax.set_title(label, loc="left", fontsize=10)
    return _svg(fig)


@cached
def time_against_size(points: Sequence[tuple[float, float]], fit: Any) -> str:
    """Each accepted item's seconds against its bytes, with the least-squares line."""
    fig, axes = _figure(7.5, 2.8, left=0.8)
    ax = axes[0][0]
    shown = [points[i] for i in _evenly(len(points))]
    xs, ys = [p[0] for p in shown], [p[1] for p in shown]
    ax.scatter(xs, ys, s=12, color="#1565c0")
    if fit and xs:
        fit = dict(fit)  # a cached call receives it as key/value pairs
        a, b = float(fit["intercept_s"]), float(fit["slope_s_per_byte"])
        lo, hi = min(xs), max(xs)
        ax.plot([lo, hi], [a + b * lo, a + b * hi], color="#c62828",
                label=f"fit, R² = {float(fit['r2']):.2f}")
        ax.legend(loc="upper left", fontsize=7, frameon=False)
    ax.set_xlabel("input bytes")
    ax.set_ylabel("seconds")
    ax.set_title("Per-item time against input size (pilot)", loc="left", fontsize=10)
    return _svg(fig)


@cached
def resume_losses(a: Sequence[float], b: Sequence[float], c: Sequence[float]) -> str:
    """The training resume comparison: A straight, B to the checkpoint, C resumed from it."""
    fig, axes = _figure(7.5, 2.8, left=0.8)
    ax = axes[0][0]
    k = len(b)
    ax.plot(range(1, len(a) + 1), a, marker="o", ms=3, label="A: straight through",
            color="#1565c0")
    ax.plot(range(1, k + 1), b, marker="s", ms=3, ls="--", label="B: up to the checkpoint",
            color="#2e7d32")
    ax.plot(range(k + 1, k + len(c) + 1), c, marker="^", ms=4, ls=":",
            label="C: resumed from B's checkpoint", color="#c62828")
    if k:
        ax.axvline(k + 0.5, color="#9e9e9e", lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=7, frameon=False)
    ax.set_title("Resume comparison: C must continue A exactly", loc="left", fontsize=10)
    return _svg(fig)
