"""The content of the bot's events: Markdown as HTML only when it says more, raw HTML never
obeyed, replies, threads and edits."""

from __future__ import annotations

import pytest

from relay.matrix._content import edit_content, message_content
from relay.matrix.driver import MatrixDriver, txn_id


def test_plain_text_has_no_formatted_body() -> None:
    assert message_content("just words") == {"msgtype": "m.text", "body": "just words"}


def test_markdown_becomes_formatted_body_and_the_plain_body_stays() -> None:
    content = message_content("**bold** and `code`")
    assert content["body"] == "**bold** and `code`"
    assert content["format"] == "org.matrix.custom.html"
    assert content["formatted_body"] == "<p><strong>bold</strong> and <code>code</code></p>"


def test_raw_html_in_a_reply_is_shown_as_text_never_obeyed() -> None:
    content = message_content("**hi** <script>alert(1)</script> <img src=x onerror=y>")
    assert "<script>" not in content["formatted_body"]
    assert "<img" not in content["formatted_body"]
    assert "&lt;script&gt;" in content["formatted_body"]


def test_a_reply_and_a_thread_relate_to_their_events() -> None:
    assert message_content("a", reply_to="$q")["m.relates_to"] == {
        "m.in_reply_to": {"event_id": "$q"}
    }
    threaded = message_content("a", thread_id="$root")["m.relates_to"]
    assert threaded == {
        "rel_type": "m.thread",
        "event_id": "$root",
        "is_falling_back": True,
        "m.in_reply_to": {"event_id": "$root"},
    }
    both = message_content("a", thread_id="$root", reply_to="$q")["m.relates_to"]
    assert both["is_falling_back"] is False
    assert both["m.in_reply_to"] == {"event_id": "$q"}


def test_an_edit_replaces_the_event_with_a_fallback_for_old_clients() -> None:
    content = edit_content("$orig", "new *text*", msgtype="m.notice")
    assert content["m.relates_to"] == {"rel_type": "m.replace", "event_id": "$orig"}
    assert content["body"] == "* new *text*"
    assert content["m.new_content"]["body"] == "new *text*"
    assert content["m.new_content"]["msgtype"] == "m.notice"
    assert content["m.new_content"]["formatted_body"] == "<p>new <em>text</em></p>"


def test_a_huge_reply_is_sent_without_its_html() -> None:
    text = "**x** " * 8000
    content = message_content(text)
    assert content["body"] == text
    assert "formatted_body" not in content


def test_the_transaction_id_is_stable_per_key_and_distinct_between_keys() -> None:
    assert txn_id("gw\x1fob-1") == txn_id("gw\x1fob-1")
    assert txn_id("gw\x1fob-1") != txn_id("gw\x1fob-2")
    assert txn_id("gw\x1fob-1").isalnum()
    assert len(txn_id("k")) == 42


def test_bad_options_are_refused_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="homeserver"):
        MatrixDriver("matrix.example.org", "@bot:example.org", password="pw")
    with pytest.raises(ValueError, match="user_id"):
        MatrixDriver("https://m.example.org", "bot", password="pw")
    with pytest.raises(ValueError, match="password or an access_token"):
        MatrixDriver("https://m.example.org", "@bot:example.org")
    with pytest.raises(ValueError, match="msgtype"):
        MatrixDriver("https://m.example.org", "@bot:example.org", password="pw", msgtype="m.image")
    with pytest.raises(TypeError, match="DriverIntake"):
        MatrixDriver("https://m.example.org", "@bot:example.org", password="pw").attach(print)  # type: ignore[arg-type]
