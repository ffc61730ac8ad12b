"""Lifecycle diagrams as SVG, drawn from the declarations alone (no Graphviz, nothing fetched).

:func:`lifecycle_svg` lays a :class:`~statecore.lifecycle.Lifecycle` out left to right: a start
dot, then the states in columns by their distance (in moves) from the initial state, then, when
the lifecycle declares removals, an end mark.  Every declared transition is an arrow labelled
with its event names (several events between the same two states share one arrow); a move from
a state to itself is a loop over its box; terminal states have a double border; a lifecycle
without a creation event starts with an unlabelled arrow to its initial state.  Each label is
placed on its arrow (or just beside it) where it covers no other label, no state and neither
dot; when one finds no such place, the layout is spread wider and tried again, and at the widest
a label that still does not fit goes to the nearest free place.  The drawing uses
presentation attributes only (no ``<style>``, no script, no external reference), so it shows the
same as an ``<img>`` under a strict content security policy, and the same declaration always
gives the same text.
"""

from __future__ import annotations

import math
import re
from collections import deque
from enum import Enum
from typing import Any
from xml.sax.saxutils import escape, quoteattr

import attrs

from statecore.lifecycle import Lifecycle

__all__ = ["lifecycle_svg"]

_CHAR_W = 7.3  # width of one character of the 12px monospace font (an estimate, generous)
_BOX_H = 32.0
_GAP_Y = 58.0  # room between boxes of one column for loops and bent arrows' labels
_MARGIN = 24.0
_TOP = 58.0  # the title and the first row's loops
_DOT_R = 7.0
_FONT = "ui-monospace, SFMono-Regular, Menlo, Consolas, monospace"
_STROKE = "#44546a"
_TERMINAL_FILL = "#eef6ee"
_STATE_FILL = "#f4f7fb"

_LABEL_H = 15.0  # a label's box: the 11px text and a little room
_LABEL_ROOM = 2.0  # the least room between a label and anything else it must not cover
_SPREADS = (1.0, 1.3, 1.7, 2.2)  # the spacings tried, until every label fits by its arrow
_ALONG = (0.5, 0.4, 0.6, 0.3, 0.7, 0.22, 0.78)  # where on an arrow its label may go, best first

_START = "[start]"
_END = "[removed]"


@attrs.frozen
class _Node:
    key: str
    x: float  # centre
    y: float
    half_w: float
    half_h: float
    round: bool  # the start dot and the end mark


def lifecycle_svg(lifecycle: Lifecycle[Any]) -> str:
    """Return ``lifecycle`` drawn as a standalone SVG document (text; see the module docs).

    Next: serve it as ``image/svg+xml``, put it in an ``<img src="data:image/svg+xml,...">`` or
    parse it with a DOM parser; every name in it is escaped.  Never raises for a valid
    declaration (the :class:`Lifecycle` constructor has already refused an invalid one).
    """
    layers = _layers(lifecycle)
    edges = _edges(lifecycle)
    # Wider spacing until every label finds a free place next to its arrow; the widest
    # spacing searches further out for the labels that still do not fit.
    for spread in _SPREADS:
        nodes = _place(lifecycle, layers, edges, spread)
        routes = _routes(lifecycle, edges, nodes)
        placed = _fit_labels(routes, nodes, search=spread == _SPREADS[-1])
        if placed is not None:
            break
    assert placed is not None  # the last spread always places every label
    marker = "arrow-" + re.sub(r"[^A-Za-z0-9_-]", "_", lifecycle.name)  # an XML id, always
    drawn: list[str] = []
    labels: list[str] = []
    xs = [n.x - n.half_w for n in nodes.values()] + [n.x + n.half_w for n in nodes.values()]
    ys = [n.y - n.half_h for n in nodes.values()] + [n.y + n.half_h for n in nodes.values()]
    for route, box in zip(routes, placed, strict=True):
        css = "transition" if route.text else "initial"
        drawn.append(
            f'<path class="{css}" data-events={quoteattr(route.text)} d="{route.path}" '
            f'fill="none" stroke="{_STROKE}" stroke-width="1.3" marker-end="url(#{marker})"/>'
        )
        xs += [x for x, _ in route.extent]
        ys += [y for _, y in route.extent]
        if box is not None:
            labels.append(_label(box, route.text))
            xs += [box.x0, box.x1]
            ys += [box.y0, box.y1]
    for state in lifecycle.states:
        drawn.append(_state(nodes[_key(state)], state, lifecycle))
    drawn.append(_dot(nodes[_START], filled=True))
    if _END in nodes:
        drawn.append(_dot(nodes[_END], filled=False))
    drawn.extend(labels)  # last: a label is never hidden under an arrow or a box
    # Bent arrows may reach past the boxes: shift everything so the drawing starts at the
    # margin, under the title, and size the canvas to what was drawn.
    dx = _MARGIN - min(*xs, _MARGIN)
    dy = _TOP - min(*ys, _TOP) if min(ys) < _TOP - 20 else 0.0
    width = max(xs) + dx + _MARGIN
    height = max(ys) + dy + _MARGIN
    name = escape(lifecycle.name)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_n(width)}" height="{_n(height)}" '
        f'viewBox="0 0 {_n(width)} {_n(height)}" role="img" '
        f"aria-label={quoteattr(f'lifecycle {lifecycle.name}')} "
        f"data-lifecycle={quoteattr(lifecycle.name)}>",
        f"<title>lifecycle {name}</title>",
        f'<defs><marker id="{marker}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="8" '
        f'markerHeight="8" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        f'fill="{_STROKE}"/></marker></defs>',
        '<rect width="100%" height="100%" fill="#ffffff"/>',
        f'<text x="{_n(_MARGIN)}" y="22" font-family="{_FONT}" font-size="14" '
        f'font-weight="bold" fill="#1f2d3d">{name}</text>',
        f'<g transform="translate({_n(dx)},{_n(dy)})">',
        *drawn,
        "</g>",
        "</svg>",
    ]
    return "\n".join(out) + "\n"


def _key(state: Enum) -> str:
    return str(state.value)


def _layers(lifecycle: Lifecycle[Any]) -> list[list[Enum]]:
    """States by distance from the initial one (breadth first over moves), each layer in
    declaration order."""
    distance: dict[Enum, int] = {lifecycle.initial: 0}
    todo = deque([lifecycle.initial])
    while todo:
        state = todo.popleft()
        for event in lifecycle.allowed_events(state):
            target = lifecycle.target(state, event)
            if target not in distance:
                distance[target] = distance[state] + 1
                todo.append(target)
    depth = max(distance.values(), default=0)
    return [[s for s in lifecycle.states if distance.get(s) == d] for d in range(depth + 1)]


def _box_w(text: str) -> float:
    return max(84.0, len(text) * _CHAR_W + 26.0)


def _place(
    lifecycle: Lifecycle[Any],
    layers: list[list[Enum]],
    edges: dict[tuple[str, str], list[str]],
    spread: float,
) -> dict[str, _Node]:
    """Every node's centre: columns left to right, each column centred vertically, the gaps
    between columns and between the boxes of a column widened by ``spread``."""
    longest = max((len(", ".join(e)) for e in edges.values()), default=0)
    gap_x = max(90.0, longest * _CHAR_W + 34.0) * spread
    gap_y = _GAP_Y * spread
    tallest = max(len(layer) for layer in layers)
    body_h = tallest * _BOX_H + (tallest - 1) * gap_y
    middle = _TOP + body_h / 2
    nodes = {_START: _Node(_START, _MARGIN + _DOT_R, middle, _DOT_R, _DOT_R, True)}
    x = _MARGIN + 2 * _DOT_R + gap_x
    for layer in layers:
        col_w = max(_box_w(_key(s)) for s in layer)
        column_h = len(layer) * _BOX_H + (len(layer) - 1) * gap_y
        y = middle - column_h / 2 + _BOX_H / 2
        for state in layer:
            half = _box_w(_key(state)) / 2
            nodes[_key(state)] = _Node(_key(state), x + col_w / 2, y, half, _BOX_H / 2, False)
            y += _BOX_H + gap_y
        x += col_w + gap_x
    if any(lifecycle.removes(e) for e in lifecycle.events):
        nodes[_END] = _Node(_END, x + _DOT_R + 2, middle, _DOT_R + 2, _DOT_R + 2, True)
    return nodes


def _edges(lifecycle: Lifecycle[Any]) -> dict[tuple[str, str], list[str]]:
    """(from, to) -> event names, in declaration order; creations start at the start dot and
    removals end at the end mark."""
    edges: dict[tuple[str, str], list[str]] = {}
    for t in lifecycle.transitions:
        target = _END if t.target is None else _key(t.target)
        for source in t.sources or (None,):
            pair = (_START if source is None else _key(source), target)
            if t.event not in edges.setdefault(pair, []):
                edges[pair].append(t.event)
    return edges


@attrs.frozen
class _Box:
    """An axis-aligned rectangle: a label's background, or the room a node takes."""

    x0: float
    y0: float
    x1: float
    y1: float

    @classmethod
    def around(cls, x: float, y: float, text: str) -> _Box:
        """The box of ``text``'s label centred on (x, y)."""
        half_w, half_h = _label_w(text) / 2, _LABEL_H / 2
        return cls(x - half_w, y - half_h, x + half_w, y + half_h)

    @classmethod
    def of(cls, node: _Node) -> _Box:
        return cls(
            node.x - node.half_w, node.y - node.half_h, node.x + node.half_w, node.y + node.half_h
        )

    def hits(self, other: _Box, room: float) -> bool:
        """Whether the two overlap, or come closer than ``room``."""
        return (
            self.x0 < other.x1 + room
            and other.x0 < self.x1 + room
            and self.y0 < other.y1 + room
            and other.y0 < self.y1 + room
        )


@attrs.frozen
class _Route:
    """One arrow: its event names (empty for the unlabelled arrow from the start dot of a
    lifecycle without creations), its path, the points it reaches (for the canvas size) and
    where its label may go, best first."""

    text: str
    path: str
    extent: tuple[tuple[float, float], ...]
    anchors: tuple[tuple[float, float], ...]


def _routes(
    lifecycle: Lifecycle[Any], edges: dict[tuple[str, str], list[str]], nodes: dict[str, _Node]
) -> list[_Route]:
    """Every arrow, self-loops first (their labels have the fewest places to go); a lifecycle
    without creations gets an unlabelled arrow from the start dot to its initial state."""
    pairs = sorted(edges, key=lambda pair: pair[0] != pair[1])  # stable: declaration order
    routes = []
    for source, target in pairs:
        text = ", ".join(edges[(source, target)])
        if source == target:
            routes.append(_loop(nodes[source], text))
        else:
            bend = _bend(nodes[source], nodes[target], (target, source) in edges, nodes)
            routes.append(_arrow(nodes[source], nodes[target], bend, text))
    if not any(lifecycle.creates(e) for e in lifecycle.events):
        routes.append(_arrow(nodes[_START], nodes[_key(lifecycle.initial)], 0.0, ""))
    return routes


def _fit_labels(
    routes: list[_Route], nodes: dict[str, _Node], *, search: bool
) -> list[_Box | None] | None:
    """Each route's label box (None for an unlabelled arrow), at the first of its anchors that
    overlaps no node and no label placed before it.  When a label fits at none: with
    ``search``, the nearest free place around its first anchor; else None (widen the layout)."""
    taken = [_Box.of(node) for node in nodes.values()]
    placed: list[_Box | None] = []
    for route in routes:
        if not route.text:
            placed.append(None)
            continue
        box = next(
            (
                candidate
                for x, y in route.anchors
                if not _blocked(candidate := _Box.around(x, y, route.text), taken)
            ),
            None,
        )
        if box is None:
            if not search:
                return None
            box = _search(route, taken)
        taken.append(box)
        placed.append(box)
    return placed


def _blocked(box: _Box, taken: list[_Box]) -> bool:
    return any(box.hits(other, _LABEL_ROOM) for other in taken)


def _search(route: _Route, taken: list[_Box]) -> _Box:
    """The free place nearest to ``route``'s first anchor, on rings ever further out (there is
    always one: past every box drawn, nothing is in the way)."""
    x, y = route.anchors[0]
    radius = 0.0
    while True:
        radius += 6.0
        for step in range(24):
            angle = step * math.pi / 12
            box = _Box.around(
                x + radius * math.cos(angle), y + radius * math.sin(angle), route.text
            )
            if not _blocked(box, taken):
                return box


def _bend(a: _Node, b: _Node, opposed: bool, nodes: dict[str, _Node]) -> float:
    """How far the arrow from ``a`` to ``b`` bows out of the straight line: apart from its
    opposite arrow when there is one, and further, alternately to either side, until it
    misses every other box (tried in a fixed order, so the drawing stays deterministic)."""
    base = 22.0 if opposed else 0.0
    others = [n for n in nodes.values() if n.key not in (a.key, b.key)]
    for step in range(12):
        # Opposed arrows only bow further out on their own side; a lone one tries both sides.
        bend = base + step * 30.0 if opposed else (step + 1) // 2 * 34.0 * (-1) ** (step + 1)
        if not any(_crosses(a, b, bend, other) for other in others):
            return bend
    return base


def _curve(a: _Node, b: _Node, bend: float) -> tuple[float, float]:
    """The control point of the quadratic curve from ``a``'s centre to ``b``'s."""
    dx, dy = b.x - a.x, b.y - a.y
    length = math.hypot(dx, dy) or 1.0
    mx, my = (a.x + b.x) / 2, (a.y + b.y) / 2
    return mx - dy / length * bend, my + dx / length * bend


def _on_curve(
    start: tuple[float, float], control: tuple[float, float], end: tuple[float, float], t: float
) -> tuple[float, float]:
    """The point at ``t`` (0..1) of the quadratic curve."""
    return (
        (1 - t) ** 2 * start[0] + 2 * (1 - t) * t * control[0] + t * t * end[0],
        (1 - t) ** 2 * start[1] + 2 * (1 - t) * t * control[1] + t * t * end[1],
    )


def _crosses(a: _Node, b: _Node, bend: float, box: _Node) -> bool:
    """Whether the curve from ``a`` to ``b`` runs through ``box`` (with a little room)."""
    control = _curve(a, b, bend)
    for i in range(1, 40):
        x, y = _on_curve((a.x, a.y), control, (b.x, b.y), i / 40)
        if abs(x - box.x) <= box.half_w + 6 and abs(y - box.y) <= box.half_h + 6:
            return True
    return False


def _arrow(a: _Node, b: _Node, bend: float, text: str) -> _Route:
    """A quadratic curve from ``a``'s edge to ``b``'s, bowed ``bend`` to the left of its
    direction (so two opposite arrows part).  Its label goes on the curve, nearest the middle
    first, else just beside it."""
    control = _curve(a, b, bend)
    start = _clip(a, *control)
    end = _clip(b, *control)
    path = (
        f"M{_n(start[0])},{_n(start[1])} Q{_n(control[0])},{_n(control[1])} "
        f"{_n(end[0])},{_n(end[1])}"
    )
    points = [_on_curve(start, control, end, t) for t in _ALONG]
    side = _label_w(text) / 2 + 4
    anchors = [
        (x + ox, y + oy)
        for offsets in (((0.0, 0.0),), ((0.0, -11.0), (0.0, 11.0)), ((side, 0.0), (-side, 0.0)))
        for x, y in points
        for ox, oy in offsets
    ]
    extent = (start, end, *(_on_curve(start, control, end, i / 8) for i in range(1, 8)))
    return _Route(text, path, extent, tuple(anchors))


def _clip(node: _Node, toward_x: float, toward_y: float) -> tuple[float, float]:
    """Where the line from ``node``'s centre toward a point leaves its box (or dot)."""
    dx, dy = toward_x - node.x, toward_y - node.y
    if dx == 0 and dy == 0:
        return node.x, node.y
    if node.round:
        scale = node.half_w / math.hypot(dx, dy)
    else:
        scale = min(
            node.half_w / abs(dx) if dx else math.inf,
            node.half_h / abs(dy) if dy else math.inf,
        )
    return node.x + dx * scale, node.y + dy * scale


def _loop(node: _Node, text: str) -> _Route:
    """A loop over the top of a state's box; its label goes above it, else beside it."""
    top = node.y - node.half_h
    x0, x1 = node.x - 12, node.x + 12
    path = (
        f"M{_n(x0)},{_n(top)} C{_n(x0 - 22)},{_n(top - 34)} "
        f"{_n(x1 + 22)},{_n(top - 34)} {_n(x1)},{_n(top)}"
    )
    side = _label_w(text) / 2 + 24
    above = top - 26 - _LABEL_H / 2 - 2
    anchors = (
        (node.x, above),
        (node.x - side, top - 18),
        (node.x + side, top - 18),
        (node.x, above - _LABEL_H - 4),
    )
    return _Route(text, path, ((x0 - 12, top - 26), (x1 + 12, top - 26)), anchors)


def _label_w(text: str) -> float:
    return len(text) * _CHAR_W + 8


def _label(box: _Box, text: str) -> str:
    """A label: its text on a white background box (``box``)."""
    middle = (box.x0 + box.x1) / 2
    return (
        f'<g class="event"><rect x="{_n(box.x0)}" y="{_n(box.y0)}" '
        f'width="{_n(box.x1 - box.x0)}" height="{_n(box.y1 - box.y0)}" rx="3" fill="#ffffff" '
        f'fill-opacity="0.85"/><text x="{_n(middle)}" y="{_n(box.y1 - 4)}" '
        f'text-anchor="middle" font-family="{_FONT}" font-size="11" '
        f'fill="#5a3e8a">{escape(text)}</text></g>'
    )


def _state(node: _Node, state: Enum, lifecycle: Lifecycle[Any]) -> str:
    terminal = lifecycle.is_terminal(state)
    initial = state is lifecycle.initial
    classes = "state" + (" terminal" if terminal else "") + (" initial" if initial else "")
    x, y = node.x - node.half_w, node.y - node.half_h
    w, h = 2 * node.half_w, 2 * node.half_h
    parts = [
        f'<g class="{classes}" data-state={quoteattr(_key(state))}>',
        f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(w)}" height="{_n(h)}" rx="7" '
        f'fill="{_TERMINAL_FILL if terminal else _STATE_FILL}" stroke="{_STROKE}" '
        f'stroke-width="{"2" if initial else "1.3"}"/>',
    ]
    if terminal:  # the double border of a state nothing leaves
        parts.append(
            f'<rect x="{_n(x + 3.5)}" y="{_n(y + 3.5)}" width="{_n(w - 7)}" '
            f'height="{_n(h - 7)}" rx="5" fill="none" stroke="{_STROKE}" stroke-width="1"/>'
        )
    parts.append(
        f'<text x="{_n(node.x)}" y="{_n(node.y + 4)}" text-anchor="middle" '
        f'font-family="{_FONT}" font-size="12" fill="#1f2d3d">{escape(_key(state))}</text></g>'
    )
    return "".join(parts)


def _dot(node: _Node, *, filled: bool) -> str:
    """The start dot (filled) or the end mark of a removal (a ring round a dot)."""
    if filled:
        return (
            f'<circle class="start" cx="{_n(node.x)}" cy="{_n(node.y)}" r="{_n(node.half_w)}" '
            f'fill="{_STROKE}"/>'
        )
    return (
        f'<g class="removed"><circle cx="{_n(node.x)}" cy="{_n(node.y)}" r="{_n(node.half_w)}" '
        f'fill="#ffffff" stroke="{_STROKE}" stroke-width="1.5"/><circle cx="{_n(node.x)}" '
        f'cy="{_n(node.y)}" r="{_n(node.half_w - 4)}" fill="{_STROKE}"/></g>'
    )


def _n(value: float) -> str:
    """A coordinate as text: one decimal, no ``-0.0`` (the same input, the same text)."""
    text = f"{value:.1f}"
    return "0.0" if text == "-0.0" else text
