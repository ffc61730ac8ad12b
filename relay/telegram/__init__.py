"""The Telegram platform driver: a bot's connector speaks the Telegram Bot API
(``relay.telegram.testing`` is a fake Bot API server for tests and examples)."""
