"""The Slack platform driver: a bot's connector speaks Slack's Web API, Socket Mode and the
Events API (``relay.slack.testing`` is a fake Slack on loopback for tests and examples)."""
