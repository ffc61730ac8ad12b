"""Lifecycle diagrams as SVG, drawn from the declarations alone (no Graphviz, nothing fetched).

:func:`lifecycle_svg` lays a :class:`~statecore.lifecycle.Lifecycle` out left to right: a start
dot, then the states in columns by their distance (in moves) from the initial state, then, when
the lifecycle declares removals, an end mark.  Every declared transition is an arrow labelled
with its event names (several events between the same two states share one arrow); a move from
a state to itself is a loop over its box; terminal states have a double border.  The drawing uses
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
    nodes = _place(lifecycle, layers)
    marker = "arrow-" + re.sub(r"[^A-Za-z0-9_-]", "_", lifecycle.name)  # an XML id, always
    drawn: list[str] = []
    labels: list[str] = []
    xs = [n.x - n.half_w for n in nodes.values()] + [n.x + n.half_w for n in nodes.values()]
    ys = [n.y - n.half_h for n in nodes.values()] + [n.y + n.half_h for n in nodes.values()]
    edges = _edges(lifecycle)
    for (source, target), events in edges.items():
        text = ", ".join(events)
        if source == target:
            path, (lx, ly), bulge = _loop(nodes[source])
        else:
            bend = _bend(nodes[source], nodes[target], (target, source) in edges, nodes)
            path, (lx, ly), bulge = _arrow(nodes[source], nodes[target], bend)
        drawn.append(
            f'<path class="transition" data-events={quoteattr(text)} d="{path}" fill="none" '
            f'stroke="{_STROKE}" stroke-width="1.3" marker-end="url(#{marker})"/>'
        )
        labels.append(_label(lx, ly, text))
        half = (len(text) * _CHAR_W + 8) / 2
        xs += [lx - half, lx + half, bulge[0]]
        ys += [ly - 12, ly + 4, bulge[1]]
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


def _place(lifecycle: Lifecycle[Any], layers: list[list[Enum]]) -> dict[str, _Node]:
    """Every node's centre: columns left to right, each column centred vertically."""
    longest = max((len(", ".join(e)) for e in _edges(lifecycle).values()), default=0)
    gap_x = max(90.0, longest * _CHAR_W + 34.0)
    tallest = max(len(layer) for layer in layers)
    body_h = tallest * _BOX_H + (tallest - 1) * _GAP_Y
    middle = _TOP + body_h / 2
    nodes = {_START: _Node(_START, _MARGIN + _DOT_R, middle, _DOT_R, _DOT_R, True)}
    x = _MARGIN + 2 * _DOT_R + gap_x
    for layer in layers:
        col_w = max(_box_w(_key(s)) for s in layer)
        column_h = len(layer) * _BOX_H + (len(layer) - 1) * _GAP_Y
        y = middle - column_h / 2 + _BOX_H / 2
        for state in layer:
            half = _box_w(_key(state)) / 2
            nodes[_key(state)] = _Node(_key(state), x + col_w / 2, y, half, _BOX_H / 2, False)
            y += _BOX_H + _GAP_Y
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


def _crosses(a: _Node, b: _Node, bend: float, box: _Node) -> bool:
    """Whether the curve from ``a`` to ``b`` runs through ``box`` (with a little room)."""
    cx, cy = _curve(a, b, bend)
    for i in range(1, 40):
        t = i / 40
        x = (1 - t) ** 2 * a.x + 2 * (1 - t) * t * cx + t * t * b.x
        y = (1 - t) ** 2 * a.y + 2 * (1 - t) * t * cy + t * t * b.y
        if abs(x - box.x) <= box.half_w + 6 and abs(y - box.y) <= box.half_h + 6:
            return True
    return False


def _arrow(a: _Node, b: _Node, bend: float) -> tuple[str, tuple[float, float], tuple[float, float]]:
    """A quadratic curve from ``a``'s edge to ``b``'s, bowed ``bend`` to the left of its
    direction (so two opposite arrows part); where its label goes; its farthest point."""
    cx, cy = _curve(a, b, bend)
    start = _clip(a, cx, cy)
    end = _clip(b, cx, cy)
    # The label sits a third of the way along, not in the middle, where crossing arrows meet.
    t = 0.36
    label = (
        (1 - t) ** 2 * start[0] + 2 * (1 - t) * t * cx + t * t * end[0],
        (1 - t) ** 2 * start[1] + 2 * (1 - t) * t * cy + t * t * end[1] - 6,
    )
    path = f"M{_n(start[0])},{_n(start[1])} Q{_n(cx)},{_n(cy)} {_n(end[0])},{_n(end[1])}"
    return path, label, (label[0], label[1] + 6)


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


def _loop(node: _Node) -> tuple[str, tuple[float, float], tuple[float, float]]:
    """A loop over the top of a state's box, where its label goes, and its top."""
    top = node.y - node.half_h
    x0, x1 = node.x - 12, node.x + 12
    path = (
        f"M{_n(x0)},{_n(top)} C{_n(x0 - 22)},{_n(top - 34)} "
        f"{_n(x1 + 22)},{_n(top - 34)} {_n(x1)},{_n(top)}"
    )
    return path, (node.x, top - 32), (node.x, top - 26)


def _label(x: float, y: float, text: str) -> str:
    width = len(text) * _CHAR_W + 8
    return (
        f'<g class="event"><rect x="{_n(x - width / 2)}" y="{_n(y - 11)}" width="{_n(width)}" '
        f'height="15" rx="3" fill="#ffffff" fill-opacity="0.85"/>'
        f'<text x="{_n(x)}" y="{_n(y)}" text-anchor="middle" font-family="{_FONT}" '
        f'font-size="11" fill="#5a3e8a">{escape(text)}</text></g>'
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
