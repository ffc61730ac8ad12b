"""The content of the bot's events: plain ``body`` always, Markdown's HTML as ``formatted_body``
when it says more than the plain text, replies, threads and edits (sans-I/O).

Markdown is rendered by ``markdown-it-py`` in CommonMark mode with raw HTML switched off, so an
HTML tag in a reply (a bot echoing what a person wrote, say) is shown as text, never obeyed by
the person's client.
"""

from __future__ import annotations

import html
from typing import Any, Final

from markdown_it import MarkdownIt

__all__ = ["edit_content", "message_content"]

_CONTENT_BUDGET: Final = 60_000
"""Content bytes above which the HTML rendering is left out (the plain body alone is sent):
the specification limits a whole event to 65,536 bytes, and the rest of it needs room."""

_MARKDOWN = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})


def _formatted(text: str) -> str | None:
    """The HTML of ``text`` as Markdown, or None when it is only the text itself."""
    rendered = str(_MARKDOWN.render(text)).strip()
    plain = f"<p>{html.escape(text, quote=False)}</p>"
    if rendered == plain or rendered == plain.replace("\n", "<br />\n"):
        return None
    return rendered


def _body(text: str, msgtype: str, *, markdown: bool) -> dict[str, Any]:
    content: dict[str, Any] = {"msgtype": msgtype, "body": text}
    formatted = _formatted(text) if markdown else None
    if formatted is not None and len(formatted.encode()) + len(text.encode()) < _CONTENT_BUDGET:
        content["format"] = "org.matrix.custom.html"
        content["formatted_body"] = formatted
    return content


def message_content(
    text: str,
    *,
    msgtype: str = "m.text",
    reply_to: str | None = None,
    thread_id: str | None = None,
    markdown: bool = True,
) -> dict[str, Any]:
    """An ``m.room.message`` content: in ``thread_id``'s thread (with the fallback reply older
    clients show), as a reply to ``reply_to``.  Raises nothing."""
    content = _body(text, msgtype, markdown=markdown)
    if thread_id is not None:
        content["m.relates_to"] = {
            "rel_type": "m.thread",
            "event_id": thread_id,
            "is_falling_back": reply_to is None,
            "m.in_reply_to": {"event_id": reply_to or thread_id},
        }
    elif reply_to is not None:
        content["m.relates_to"] = {"m.in_reply_to": {"event_id": reply_to}}
    return content


def edit_content(
    event_id: str, text: str, *, msgtype: str = "m.text", markdown: bool = True
) -> dict[str, Any]:
    """The content replacing the bot's event ``event_id`` with ``text`` (``m.replace``; clients
    without edits show the ``* text`` fallback).  Raises nothing."""
    new = _body(text, msgtype, markdown=markdown)
    content = {"msgtype": msgtype, "body": f"* {text}", "m.new_content": new}
    if "formatted_body" in new:
        content["format"] = "org.matrix.custom.html"
        content["formatted_body"] = f"* {new['formatted_body']}"
    content["m.relates_to"] = {"rel_type": "m.replace", "event_id": event_id}
    return content
