"""The bot's Matrix session: its access token and device, kept as the connector's notes.

The homeserver deduplicates a send by its transaction id per device, so the device must outlive
every restart of the connector: the device id is chosen (or read back) and saved *before* the
first login, and a login after the server forgot the token logs in to the same device again.
The access token is kept in the connector's store as a note (``access_token``): whoever can read
that store can act as the bot, like whoever can read the configuration that holds its password.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

from relay.connector.intake import DriverIntake
from relay.matrix._api import MatrixApi, MatrixAuthError, MatrixError, path

__all__ = ["NOTE_DEVICE", "NOTE_NEXT_BATCH", "NOTE_TOKEN", "Session"]

log = logging.getLogger("relay.matrix")

NOTE_TOKEN = "access_token"
NOTE_DEVICE = "device_id"
NOTE_NEXT_BATCH = "next_batch"


class Session:
    """Logging in, and again when the server forgot the token (one login at a time)."""

    def __init__(
        self,
        api: MatrixApi,
        *,
        platform: str,
        user_id: str,
        password: str | None,
        access_token: str | None,
        device_id: str | None,
    ) -> None:
        self.api = api
        self.platform = platform
        self.user_id = user_id
        self._password = password
        self._configured_token = access_token
        self._configured_device = device_id
        self.device_id: str | None = None
        self.ready = False
        self._lock = asyncio.Lock()
        self.intake: DriverIntake | None = None

    def _notes(self) -> DriverIntake:
        if self.intake is None:
            raise RuntimeError("the Matrix driver is not attached to a connector")
        return self.intake

    async def establish(self) -> None:
        """Use the stored (or configured) token if the server still knows it, else log in.

        Raises :class:`MatrixAuthError` when the credentials are refused for good,
        :class:`~relay.matrix._api.MatrixError` / ``MatrixUnreachable`` for a server that
        cannot answer now (try again later), ``StoreError`` when the notes cannot be read.
        """
        async with self._lock:
            notes = self._notes()
            stored_token = await notes.load(self.platform, NOTE_TOKEN)
            self.device_id = await notes.load(self.platform, NOTE_DEVICE) or self._configured_device
            for token in dict.fromkeys(t for t in (stored_token, self._configured_token) if t):
                self.api.use_token(token)
                try:
                    who = await self.api.request("GET", path("account", "whoami"))
                except MatrixError as exc:
                    if exc.unknown_token:
                        continue
                    raise
                self._check_user(who)
                device = who.get("device_id")
                if isinstance(device, str) and device and device != self.device_id:
                    self.device_id = device
                    await notes.save(self.platform, NOTE_DEVICE, device)
                if token != stored_token:
                    await notes.save(self.platform, NOTE_TOKEN, token)
                self.ready = True
                return
            await self._login()

    async def relogin(self, failed_token: str | None) -> bool:
        """After the server refused ``failed_token``: log in again (to the same device) unless
        another task already did.  True when a fresh token is in use; False when there is no
        password to log in with.  Raises as :meth:`establish` does."""
        async with self._lock:
            if self.api.token != failed_token and self.api.token is not None:
                return True
            if self._password is None:
                self.ready = False
                return False
            await self._login()
            return True

    async def _login(self) -> None:
        notes = self._notes()
        if self._password is None:
            raise MatrixAuthError(
                f"the homeserver does not know the access token of {self.user_id} and no "
                "password is configured to log in again"
            )
        if self.device_id is None:
            # Saved before the login: a crash after it must not lead to a second device.
            self.device_id = "STATECORE" + secrets.token_hex(5).upper()
            await notes.save(self.platform, NOTE_DEVICE, self.device_id)
        body: dict[str, Any] = {
            "type": "m.login.password",
            "identifier": {"type": "m.id.user", "user": self.user_id},
            "password": self._password,
            "device_id": self.device_id,
            "initial_device_display_name": "statecore connector",
        }
        try:
            answer = await self.api.request("POST", path("login"), body=body, authed=False)
        except MatrixError as exc:
            if exc.status in (400, 401, 403) and not exc.rate_limited:
                raise MatrixAuthError(
                    f"the homeserver refused to log in {self.user_id}: {exc}"
                ) from None
            raise
        token = answer.get("access_token")
        if not isinstance(token, str) or not token:
            raise MatrixAuthError("the homeserver's login answer holds no access_token")
        self._check_user(answer)
        device = answer.get("device_id")
        if isinstance(device, str) and device:
            self.device_id = device
        self.api.use_token(token)
        await notes.save(self.platform, NOTE_TOKEN, token)
        if self.device_id is not None:
            await notes.save(self.platform, NOTE_DEVICE, self.device_id)
        self.ready = True
        log.info("matrix: logged in as %s on device %s", self.user_id, self.device_id)

    def _check_user(self, answer: dict[str, Any]) -> None:
        user = answer.get("user_id")
        if isinstance(user, str) and user != self.user_id:
            raise MatrixAuthError(
                f"the access token belongs to {user[:100]}, not to {self.user_id}"
            )
