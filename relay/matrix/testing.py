"""A throwaway Matrix homeserver for tests and examples: Synapse from the ``matrix-synapse``
wheel (a test dependency: ``pip install 'statecore[matrix-testing]'``).

:func:`start_homeserver` writes a configuration into a new temporary directory and starts Synapse
(``python -m synapse.app.homeserver``) on 127.0.0.1 at a port the kernel picks, with SQLite, no
open registration, no federation, no presence, no outbound connections and rate limits relaxed so
that tests are not throttled (``rate_limited=True`` keeps Synapse's default message limit, so a
test can provoke a real ``M_LIMIT_EXCEEDED``).  Users are made through the admin registration
API with the server's shared secret.  Every wait is bounded; a server that cannot be had raises
:class:`HomeserverUnavailable` saying why, the log's tail included.

:meth:`Homeserver.stop` stops the server (SIGTERM, then SIGKILL after a bound) and removes its
directory; it also runs at interpreter exit.  Should the process that started it die without
stopping it (SIGKILL, or a SIGTERM it does not handle), Linux sends the server SIGTERM; its
directory is then removed by the next :func:`start_homeserver` on the machine.

A :class:`Homeserver` also acts as a plain synchronous Matrix client (stdlib HTTP, no event loop)
where that is simpler than a client library: :meth:`Homeserver.create_room`,
:meth:`Homeserver.join`, :meth:`Homeserver.send_text`, :meth:`Homeserver.messages` and the general
:meth:`Homeserver.request`; a refusal raises :class:`MatrixRequestError`.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import hashlib
import hmac
import importlib.util
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = [
    "Homeserver",
    "HomeserverUnavailable",
    "MatrixAccount",
    "MatrixRequestError",
    "start_homeserver",
]

SERVER_NAME = "localhost"
"""The homeserver's name: user ids read ``@name:localhost``."""
_START_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 10.0
_REQUEST_TIMEOUT_S = 30.0
_DIR_PREFIX = "statecore-matrix-"
_OWNER_FILE = "owner.pid"
_SERVER_FILE = "server.pid"
_LOG_FILE = "homeserver.log"
_LISTENING = re.compile(r"Synapse now listening on TCP port (\d+)")
_BIND_FAILED = ("Address already in use", "Failed to listen on TCP port")
_RELAXED = {"per_second": 1000, "burst_count": 1000}
_PR_SET_PDEATHSIG = 1
# Direct connections only: a proxy named in the environment must not see loopback requests.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class HomeserverUnavailable(RuntimeError):
    """No homeserver could be started, restarted or reached; the message says why (with the
    server log's tail when there is one)."""


class MatrixRequestError(RuntimeError):
    """The homeserver answered a request with a non-2xx status.

    ``status`` is the HTTP status, ``errcode`` and ``error`` the Matrix error's fields (empty
    when the body had none) and ``retry_after_ms`` the wait a 429 asks for (``None`` otherwise).
    """

    def __init__(
        self, status: int, errcode: str, error: str, retry_after_ms: int | None = None
    ) -> None:
        super().__init__(f"HTTP {status} {errcode or '(no errcode)'}: {error}")
        self.status = status
        self.errcode = errcode
        self.error = error
        self.retry_after_ms = retry_after_ms


@dataclass(frozen=True, slots=True)
class MatrixAccount:
    """A user on the homeserver and one logged-in device of theirs.

    ``homeserver`` is the server's URL when the account was made (a restart keeps it unless its
    port was taken meanwhile; :attr:`Homeserver.url` is always current).
    """

    user_id: str
    password: str = field(repr=False)
    access_token: str = field(repr=False)
    device_id: str
    homeserver: str

    @property
    def localpart(self) -> str:
        """The user id's name part (``alice`` of ``@alice:localhost``)."""
        return self.user_id[1:].split(":", 1)[0]


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # Linux: the state follows the parenthesised command name
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _sweep_stale() -> None:
    """Remove the directories of earlier homeservers whose starter and server are both gone."""
    for root in Path(tempfile.gettempdir()).glob(_DIR_PREFIX + "*"):
        try:
            if not root.is_dir() or root.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        owner, server = _read_pid(root / _OWNER_FILE), _read_pid(root / _SERVER_FILE)
        if owner is None or _alive(owner) or (server is not None and _alive(server)):
            continue
        shutil.rmtree(root, ignore_errors=True)


def _dying_with(parent: int) -> Callable[[], None] | None:
    """What the child runs before Synapse (on Linux): be sent SIGTERM when the thread that
    started it ends, and end at once if ``parent`` is already gone.  The C library is loaded
    here, in the parent: between fork and exec the child only calls into it."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def die_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(1)

    return die_with_parent


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _config(
    root: Path, port: int, secret: str, rate_limited: bool, overrides: Mapping[str, Any]
) -> dict[str, Any]:
    limits: dict[str, Any] = {
        "rc_message": _RELAXED,
        "rc_registration": _RELAXED,
        "rc_room_creation": _RELAXED,
        "rc_login": {"address": _RELAXED, "account": _RELAXED, "failed_attempts": _RELAXED},
        "rc_joins": {"local": _RELAXED, "remote": _RELAXED},
        "rc_joins_per_room": _RELAXED,
        "rc_invites": {"per_room": _RELAXED, "per_user": _RELAXED, "per_issuer": _RELAXED},
        "rc_presence": {"per_user": _RELAXED},
        "rc_delayed_event_mgmt": _RELAXED,
    }
    if rate_limited:
        del limits["rc_message"]
    listener = {
        "port": port,
        "bind_addresses": ["127.0.0.1"],
        "type": "http",
        "tls": False,
        "x_forwarded": False,
        "resources": [{"names": ["client"], "compress": False}],
    }
    config: dict[str, Any] = {
        "server_name": SERVER_NAME,
        "listeners": [listener],
        "database": {"name": "sqlite3", "args": {"database": str(root / "homeserver.db")}},
        "media_store_path": str(root / "media"),
        "signing_key_path": str(root / "signing.key"),
        "log_config": str(root / "log_config.json"),
        "registration_shared_secret": secret,
        "macaroon_secret_key": secrets.token_hex(32),
        "form_secret": secrets.token_hex(32),
        "report_stats": False,
        "trusted_key_servers": [],
        "suppress_key_server_warning": True,
        "federation_domain_whitelist": [],
        "presence": {"enabled": False},
        "bcrypt_rounds": 4,
        "enable_registration": False,
        **limits,
    }
    config.update(overrides)
    return config


def _log_config(log: Path) -> dict[str, Any]:
    return {
        "version": 1,
        "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
        "handlers": {
            "file": {"class": "logging.FileHandler", "filename": str(log), "formatter": "plain"}
        },
        "root": {"level": "INFO", "handlers": ["file"]},
        "disable_existing_loggers": False,
    }


def _listening_port(log_path: Path, offset: int) -> int:
    """The port Synapse wrote it listens on, after ``offset`` in its log (0 until then)."""
    try:
        with open(log_path, "rb") as log:
            log.seek(offset)
            text = log.read().decode(errors="replace")
    except OSError:
        return 0
    match = _LISTENING.search(text)
    return int(match.group(1)) if match else 0


def _answers(url: str) -> bool:
    try:
        with _OPENER.open(f"{url}/_matrix/client/versions", timeout=2) as response:
            return int(response.status) == 200
    except (OSError, ValueError):
        return False


def _account(answer: Mapping[str, Any], password: str, url: str) -> MatrixAccount:
    return MatrixAccount(
        user_id=str(answer["user_id"]),
        password=password,
        access_token=str(answer["access_token"]),
        device_id=str(answer["device_id"]),
        homeserver=url,
    )


class Homeserver:
    """A running throwaway Synapse: its URL, how to make users, how to act as a plain client,
    and how to restart and stop it.  Made by :func:`start_homeserver`."""

    def __init__(self, root: Path, config: dict[str, Any], secret: str) -> None:
        self.data_dir = root
        """The server's directory (configuration, database, media, log); removed by stop."""
        self.server_name = SERVER_NAME
        self.url = ""
        """``http://127.0.0.1:PORT``; set once the server answers."""
        self.port = 0
        self._config = config
        self._secret = secret
        self._process: subprocess.Popen[bytes] | None = None
        self._stopped = False

    # -- the process ---------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The server process's id while it runs, else ``None``."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def log_path(self) -> Path:
        """The server's log (Synapse's own log and its standard output and error)."""
        return self.data_dir / _LOG_FILE

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the server's log (``"(no log)"`` when it has none)."""
        return _tail(self.log_path, lines)

    def _launch(self, port: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with contextlib.suppress(LookupError, TypeError):  # overridden listeners: theirs
            self._config["listeners"][0]["port"] = port
        config_path = self.data_dir / "homeserver.json"
        config_path.write_text(json.dumps(self._config, indent=2))
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "synapse.app.homeserver", "-c", str(config_path)],
                cwd=self.data_dir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,  # a Ctrl-C of the test run reaches it only via stop()
                # Only a prctl and a getppid run between fork and exec (see _dying_with).
                preexec_fn=_dying_with(os.getpid()),  # noqa: PLW1509
            )
        self._process = process
        (self.data_dir / _SERVER_FILE).write_text(str(process.pid))
        found = 0
        while time.monotonic() < deadline and process.poll() is None:
            found = found or _listening_port(self.log_path, offset)
            if found and _answers(f"http://127.0.0.1:{found}"):
                self.port, self.url = found, f"http://127.0.0.1:{found}"
                return
            time.sleep(0.05)
        if process.poll() is None:
            self._terminate()
            raise HomeserverUnavailable(
                f"Synapse did not answer within {timeout_s:g} s; log:\n{self.log_tail()}"
            )
        raise HomeserverUnavailable(
            f"Synapse exited at start (status {process.returncode}); log:\n{self.log_tail()}"
        )

    def _terminate(self) -> None:
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(_STOP_TIMEOUT_S)
        self._process = None

    def stop(self) -> None:
        """Stop the server (SIGTERM, SIGKILL after a bound) and remove its directory.

        Idempotent; after it the server cannot be restarted.  Raises nothing.
        """
        self._stopped = True
        atexit.unregister(self.stop)
        self._terminate()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def restart(self, *, timeout_s: float = _START_TIMEOUT_S) -> None:
        """Stop the server and start it again on the same directory (database, users, devices
        and transaction ids kept) and, when it is still free, the same port (otherwise a new
        one: :attr:`url` changes).  Returns once it answers again.

        Call it from a thread that outlives the server (see :func:`start_homeserver`).  Raises
        :class:`HomeserverUnavailable` when the server was stopped or does not come back within
        ``timeout_s`` (the caller should then :meth:`stop` it).
        """
        if self._stopped:
            raise HomeserverUnavailable("the homeserver was stopped; start a new one")
        self._terminate()
        try:
            self._launch(self.port, timeout_s)
        except HomeserverUnavailable:
            if not any(marker in self.log_tail(60) for marker in _BIND_FAILED):
                raise
            self._launch(0, timeout_s)  # the port was taken meanwhile: take another

    def __enter__(self) -> Homeserver:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # -- a plain client ------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        account: MatrixAccount | None = None,
        body: Mapping[str, Any] | None = None,
        query: Mapping[str, str] | None = None,
        timeout_s: float = _REQUEST_TIMEOUT_S,
    ) -> dict[str, Any]:
        """Send one request to the server (``path`` such as ``/_matrix/client/v3/sync``, already
        quoted; as ``account`` when given) and return its JSON body.

        Raises :class:`MatrixRequestError` on a non-2xx answer and :class:`HomeserverUnavailable`
        when the server cannot be reached or does not answer within ``timeout_s``.
        """
        url = self.url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if account is not None:
            headers["Authorization"] = f"Bearer {account.access_token}"
        req = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with _OPENER.open(req, timeout=timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise _refusal(exc) from None
        except (OSError, ValueError) as exc:
            raise HomeserverUnavailable(
                f"{method} {path}: no answer from {self.url} ({exc}); log:\n{self.log_tail()}"
            ) from None
        answer = json.loads(raw) if raw else {}
        return answer if isinstance(answer, dict) else {"value": answer}

    def register(
        self, username: str, password: str | None = None, *, admin: bool = False
    ) -> MatrixAccount:
        """Make the user ``@username:localhost`` (a random password when ``None``) through the
        admin registration API, logged in on a new device; return the account.

        Raises :class:`MatrixRequestError` (``M_USER_IN_USE`` for a taken name,
        ``M_INVALID_USERNAME``) and :class:`HomeserverUnavailable`.
        """
        password = secrets.token_urlsafe(16) if password is None else password
        path = "/_synapse/admin/v1/register"
        nonce = str(self.request("GET", path)["nonce"])
        message = "\0".join([nonce, username, password, "admin" if admin else "notadmin"])
        mac = hmac.new(self._secret.encode(), message.encode(), hashlib.sha1).hexdigest()
        body = {"nonce": nonce, "username": username, "password": password}
        answer = self.request("POST", path, body={**body, "admin": admin, "mac": mac})
        return _account(answer, password, self.url)

    def login(self, user: str, password: str, *, device_id: str | None = None) -> MatrixAccount:
        """Log ``user`` (a user id or its name part) in with ``password``, on ``device_id`` (a
        new device when ``None``); return the account with its new access token.

        Raises :class:`MatrixRequestError` (``M_FORBIDDEN`` for a wrong password) and
        :class:`HomeserverUnavailable`.
        """
        body: dict[str, Any] = {
            "type": "m.login.password",
            "identifier": {"type": "m.id.user", "user": user},
            "password": password,
        }
        if device_id is not None:
            body["device_id"] = device_id
        answer = self.request("POST", "/_matrix/client/v3/login", body=body)
        return _account(answer, password, self.url)

    def create_room(
        self,
        account: MatrixAccount,
        *,
        invite: Iterable[str] = (),
        name: str | None = None,
        is_direct: bool = False,
    ) -> str:
        """Create a private room as ``account``, inviting the user ids ``invite``; return its
        room id.  The invited must :meth:`join` before they can read it.

        Raises :class:`MatrixRequestError` and :class:`HomeserverUnavailable`.
        """
        body: dict[str, Any] = {
            "preset": "trusted_private_chat" if is_direct else "private_chat",
            "invite": list(invite),
            "is_direct": is_direct,
        }
        if name is not None:
            body["name"] = name
        answer = self.request("POST", "/_matrix/client/v3/createRoom", account=account, body=body)
        return str(answer["room_id"])

    def invite(self, account: MatrixAccount, room_id: str, user_id: str) -> None:
        """Invite ``user_id`` into ``room_id`` as ``account`` (a member allowed to invite).

        Raises :class:`MatrixRequestError` and :class:`HomeserverUnavailable`.
        """
        path = f"/_matrix/client/v3/rooms/{_quote(room_id)}/invite"
        self.request("POST", path, account=account, body={"user_id": user_id})

    def join(self, account: MatrixAccount, room_id: str) -> None:
        """Join ``room_id`` as ``account`` (invited, or the room is public).

        Raises :class:`MatrixRequestError` (``M_FORBIDDEN`` when not invited) and
        :class:`HomeserverUnavailable`.
        """
        self.request("POST", f"/_matrix/client/v3/join/{_quote(room_id)}", account=account, body={})

    def send_text(
        self, account: MatrixAccount, room_id: str, body: str, *, txn_id: str | None = None
    ) -> str:
        """Send the text ``body`` into ``room_id`` as ``account`` under the transaction id
        ``txn_id`` (a new one when ``None``; the same id from the same device is one event);
        return the event id.

        Raises :class:`MatrixRequestError` (``M_LIMIT_EXCEEDED`` with ``retry_after_ms`` when
        throttled) and :class:`HomeserverUnavailable`.
        """
        txn = secrets.token_hex(8) if txn_id is None else txn_id
        path = f"/_matrix/client/v3/rooms/{_quote(room_id)}/send/m.room.message/{_quote(txn)}"
        content = {"msgtype": "m.text", "body": body}
        return str(self.request("PUT", path, account=account, body=content)["event_id"])

    def messages(
        self,
        account: MatrixAccount,
        room_id: str,
        *,
        event_type: str | None = None,
        page_size: int = 100,
    ) -> list[dict[str, Any]]:
        """Read ``room_id``'s timeline back as ``account`` (a member), oldest first, following
        every page of ``page_size`` events; only the events of ``event_type`` (such as
        ``"m.room.message"``) when given.

        Raises :class:`MatrixRequestError` (``M_FORBIDDEN`` for a non-member) and
        :class:`HomeserverUnavailable`.
        """
        path = f"/_matrix/client/v3/rooms/{_quote(room_id)}/messages"
        events: list[dict[str, Any]] = []
        query = {"dir": "f", "limit": str(page_size)}
        while True:
            page = self.request("GET", path, account=account, query=query)
            chunk = page.get("chunk") or []
            events.extend(e for e in chunk if event_type is None or e.get("type") == event_type)
            end = page.get("end")
            if not chunk or not end or end == query.get("from"):
                return events
            query = {**query, "from": str(end)}


def _quote(part: str) -> str:
    return urllib.parse.quote(part, safe="")


def _refusal(exc: urllib.error.HTTPError) -> MatrixRequestError:
    try:
        body = json.loads(exc.read() or b"{}")
    except (OSError, ValueError):
        body = {}
    if not isinstance(body, dict):
        body = {}
    retry = body.get("retry_after_ms")
    if retry is None and exc.headers.get("Retry-After", "").isdigit():
        retry = int(exc.headers["Retry-After"]) * 1000
    return MatrixRequestError(
        exc.code,
        str(body.get("errcode", "")),
        str(body.get("error", exc.reason)),
        int(retry) if retry is not None else None,
    )


def start_homeserver(
    *,
    timeout_s: float = _START_TIMEOUT_S,
    rate_limited: bool = False,
    config_overrides: Mapping[str, Any] | None = None,
) -> Homeserver:
    """Start a throwaway Synapse in a new temporary directory; return it once
    ``GET /_matrix/client/versions`` answers (a few seconds).

    ``rate_limited`` keeps Synapse's default message rate limit (every other limit stays
    relaxed); ``config_overrides`` replaces top-level keys of the generated configuration.  The
    caller must :meth:`Homeserver.stop` it (or use it as a context manager); interpreter exit
    stops it too.  Start it from a thread that outlives it (the main thread, in a test session):
    Linux sends the server SIGTERM when the thread that started it ends, so that it never
    outlives a killed parent.  Raises :class:`HomeserverUnavailable` (naming the cause and the
    log's tail) when Synapse is not installed, exits at start or does not answer within
    ``timeout_s``.
    """
    if importlib.util.find_spec("synapse") is None:
        raise HomeserverUnavailable(
            "Synapse is not installed; install it with pip install 'statecore[matrix-testing]'"
        )
    _sweep_stale()
    root = Path(tempfile.mkdtemp(prefix=_DIR_PREFIX))
    secret = secrets.token_hex(32)
    server = Homeserver(
        root, _config(root, 0, secret, rate_limited, config_overrides or {}), secret
    )
    try:
        (root / _OWNER_FILE).write_text(str(os.getpid()))
        (root / "log_config.json").write_text(json.dumps(_log_config(root / _LOG_FILE)))
        atexit.register(server.stop)
        server._launch(0, timeout_s)
    except BaseException:
        server.stop()
        raise
    return server
