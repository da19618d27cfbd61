"""One style for every figure sentemb writes (issue 29 §2): paper sizes and fonts, a colour-blind-safe
palette with markers and line styles, the method → style map that all figures share, placement of
legends and labels off the data, the axis rules, and the saver (PNG, SVG and PDF).

The choices:

* **Size.** The *ACL two-column format (ACL, EMNLP, NAACL, where these methods were published):
  ``COLUMN_WIDTH`` 3.03 in (7.7 cm), ``TEXT_WIDTH`` 6.30 in (16 cm). A figure is drawn at the width it
  is printed at, so its 7–8 pt text stays 7–8 pt on paper (``RC``); never wider than ``TEXT_WIDTH``,
  and, for the paper configuration's results, no taller than a page (``PAGE_HEIGHT``). Layout is
  matplotlib's constrained layout, which makes room for legends placed outside the axes.
* **Colour.** Okabe & Ito's palette (2008), told apart under the common colour-vision deficiencies;
  its yellow is left out (too light on white). Colour is never the only difference: within a figure
  every series also differs from every other in marker, line style or marker fill (``StyleBook``),
  so a greyscale print keeps them apart.
* **One method, one look.** ``METHOD_STYLES``: SimCSE is always blue circles, SARCSE vermillion
  squares, … A method's other runs (ablations, open choices) keep its colour with a hollow or
  half-filled marker (then another marker) and another line style; untrained baselines are black and
  greys, each (backbone, pooler) its own marker.
* **Axes.** A numeric study value whose positive values span ≥ 10× (temperature 0.01–0.1, λ 1e-5–5e-2,
  batch 32–512), or ≥ 3× on a geometric grid (0.02, 0.05, 0.1), goes on a log axis (symlog when 0 is
  a point; ``value_scale``). A score axis (Spearman or accuracy × 100) spans at least
  ``MIN_SCORE_SPAN`` points (``score_limits``), so one seed's noise cannot fill the plot; the seeds'
  spread is drawn, and a series with a single seed says "1 seed".
* **Files.** ``save`` writes PNG (300 dpi), SVG and PDF (TrueType fonts embedded, ``pdf.fonttype``
  42, as the ACL format check asks), without time stamps, so a rerun on the same inputs writes the
  same SVG and PDF.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from ..utils import atomic_path

#: print sizes in inches (*ACL: one column 7.7 cm, the text block 16 cm)
COLUMN_WIDTH = 3.03
TEXT_WIDTH = 6.30
#: the tallest figure that fits a page of the format (text height 24.7 cm) with a short caption
PAGE_HEIGHT = 9.0

#: font sizes in points at print size (the format's captions are 10 pt, footnotes 9 pt)
FONT_SIZE = 8
SMALL_FONT_SIZE = 7
MIN_FONT_SIZE = 6  # the smallest text any figure may carry (tests check it)

#: a score axis (Spearman × 100, accuracy × 100) spans at least this many points: SimCSE's seeds differ
#: by ~0.5–1 point on the STS Avg, so a smaller range would show one seed's noise as a trend
MIN_SCORE_SPAN = 5.0

#: PNG resolution; SVG and PDF are vector
DPI = 300
FORMATS = ("png", "svg", "pdf")

#: Okabe & Ito (2008), "Color Universal Design", without the yellow (#F0E442)
OKABE_ITO = {
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "bluish green": "#009E73",
    "reddish purple": "#CC79A7",
    "orange": "#E69F00",
    "sky blue": "#56B4E9",
    "black": "#000000",
}
#: colours of methods not in METHOD_STYLES (Paul Tol's "muted" scheme, also colour-blind safe)
EXTRA_COLOURS = ("#882255", "#44AA99", "#332288", "#999933", "#AA4499", "#117733", "#88CCEE")
#: untrained baselines: black and greys (light enough to differ, dark enough to see on white)
BASELINE_COLOURS = ("#000000", "#555555", "#888888", "#333333", "#777777", "#AAAAAA")
#: series colours where no method decides (a study's points): the palette in order
CYCLE = tuple(OKABE_ITO.values())

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h", "p", "8", "d", "H", "*")
BASELINE_MARKERS = ("X", "h", "p", "8", "<", ">")
LINESTYLES = ("-", "--", ":", "-.")
#: marker fills, in the order a family uses them: solid, hollow, half (all tell apart in greyscale)
FILLS = ("full", "none", "left", "bottom", "right", "top")

#: the seed methods' colour and marker, in every figure (a method absent from a figure keeps its slot)
METHOD_STYLES = {
    "simcse": (OKABE_ITO["blue"], "o"),
    "sarcse": (OKABE_ITO["vermillion"], "s"),
    "una": (OKABE_ITO["bluish green"], "^"),
    "paser": (OKABE_ITO["reddish purple"], "D"),
    "infocse": (OKABE_ITO["orange"], "v"),
    "arccse": (OKABE_ITO["sky blue"], "P"),
}
BASELINE = "baseline"  # the method name of an untrained backbone's rows (run meta method=baseline; report reads it here)

#: rcParams of every figure, applied in ``paper_style`` (a context: importing this module changes nothing)
RC: dict[str, Any] = {
    "figure.dpi": 100,
    "savefig.dpi": DPI,
    "font.size": FONT_SIZE,
    "axes.titlesize": FONT_SIZE,
    "axes.labelsize": FONT_SIZE,
    "xtick.labelsize": SMALL_FONT_SIZE,
    "ytick.labelsize": SMALL_FONT_SIZE,
    "legend.fontsize": SMALL_FONT_SIZE,
    "legend.title_fontsize": SMALL_FONT_SIZE,
    "figure.titlesize": FONT_SIZE + 1,
    "axes.linewidth": 0.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    "xtick.major.size": 2.5,
    "ytick.major.size": 2.5,
    "xtick.minor.visible": False,
    "ytick.minor.visible": False,
    "lines.linewidth": 1.1,
    "lines.markersize": 4.0,
    "lines.markeredgewidth": 0.8,
    "errorbar.capsize": 2.0,
    "legend.frameon": False,
    "legend.handlelength": 2.4,  # long enough to show a dotted or dash-dotted line
    "legend.borderaxespad": 0.0,
    "axes.titlepad": 4.0,
    "image.cmap": "viridis",
    "pdf.fonttype": 42,
    "ps.fonttype": 42,
    "svg.hashsalt": "sentemb",  # stable ids: the same inputs write the same SVG
}


@contextlib.contextmanager
def paper_style() -> Iterator[None]:
    """Draw inside this context: the Agg backend and ``RC``, restored on exit."""
    import matplotlib

    matplotlib.use("Agg")
    from cycler import cycler

    with matplotlib.rc_context({**RC, "axes.prop_cycle": cycler(color=list(CYCLE))}):
        yield


def new_figure(width: float, height: float, **subplots):
    """(figure, axes array) at print size with constrained layout (``subplots``: nrows, ncols, …)."""
    import matplotlib.pyplot as plt

    subplots.setdefault("squeeze", False)
    return plt.subplots(figsize=(min(width, TEXT_WIDTH), height), layout="constrained", **subplots)


# ------------------------------------------------------------------------------------ styles
@dataclass(frozen=True)
class Style:
    """How one series is drawn: colour, marker, line style and marker fill (``FILLS``)."""

    colour: str
    marker: str
    linestyle: str = "-"
    fill: str = "full"

    @property
    def mark(self) -> tuple[str, str]:
        """What tells a series of markers apart without colour (in greyscale)."""
        return self.marker, self.fill

    def line(self, **extra: Any) -> dict[str, Any]:
        """Keyword arguments of ``Axes.plot`` for a line with markers (half-filled markers: white half)."""
        kw = {"color": self.colour, "marker": self.marker, "linestyle": self.linestyle, "fillstyle": self.fill,
              "markeredgecolor": self.colour}
        if self.fill not in ("full", "none"):
            kw["markerfacecoloralt"] = "white"
        return {**kw, **extra}

    def points(self, **extra: Any) -> dict[str, Any]:
        """Keyword arguments of ``Axes.plot`` for markers only (a scatter that keeps its marker style)."""
        return {**self.line(), "linestyle": "none", **extra}


def _marks(first_marker: str, markers: Sequence[str] = MARKERS) -> Iterator[tuple[str, str]]:
    """(marker, fill) in the order a family of series tries them: its own marker solid, hollow and half
    filled, then the other markers."""
    for marker in [first_marker, *[m for m in markers if m != first_marker]]:
        for fill in FILLS:
            yield marker, fill


class StyleBook:
    """The styles of one set of figures: a run keeps its style in every figure of the set.

    ``runs``: (name, method) pairs; ``baselines``: (backbone, pooler) pairs. A method's own run (named
    like the method) gets ``METHOD_STYLES``' colour and marker, solid, with a solid line; its other runs
    the method's colour with the next free marker fill (hollow, half) or marker and another line style;
    each baseline a grey and a marker of its own. No two entries share a marker and fill (``Style.mark``),
    so no two look alike in greyscale, as points or as lines."""

    def __init__(self, runs: Iterable[tuple[str, str]] = (), baselines: Iterable[tuple[str, str]] = ()):
        runs = sorted(set(runs), key=lambda r: (self._method_rank(r[1]), r[0] != r[1], r[0]))
        extra = sorted({m for _, m in runs if m not in METHOD_STYLES and m != BASELINE})
        self._method: dict[str, Style] = {m: Style(c, mk) for m, (c, mk) in METHOD_STYLES.items()}
        taken_markers = {mk for _, mk in METHOD_STYLES.values()}
        for i, m in enumerate(extra):  # a plug-in method: a colour of its own, the first marker no method has
            marker = next((mk for mk in MARKERS if mk not in taken_markers), MARKERS[i % len(MARKERS)])
            taken_markers.add(marker)
            self._method[m] = Style(EXTRA_COLOURS[i % len(EXTRA_COLOURS)], marker)
        used = {s.mark for s in self._method.values()}  # every method's own look stays reserved
        self._styles: dict[tuple, Style] = {}
        variants: dict[str, int] = {}
        for name, method in runs:
            if method == BASELINE:
                continue
            base = self._method[method]
            if name == method:
                self._styles[("run", name)] = base
                continue
            j = variants[method] = variants.get(method, 0) + 1
            mark = next(c for c in _marks(base.marker) if c not in used)
            used.add(mark)
            self._styles[("run", name)] = Style(base.colour, mark[0], LINESTYLES[j % len(LINESTYLES)], mark[1])
        for i, (backbone, pooler) in enumerate(sorted(set(baselines))):
            mark = next(c for c in _marks(BASELINE_MARKERS[i % len(BASELINE_MARKERS)], BASELINE_MARKERS + MARKERS)
                        if c not in used)
            used.add(mark)
            self._styles[(BASELINE, backbone, pooler)] = Style(BASELINE_COLOURS[i % len(BASELINE_COLOURS)], mark[0],
                                                               fill=mark[1])

    @staticmethod
    def _method_rank(method: str) -> tuple[int, str]:
        known = list(METHOD_STYLES)
        return (known.index(method), "") if method in known else (len(known), method)

    def method(self, method: str) -> Style:
        """A method's own style (a method this book has not seen: a grey circle)."""
        return self._method.get(method, Style("#777777", "o"))

    def run(self, name: str, method: str) -> Style:
        return self._styles.get(("run", name)) or self.method(method)

    def baseline(self, backbone: str, pooler: str | None) -> Style:
        return self._styles.get((BASELINE, backbone, pooler)) or Style(BASELINE_COLOURS[0], BASELINE_MARKERS[0])

    def order(self, row: Any) -> tuple:
        """Sort key of result rows: the seed methods in ``METHOD_STYLES`` order (a method's own run before
        its variants, then by name), plug-in methods by name, untrained baselines last."""
        if row["method"] == BASELINE:
            return (1, (0, ""), False, str(row.get("pooler")))
        return (0, self._method_rank(row["method"]), row["name"] != row["method"], row["name"])

    def of(self, row: Any) -> Style:
        """The style of a result row (a mapping with name, method, backbone and, for a baseline, pooler)."""
        if row["method"] == BASELINE:
            return self.baseline(row["backbone"], row.get("pooler"))
        return self.run(row["name"], row["method"])


def series_styles(n: int) -> list[Style]:
    """``n`` styles for series no method tells apart (a study's points): colour, marker and line style
    all change from one to the next; no two share marker and fill (up to 90 series)."""
    return [Style(CYCLE[i % len(CYCLE)], MARKERS[i % len(MARKERS)], LINESTYLES[i % len(LINESTYLES)],
                  FILLS[(i // len(MARKERS)) % len(FILLS)]) for i in range(n)]


# ------------------------------------------------------------------------------------ axes
def score_limits(low: float, high: float, min_span: float = MIN_SCORE_SPAN, pad: float = 0.15) -> tuple[float, float]:
    """Axis limits that hold [low, high] with a margin and span at least ``min_span`` (centred)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return 0.0, 100.0
    span = high - low
    if span * (1 + 2 * pad) < min_span:
        mid = (low + high) / 2
        return mid - min_span / 2, mid + min_span / 2
    return low - pad * span, high + pad * span


def value_scale(values: Sequence[Any]) -> str:
    """How a study's varied values go on an axis: ``category`` (not all numbers), ``linear``, ``log``
    or ``symlog`` (log with 0 among the values).

    Log where the positive values span ≥ 10× (temperature 0.01–0.1, λ, batch 32–512), or ≥ 3× on a
    grid that is even in log and not in linear steps (0.02, 0.05, 0.1); linear for an even grid that
    starts at 0 (margin 0–20°, θ 0–0.6), whose decade is only the distance from the first step."""
    if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return "category"
    s = sorted({float(v) for v in values})
    if len(s) < 2 or s[0] < 0:
        return "linear"
    pos = [v for v in s if v > 0]
    if len(pos) < 2:
        return "linear"
    steps = [b - a for a, b in zip(s, s[1:])]
    even = all(math.isclose(d, steps[0], rel_tol=1e-6) for d in steps)
    if s[0] == 0 and even:
        return "linear"
    log = "symlog" if s[0] == 0 else "log"
    ratio = pos[-1] / pos[0]
    if ratio >= 10:
        return log
    if ratio >= 3 and len(pos) >= 3:
        lin_steps = [b - a for a, b in zip(pos, pos[1:])]
        log_steps = [math.log(b / a) for a, b in zip(pos, pos[1:])]
        if _spread(log_steps) < _spread(lin_steps):
            return log
    return "linear"


def _spread(steps: list[float]) -> float:
    """Coefficient of variation of a grid's steps (0 for an even grid)."""
    mean = sum(steps) / len(steps)
    return math.sqrt(sum((d - mean) ** 2 for d in steps) / len(steps)) / mean


def value_axis(ax, values: Sequence[Any], labels: Sequence[str], axis: str = "x") -> list[float]:
    """Put a study's values on ``axis`` by ``value_scale``: ticks at the values, labelled ``labels``;
    returns each value's position (categories: 0, 1, …)."""
    scale = value_scale(values)
    setter = ax.set_xscale if axis == "x" else ax.set_yscale
    if scale == "category":
        pos = [float(i) for i in range(len(values))]
    else:
        pos = [float(v) for v in values]
        if scale == "log":
            setter("log")
        elif scale == "symlog":
            smallest = min(p for p in pos if p > 0)
            setter("symlog", linthresh=smallest, linscale=0.6)
    ticks = ax.set_xticks if axis == "x" else ax.set_yticks
    ticks(pos, list(labels))
    (ax.xaxis if axis == "x" else ax.yaxis).set_minor_locator(_null_locator())
    return pos


def _null_locator():
    from matplotlib.ticker import NullLocator

    return NullLocator()


def thin_ticklabels(ax, axis: str = "x", gap: float = 3.0) -> None:
    """Keep only tick labels that do not overprint a neighbour (``gap`` points apart; the first and the
    last tick are kept first): the axis gets fixed ticks at the kept places."""
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    a = ax.xaxis if axis == "x" else ax.yaxis
    view = sorted(ax.get_xlim() if axis == "x" else ax.get_ylim())
    shown = [(loc, t.label1) for t, loc in zip(a.get_major_ticks(), a.get_majorticklocs())
             if t.label1.get_text() and view[0] <= loc <= view[1]]
    if len(shown) < 2:
        return
    pad = gap * fig.dpi / 72 / 2
    order = [shown[0], shown[-1], *shown[1:-1]]
    kept: list = []
    for loc, label in order:
        box = label.get_window_extent(renderer).padded(pad)
        if not any(box.overlaps(b) for _, _, b in kept):
            kept.append((loc, label.get_text(), box))
    kept.sort(key=lambda k: k[0])
    (ax.set_xticks if axis == "x" else ax.set_yticks)([k[0] for k in kept], [k[1] for k in kept])


# ------------------------------------------------------------------------------------ legends and labels
def legend_outside(ax, handles=None, labels=None, where: str = "right", **kw):
    """A legend beside the axes (``right``) or above them (``top``), never over the data; constrained
    layout makes room for it."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return None
    if where == "top":
        kw = {"loc": "lower left", "bbox_to_anchor": (0.0, 1.02), "ncols": min(len(handles), 3), **kw}
    else:
        kw = {"loc": "upper left", "bbox_to_anchor": (1.02, 1.0), **kw}
    return ax.legend(handles, labels, **kw)


#: where a label may sit around its point: (dx, dy) directions, tried in order
_DIRECTIONS = ((1, 1), (1, -1), (-1, 1), (-1, -1), (1, 0), (-1, 0), (0, 1), (0, -1))
_DISTANCES = (4, 9, 16, 26)  # points


def place_labels(ax, xs: Sequence[float], ys: Sequence[float], texts: Sequence[str], tries: int = 3) -> bool:
    """Label each point (x, y) with its text where the label overlaps no other label, no marker and no
    line of the axes and stays inside them (distant labels get a leader line). Draws the figure to
    measure; returns False, with no labels left, where some label finds no free place."""
    import numpy as np

    fig = ax.figure
    for _ in range(tries):
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        frame = ax.get_window_extent(renderer)
        obstacles = _data_boxes(ax, renderer)
        placed, boxes = [], []
        # the most crowded points choose first
        pts = ax.transData.transform(np.column_stack([xs, ys]))
        crowd = [sum(np.hypot(*(p - q)) < 40 for q in pts) for p in pts]
        ok = True
        for i in sorted(range(len(texts)), key=lambda i: -crowd[i]):
            text = None
            for dist in _DISTANCES:
                for dx, dy in _DIRECTIONS:
                    scale = dist / math.hypot(dx, dy)
                    ha = {1: "left", -1: "right", 0: "center"}[dx]
                    va = {1: "bottom", -1: "top", 0: "center"}[dy]
                    t = ax.annotate(texts[i], (xs[i], ys[i]), xytext=(dx * scale, dy * scale),
                                    textcoords="offset points", ha=ha, va=va, fontsize=SMALL_FONT_SIZE,
                                    annotation_clip=False,
                                    arrowprops=({"arrowstyle": "-", "lw": 0.5, "color": "0.4", "shrinkA": 0,
                                                 "shrinkB": 3} if dist > _DISTANCES[1] else None))
                    box = t.get_window_extent(renderer).padded(1.5)
                    inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
                    if inside and not any(box.overlaps(b) for b in boxes + obstacles):
                        text = t
                        boxes.append(box)
                        break
                    t.remove()
                if text is not None:
                    break
            if text is None:
                ok = False
                break
            placed.append(text)
        if not ok:
            for t in placed:
                t.remove()
            return False
        # the layout may move the axes once the labels exist: measure again
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        final = [t.get_window_extent(renderer) for t in placed]
        obstacles = _data_boxes(ax, renderer)
        clash = any(a.overlaps(b) for j, a in enumerate(final) for b in final[j + 1:]) or \
            any(a.overlaps(o) for a in final for o in obstacles)
        if not clash:
            return True
        for t in placed:
            t.remove()
    return False


def _data_boxes(ax, renderer) -> list:
    """Display boxes of the markers and line segments drawn in ``ax`` (what a label must not cover)."""
    import numpy as np
    from matplotlib.transforms import Bbox

    boxes = []
    for line in ax.get_lines():
        if not line.get_visible():
            continue
        xy = line.get_transform().transform(np.column_stack(line.get_data()).astype(float))
        xy = xy[np.isfinite(xy).all(axis=1)]
        r = line.get_markersize() / 72 * ax.figure.dpi / 2 + 1 if line.get_marker() not in (None, "None", "none", "") else 1
        for x, y in xy:
            boxes.append(Bbox.from_extents(x - r, y - r, x + r, y + r))
        if line.get_linestyle() not in ("None", "none", "", " "):
            for (x0, y0), (x1, y1) in zip(xy, xy[1:]):
                for f in np.linspace(0, 1, 12):
                    x, y = x0 + f * (x1 - x0), y0 + f * (y1 - y0)
                    boxes.append(Bbox.from_extents(x - 1, y - 1, x + 1, y + 1))
    return boxes


# ------------------------------------------------------------------------------------ files
def save(fig, stem: str | Path, formats: Sequence[str] = FORMATS) -> list[Path]:
    """Write ``<stem>.png``, ``.svg`` and ``.pdf`` (``formats``; each atomically); returns the paths."""
    import logging

    logging.getLogger("fontTools").setLevel(logging.WARNING)  # the PDF backend's font subsetting chatters
    stem = Path(stem)
    paths = []
    for ext in formats:
        path = stem.with_name(f"{stem.name}.{ext}")
        meta = {"png": {"Software": None}, "svg": {"Date": None}, "pdf": {"CreationDate": None}}[ext]
        with atomic_path(path) as tmp, paper_style():  # the writers read RC too (fonts, SVG ids)
            fig.savefig(tmp, format=ext, dpi=DPI, metadata=meta)
        paths.append(path)
    return paths
