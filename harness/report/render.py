"""One plotting path, two outputs: a matplotlib Figure built once, written as a PNG file
(``figure_png``) or as inline SVG text for an HTML page (``figure_svg``).

Figures use matplotlib's object API on an Agg canvas (``new_figure``), so no global backend or
rcParam is switched. The SVG is deterministic and small: text stays text (``svg.fonttype:
none``, no embedded glyphs), no creation date, ids hashed with a salt of the caller's choosing
(distinct per figure, so several figures inline in one page never share an id), no raster.

Plotted series are countable in the SVG: ``series(ax, xs, ys, key=...)`` draws one marker per
point inside ``<g id="series-<key>">`` (matplotlib's ``gid``), so a test (or a reader) finds
each series by id and counts its points as the ``<use>`` elements under it.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any, Sequence

from harness.results import write_bytes_atomic

SERIES_PREFIX = "series-"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]+")
# matplotlib numbers its groups per figure (figure_1, axes_1, line2d_3, ...): the same ids in every
# figure of a page, referenced by nothing; dropped, as is the RDF metadata block.
_GROUP_ID = re.compile(r'<g id="[a-z0-9_.]+_[0-9]+">')
_METADATA = re.compile(r"\s*<metadata>.*?</metadata>", re.S)
# Coordinates to 1/100 pt (matplotlib writes 1/1,000,000): a third of the size, the same picture.
_GEOMETRY = re.compile(r'\b(d|x|y|x1|x2|y1|y2|width|height|transform)="([^"]*)"')
_LONG_DECIMAL = re.compile(r"(\d\.\d\d)\d+")
_SERIES_OPEN = re.compile(r'<g id="%s[^"]*">' % re.escape(SERIES_PREFIX))
_G_TAG = re.compile(r"<g\b|</g>")
_USE_STYLE = re.compile(r'(<use [^>]*?) style="([^"]*)"')


def new_figure(width_in: float, height_in: float, dpi: int = 100):  # type: ignore[no-untyped-def]
    """A matplotlib Figure on its own Agg canvas (renders to PNG and SVG alike)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def series_id(key: str) -> str:
    """The SVG id of a plotted series: ``series-`` then ``key`` with characters outside
    ``[A-Za-z0-9_.:-]`` replaced by ``_`` (a valid id, the same for the same key)."""
    return SERIES_PREFIX + _UNSAFE.sub("_", key)


def series(ax, xs: Sequence[float], ys: Sequence[float], *, key: str,  # type: ignore[no-untyped-def]
           **style: Any):
    """Plot one series with a marker per point, findable in the SVG as ``series_id(key)`` (one
    ``<use>`` element per point under it); the Line2D."""
    style.setdefault("marker", ".")
    (line,) = ax.plot(list(xs), list(ys), **style)
    line.set_gid(series_id(key))
    return line


def figure_png(fig, path: Path) -> Path:  # type: ignore[no-untyped-def]
    """Write ``fig`` as a PNG file, atomically; the path."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    write_bytes_atomic(path, buf.getvalue())
    return path


def _shorter(attr: "re.Match[str]") -> str:
    return f'{attr[1]}="{_LONG_DECIMAL.sub(_two_decimals, attr[2])}"'


def _two_decimals(number: "re.Match[str]") -> str:
    return number[1]


def _series_style_once(text: str) -> str:
    """A series' markers all carry the same style: written once on the series' group (fill and
    stroke inherit to each ``<use>``) instead of on every point."""
    out, pos = [], 0
    for opening in _SERIES_OPEN.finditer(text):
        if opening.start() < pos:
            continue
        depth, end = 0, None
        for tag in _G_TAG.finditer(text, opening.start()):
            depth += 1 if tag[0] == "<g" else -1
            if depth == 0:
                end = tag.end()
                break
        if end is None:
            break
        block = text[opening.end():end]
        styles = {m[2] for m in _USE_STYLE.finditer(block)}
        if len(styles) == 1:
            (style,) = styles
            block = _USE_STYLE.sub(r"\1", block)
            out += [text[pos:opening.start()], opening[0][:-1], f' style="{style}">', block]
        else:
            out += [text[pos:end]]
        pos = end
    out.append(text[pos:])
    return "".join(out)


def figure_svg(fig, salt: str = "dcp-harness") -> str:  # type: ignore[no-untyped-def]
    """``fig`` as an ``<svg>`` element to put inline in HTML (no XML prolog, no DOCTYPE):
    text as text, no date, ids hashed with ``salt`` (give each figure of one page its own),
    coordinates to 1/100 pt, the same text for the same figure and salt."""
    from matplotlib import rc_context

    buf = io.StringIO()
    # The font the figure was laid out with, then the browser's generic family (not the dozen
    # fallbacks matplotlib lists on every <text>).
    rc = {"svg.fonttype": "none", "svg.hashsalt": salt, "svg.image_inline": True,
          "font.sans-serif": ["DejaVu Sans"]}
    with rc_context(rc):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    start = text.find("<svg")
    if start < 0:  # matplotlib always writes one; anything else is a bug worth naming
        raise RuntimeError("matplotlib wrote SVG without an <svg> element")
    text = _METADATA.sub("", text[start:], count=1)
    text = _GEOMETRY.sub(_shorter, text)
    text = _series_style_once(text)
    return _GROUP_ID.sub("<g>", text).strip() + "\n"
