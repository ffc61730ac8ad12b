"""``lifecycle_svg``: every declared lifecycle drawn as well-formed, self-contained SVG with all
its states and events, terminal states marked, the same text every time and names escaped."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from enum import StrEnum
from typing import Any

import pytest

from relay.web.diagrams import lifecycle_svg
from statecore.cli.lifecycles import all_lifecycles
from statecore.gateway.delegations import DELEGATION
from statecore.lifecycle import Lifecycle, Transition

SVG = "{http://www.w3.org/2000/svg}"
LIFECYCLES = list(all_lifecycles())
"""Every lifecycle the entry points declare: what the dashboard draws."""


def _classes(element: ET.Element) -> set[str]:
    return set(element.get("class", "").split())


Box = tuple[float, float, float, float]  # x0, y0, x1, y1


def _rect(element: ET.Element) -> Box:
    x, y = float(element.get("x", "0")), float(element.get("y", "0"))
    return (x, y, x + float(element.get("width", "0")), y + float(element.get("height", "0")))


def _disc(element: ET.Element) -> Box:
    x, y, r = (float(element.get(a, "0")) for a in ("cx", "cy", "r"))
    return (x - r, y - r, x + r, y + r)


def _overlap(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _layout(svg: str) -> tuple[list[tuple[str, Box]], list[tuple[str, Box]]]:
    """The label boxes (each ``g.event``'s background rect, which holds its text) and the
    boxes of the states, the start dot and the end mark, as drawn (one shared transform)."""
    root = ET.fromstring(svg)
    labels: list[tuple[str, Box]] = []
    nodes: list[tuple[str, Box]] = []
    for group in root.iter(f"{SVG}g"):
        rect = group.find(f"{SVG}rect")
        if "event" in _classes(group) and rect is not None:
            labels.append((group.findtext(f"{SVG}text") or "", _rect(rect)))
        elif "state" in _classes(group) and rect is not None:
            nodes.append((group.get("data-state", ""), _rect(rect)))
    for circle in root.iter(f"{SVG}circle"):
        nodes.append(("[dot]", _disc(circle)))
    return labels, nodes


@pytest.mark.parametrize("lifecycle", LIFECYCLES, ids=lambda lc: lc.name)
def test_every_state_and_event_is_drawn(lifecycle: Lifecycle[Any]) -> None:
    """The drawing parses as SVG; each state is one box (terminal ones marked, with a double
    border); each event names at least one arrow."""
    root = ET.fromstring(lifecycle_svg(lifecycle))
    assert root.tag == f"{SVG}svg"
    boxes = {g.get("data-state"): g for g in root.iter(f"{SVG}g") if "state" in _classes(g)}
    assert list(boxes) == [s.value for s in lifecycle.states]
    for state in lifecycle.states:
        box = boxes[state.value]
        terminal = "terminal" in _classes(box)
        assert terminal == (state in lifecycle.terminal), state
        assert len(box.findall(f"{SVG}rect")) == (2 if terminal else 1)
        assert box.findtext(f"{SVG}text") == state.value
    arrows = [
        p.get("data-events", "") for p in root.iter(f"{SVG}path") if "transition" in _classes(p)
    ]
    drawn = {event for label in arrows for event in label.split(", ")}
    assert drawn == set(lifecycle.events)
    labels = {t.text for t in root.iter(f"{SVG}text")}
    for event in lifecycle.events:
        assert any(event in (text or "").split(", ") for text in labels), event


def test_a_lifecycle_without_creations_starts_with_an_unlabelled_arrow() -> None:
    """A lifecycle whose entities are made in their initial state (no creation event) gets
    one arrow from the start dot, without a label and not counted as a transition."""
    without = next(lc for lc in LIFECYCLES if not any(lc.creates(e) for e in lc.events))
    root = ET.fromstring(lifecycle_svg(without))
    initial = [p for p in root.iter(f"{SVG}path") if "initial" in _classes(p)]
    assert [p.get("data-events") for p in initial] == [""]
    with_creation = ET.fromstring(lifecycle_svg(DELEGATION))
    assert not [p for p in with_creation.iter(f"{SVG}path") if "initial" in _classes(p)]


def test_self_loops_creations_and_removals_are_drawn() -> None:
    """A move from a state to itself is an arrow of its own; creations start at the start dot
    and removals end at the end mark."""
    root = ET.fromstring(lifecycle_svg(DELEGATION))
    arrows = [p for p in root.iter(f"{SVG}path") if "transition" in _classes(p)]
    defer = [p for p in arrows if p.get("data-events") == "defer"]
    assert len(defer) == 2  # completed -> completed and unknown -> unknown
    assert all(" C" in (p.get("d") or "") for p in defer)  # loops are cubic curves
    assert len(list(root.iter(f"{SVG}circle"))) == 3  # the start dot and the end mark's two
    assert any("removed" in _classes(g) for g in root.iter(f"{SVG}g"))


def test_the_drawing_is_deterministic_and_needs_nothing_from_outside() -> None:
    """The same declaration gives the same text; nothing in it runs or loads anything."""
    for lifecycle in LIFECYCLES:
        text = lifecycle_svg(lifecycle)
        assert text == lifecycle_svg(lifecycle)
        lowered = text.lower()
        for forbidden in (
            "<script",
            "<style",
            "href=",
            "http://www.w3.org/1999",
            "onload",
            "@import",
        ):
            assert forbidden not in lowered, (lifecycle.name, forbidden)
        assert lowered.count("http") == 1  # the SVG namespace, nothing else


class Odd(StrEnum):
    OPEN = "open"
    DONE = "done"


def test_names_are_escaped() -> None:
    """A lifecycle's text reaches the SVG as text, never as markup (the name is escaped; state
    and event names are identifiers by declaration)."""
    lifecycle = Lifecycle(
        "odd",
        Odd,
        initial=Odd.OPEN,
        terminal=(Odd.DONE,),
        transitions=(Transition("make", None, Odd.OPEN), Transition("finish", Odd.OPEN, Odd.DONE)),
        description='<script>alert("x")</script> & more',
    )
    object.__setattr__(lifecycle, "_name", 'odd<b>&"x"')  # what a hostile name would look like
    text = lifecycle_svg(lifecycle)
    assert "<b>" not in text
    root = ET.fromstring(text)
    assert root.get("data-lifecycle") == 'odd<b>&"x"'
    assert root.findtext(f"{SVG}title") == 'lifecycle odd<b>&"x"'


@pytest.mark.parametrize("lifecycle", LIFECYCLES, ids=lambda lc: lc.name)
def test_no_label_overlaps_another_label_or_a_state(lifecycle: Lifecycle[Any]) -> None:
    """In every lifecycle the dashboard draws, no two event labels' boxes intersect, and no
    label's box intersects a state's box, the start dot or the end mark."""
    svg = lifecycle_svg(lifecycle)
    labels, nodes = _layout(svg)
    arrows = [p for p in ET.fromstring(svg).iter(f"{SVG}path") if "transition" in _classes(p)]
    assert [text for text, _ in labels] == [p.get("data-events") for p in arrows]
    clashes = [
        (first, second)
        for i, (first, a) in enumerate(labels)
        for second, b in labels[i + 1 :]
        if _overlap(a, b)
    ]
    clashes += [(label, node) for label, a in labels for node, b in nodes if _overlap(a, b)]
    assert clashes == []
