"""What a reader sees on a rendered figure, checked mechanically (issue 29 §2); independent of how
sentemb draws it: these measure the drawn artists with matplotlib's renderer.

``problems(fig)`` lists what is wrong with a figure, empty when it passes:

* **legends** cover no data: a legend's box holds no marker, line segment, bar, band, violin or
  image of any axes;
* **text** does not overprint: no two visible texts (titles, axis and tick labels, annotations,
  legend entries, colour-bar labels, notes) overlap, and no point label covers a marker or line;
* **series** are told apart: within an axes no two series share colour, marker, line style and fill,
  nor, in greyscale, marker and fill (points) or marker, fill and line style (lines);
* **print size**: no wider than the *ACL text width nor taller than its page, every text at least
  6 pt, nothing cut off at the figure's edge.

Used by tests/test_figures.py and scripts/synthetic_figures.py (``--check``).
"""

from __future__ import annotations

import itertools

import numpy as np
from matplotlib.collections import LineCollection, PathCollection, PolyCollection
from matplotlib.colors import to_hex
from matplotlib.image import AxesImage
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.text import Annotation, Text
from matplotlib.transforms import Bbox

TEXT_WIDTH_IN = 6.30  # the *ACL text block (16 cm)
PAGE_HEIGHT_IN = 9.0  # its height (24.7 cm) less a short caption
from sentemb.report.style import MIN_FONT_SIZE as MIN_FONT_PT  # the style's floor is what is checked
_NO_LINE = ("None", "none", "", " ")


def _box(x, y, r):
    return Bbox.from_extents(x - r, y - r, x + r, y + r)


def _segment_boxes(xy, step=2.0):
    """Small boxes along a polyline in display coordinates, about ``step`` pixels apart."""
    out = []
    for (x0, y0), (x1, y1) in zip(xy, xy[1:]):
        n = max(2, int(np.hypot(x1 - x0, y1 - y0) / step) + 1)
        for f in np.linspace(0, 1, n):
            out.append(_box(x0 + f * (x1 - x0), y0 + f * (y1 - y0), 0.75))
    return out


def data_boxes(ax, renderer, images: bool = True) -> list[Bbox]:
    """Display-space boxes covering what ``ax`` plots: markers, line segments, bars, bands, images."""
    boxes = []
    for line in ax.get_lines():
        if not line.get_visible():
            continue
        xy = line.get_transform().transform(np.column_stack(line.get_data()).astype(float))
        xy = xy[np.isfinite(xy).all(axis=1)]
        if line.get_marker() not in (None, "None", "none", ""):
            r = line.get_markersize() * ax.figure.dpi / 72 / 2
            boxes += [_box(x, y, r) for x, y in xy]
        if line.get_linestyle() not in _NO_LINE:
            boxes += _segment_boxes(xy)
    for p in ax.patches:
        if p.get_visible() and isinstance(p, Rectangle):
            boxes.append(p.get_window_extent(renderer))
    for c in ax.collections:
        if not c.get_visible():
            continue
        if isinstance(c, LineCollection):
            for seg in c.get_segments():
                boxes += _segment_boxes(c.get_transform().transform(np.asarray(seg, dtype=float)))
        elif isinstance(c, PolyCollection):
            for path in c.get_paths():
                v = c.get_transform().transform(path.vertices)
                v = v[np.isfinite(v).all(axis=1)]
                if len(v):
                    boxes.append(Bbox.from_extents(*v.min(axis=0), *v.max(axis=0)))
        elif isinstance(c, PathCollection):
            offsets = c.get_offset_transform().transform(c.get_offsets())
            sizes = c.get_sizes() if len(c.get_sizes()) else [36.0]
            for (x, y), s in zip(offsets, itertools.cycle(sizes)):
                boxes.append(_box(x, y, np.sqrt(s) * ax.figure.dpi / 72 / 2))
    if images:
        boxes += [im.get_window_extent(renderer) for im in ax.images if isinstance(im, AxesImage)]
    return boxes


def drawn_texts(fig) -> list[Text]:
    """Every text the figure shows: tick labels within their axis' view, titles, labels, legends, notes."""
    tick_labels, shown = set(), []
    for ax in fig.axes:
        for axis, view in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            drawn = ax.get_visible() and ax.axison and axis.get_visible()
            lo, hi = sorted(view)
            for tick, loc in itertools.chain(zip(axis.get_major_ticks(), axis.get_majorticklocs()),
                                             zip(axis.get_minor_ticks(), axis.get_minorticklocs())):
                for label in (tick.label1, tick.label2):
                    tick_labels.add(id(label))
                    if drawn and label.get_visible() and tick.get_visible() and label.get_text() and \
                            lo - 1e-9 * abs(hi - lo) <= loc <= hi + 1e-9 * abs(hi - lo):
                        shown.append(label)
    for t in fig.findobj(Text):
        if id(t) in tick_labels or not t.get_visible() or not t.get_text().strip():
            continue
        if t.axes is not None and not t.axes.get_visible():
            continue
        shown.append(t)
    return shown


def series(ax) -> list[tuple[str, Line2D]]:
    """(label, line) of each series drawn in ``ax``: labelled lines and error-bar containers."""
    out = []
    in_containers = set()
    for c in ax.containers:
        lines = getattr(c, "lines", None)
        if lines and isinstance(lines[0], Line2D):
            in_containers.add(id(lines[0]))
            if not c.get_label().startswith("_"):
                out.append((c.get_label(), lines[0]))
    for line in ax.get_lines():
        if id(line) not in in_containers and not line.get_label().startswith("_") and line.get_visible():
            out.append((line.get_label(), line))
    return out


def look(line: Line2D) -> tuple:
    has_line = line.get_linestyle() not in _NO_LINE
    return (to_hex(line.get_color()), str(line.get_marker()), line.get_linestyle() if has_line else "none",
            line.get_fillstyle())


def grey_look(line: Line2D) -> tuple:
    colour, marker, linestyle, fill = look(line)
    return marker, linestyle, fill


def problems(fig) -> list[str]:
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    out = []
    frame = fig.bbox
    # print size
    width_in = fig.get_figwidth()
    if width_in > TEXT_WIDTH_IN + 1e-6:
        out.append(f"figure is {width_in:.2f} in wide, over the text width {TEXT_WIDTH_IN} in")
    if fig.get_figheight() > PAGE_HEIGHT_IN + 1e-6:
        out.append(f"figure is {fig.get_figheight():.2f} in tall, over a page ({PAGE_HEIGHT_IN} in)")
    texts = drawn_texts(fig)
    boxes = {id(t): t.get_window_extent(renderer) for t in texts}
    for t in texts:
        if t.get_fontsize() < MIN_FONT_PT:
            out.append(f"text {t.get_text()!r} is {t.get_fontsize():.1f} pt")
        b = boxes[id(t)]
        if b.x0 < frame.x0 - 1 or b.y0 < frame.y0 - 1 or b.x1 > frame.x1 + 1 or b.y1 > frame.y1 + 1:
            out.append(f"text {t.get_text()!r} is cut off at the figure's edge")
    # texts overprinting each other
    for a, b in itertools.combinations(texts, 2):
        if boxes[id(a)].padded(-0.5).overlaps(boxes[id(b)].padded(-0.5)):
            out.append(f"texts overlap: {a.get_text()!r} and {b.get_text()!r}")
    axes = [ax for ax in fig.axes if ax.get_visible()]
    data = {id(ax): data_boxes(ax, renderer) for ax in axes}
    # legends over data
    legends = [ax.get_legend() for ax in axes if ax.get_legend() is not None] + list(fig.legends)
    for leg in legends:
        lb = leg.get_window_extent(renderer)
        for ax in axes:
            hits = [d for d in data[id(ax)] if lb.overlaps(d)]
            if hits:
                out.append(f"legend ({', '.join(t.get_text() for t in leg.get_texts())[:60]}) covers {len(hits)} "
                           f"data element(s) of the axes {ax.get_title(loc='left') or ax.get_title()!r}")
    # point labels over markers and lines
    for ax in axes:
        obstacles = data_boxes(ax, renderer, images=False)
        for t in ax.texts:
            if isinstance(t, Annotation) and t.get_visible():
                tb = t.get_window_extent(renderer)
                if any(tb.overlaps(o) for o in obstacles):
                    out.append(f"label {t.get_text()!r} covers a marker or line")
    # series told apart
    for ax in axes:
        drawn = series(ax)
        for (la, a), (lb_, b) in itertools.combinations(drawn, 2):
            if look(a) == look(b):
                out.append(f"series {la!r} and {lb_!r} look the same: {look(a)}")
            elif grey_look(a) == grey_look(b):
                out.append(f"series {la!r} and {lb_!r} differ by colour only: {grey_look(a)}")
    return out

