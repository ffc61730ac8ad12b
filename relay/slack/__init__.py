"""The Slack platform driver: a bot's connector speaks Slack's Web API, Socket Mode and the
Events API (:class:`SlackDriver`; ``relay.slack.testing`` is a fake Slack on loopback for tests
and examples)."""

from __future__ import annotations

from relay.slack._api import SlackAuthError, SlackError, SlackUnreachable
from relay.slack.driver import SlackDriver

__all__ = ["SlackAuthError", "SlackDriver", "SlackError", "SlackUnreachable"]
