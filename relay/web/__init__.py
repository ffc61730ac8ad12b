"""The browser-facing parts: a web chat platform a person can talk to a bot through, and a live
dashboard of every lifecycle, served by one small web server (:mod:`relay.web.server`).

* :class:`~relay.web.chat.WebChatPlatform` -- a platform driver for the connector whose users
  are people in a browser (``/chat/``);
* :class:`~relay.web.dashboard.Dashboard` -- counts per state, the oldest owed row, a live
  stream of transitions, one row's history, the lifecycle diagrams and the operator's actions
  over a store (``/dashboard/``; ``statecore dashboard --store URL``);
* :class:`~relay.web.server.WebServer` -- serves both on one port: plain files (shipped with
  the package, no build step, nothing from the internet) and one WebSocket per page.
"""

from relay.web.chat import WebChatPlatform
from relay.web.dashboard import Dashboard
from relay.web.server import WebServer

__all__ = ["Dashboard", "WebChatPlatform", "WebServer"]
