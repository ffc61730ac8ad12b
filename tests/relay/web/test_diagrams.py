"""``lifecycle_svg``: every declared lifecycle drawn as well-formed, self-contained SVG with all
its states and events, terminal states marked, the same text every time and names escaped."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from enum import StrEnum
from typing import Any

import pytest

from relay.connector.buffer import BUFFER
from relay.web.diagrams import lifecycle_svg
from statecore.gateway.delegations import DELEGATION
from statecore.gateway.sessions import SESSION
from statecore.lifecycle import Lifecycle, Transition
from statecore.lifecycles import OBLIGATION

SVG = "{http://www.w3.org/2000/svg}"
LIFECYCLES = [OBLIGATION, BUFFER, SESSION, DELEGATION]


def _classes(element: ET.Element) -> set[str]:
    return set(element.get("class", "").split())


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
