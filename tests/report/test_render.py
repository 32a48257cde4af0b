"""One plotting path: the same Figure as a PNG file or as inline SVG text, deterministic, small
and with each series' points countable."""

from __future__ import annotations

import re
from pathlib import Path

from harness.report.render import figure_png, figure_svg, new_figure, series, series_id


def _figure():  # type: ignore[no-untyped-def]
    fig = new_figure(4, 3)
    ax = fig.subplots()
    series(ax, [1, 2, 3, 4], [4.0, 3.0, 2.5, 2.0], key="loss/eager")
    series(ax, [1, 2, 3], [4.1, 3.1, 2.6], key="loss/graph")
    ax.set_title("loss")
    return fig


def _points(svg: str, key: str) -> int:
    """The <use> elements (one per point) inside the series' group."""
    start = svg.index(f'<g id="{series_id(key)}"')
    depth, i, uses = 0, start, 0
    for tag in re.finditer(r"<(/?)(g|use)\b[^>]*?(/?)>", svg[start:]):
        closing, name, selfclosing = tag.groups()
        if name == "use":
            uses += 1
        elif closing:
            depth -= 1
            if depth == 0:
                return uses
        elif not selfclosing:
            depth += 1
    raise AssertionError(f"unclosed series group {key}")


def test_svg_is_deterministic_salted_and_countable() -> None:
    a, b = figure_svg(_figure(), "p1"), figure_svg(_figure(), "p1")
    assert a == b and a.startswith("<svg") and "<?xml" not in a
    other = figure_svg(_figure(), "p2")
    ids_a = set(re.findall(r'id="([^"]+)"', a)) - {series_id("loss/eager"), series_id("loss/graph")}
    ids_b = set(re.findall(r'id="([^"]+)"', other)) - {series_id("loss/eager"), series_id("loss/graph")}
    assert ids_a and not ids_a & ids_b  # two figures inline in one page share no id
    assert "<text" in a and "<image" not in a and "<metadata" not in a and "figure_1" not in a
    assert _points(a, "loss/eager") == 4 and _points(a, "loss/graph") == 3
    # a series' marker style once, on its group, not on each point
    assert re.search(r'<g id="series-loss_eager" style="fill: #1f77b4; stroke: #1f77b4">', a)
    assert not re.search(r'<g id="series-loss_eager"[^>]*>\s*<path[^>]*/>\s*<defs>.*?</defs>\s*'
                         r'<g[^>]*>\s*<use [^>]*style=', a, re.S)
    assert len(a) < 20_000


def test_series_ids_are_valid_and_stable() -> None:
    assert series_id("loss/eager, rank 0") == "series-loss_eager_rank_0"
    assert series_id("x:y.z-1") == "series-x:y.z-1"


def test_png_of_the_same_figure(tmp_path: Path) -> None:
    out = figure_png(_figure(), tmp_path / "plots" / "f.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(data[16:20], "big") == 400  # 4 in at 100 dpi
