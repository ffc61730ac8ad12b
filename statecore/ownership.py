"""Ownership: which process incarnation owns a row, and whether that owner is still alive.

An owner is a process *incarnation*: host, pid, process start time and a random token.  The
token (128 random bits) alone says which incarnation owns a row; the host
(:func:`host_identity`: machine, boot and pid namespace) says how its liveness can be known.  An
owner on *another* host cannot be probed: it is alive while its lease lasts (renewed by its
heartbeat, :mod:`statecore.leases`).  On the same host an owner is **dead** when

* its pid is gone, or
* the pid now belongs to a process with a different start time (pids are reused; containers
  run every gateway as pid 1), or
* the probe itself raised (a probe we cannot trust proves nothing, and a dead verdict only lets
  a sweep *consider* the row -- every claim is still one guarded write).

When the start time cannot be read (for the probed pid now, or it was never recorded), the
answer is whether the pid exists.  Liveness is always asked through a :class:`ProcessProbe`;
statecore never sends a signal to probe a pid (on Windows signal 0 is a console Ctrl+C).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import uuid
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import attrs
import psutil

__all__ = [
    "Incarnation",
    "LivenessCache",
    "ProcessProbe",
    "PsutilProbe",
    "host_identity",
    "owner_alive",
    "recorded_owner_alive",
]

log = logging.getLogger(__name__)


@runtime_checkable
class ProcessProbe(Protocol):
    """The seam through which liveness is asked.  Implementations may raise; callers treat a
    raising probe as 'dead'."""

    def pid_exists(self, pid: int) -> bool:
        """True when a process with ``pid`` exists and can still run (not a zombie)."""
        ...

    def start_time(self, pid: int) -> int | None:
        """An integer identifying when the process started on this host (same process, same
        value; a reused pid, a different one), or None when it cannot be read."""
        ...


class PsutilProbe:
    """The default probe.  Never sends a signal.

    The start time is an opaque integer identifying when the process started *on this host*:
    on Linux the kernel's start time in clock ticks since boot, read from ``/proc/<pid>/stat``
    (one small file read, and immune to wall-clock steps that would shift an epoch-based start
    time and make a live owner look dead); elsewhere psutil's creation time in milliseconds.
    A zombie (exited, not yet reaped) counts as gone: it can never write again.
    """

    __slots__ = ()

    def pid_exists(self, pid: int) -> bool:
        """True when ``pid`` names a live, non-zombie process."""
        if not _valid_pid(pid):
            return False
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
        except psutil.AccessDenied:
            # Exists, but belongs to someone we may not inspect.
            return True

    def start_time(self, pid: int) -> int | None:
        """The process's start time (see the class docs); None if gone, a zombie or unreadable."""
        if not _valid_pid(pid):
            return None
        if _PROC_STAT:
            try:
                with open(f"/proc/{pid}/stat", "rb") as fh:
                    stat = fh.read()
            except OSError:
                return None
            # The command name may hold spaces and parentheses: fields resume after the last ')'.
            fields = stat[stat.rfind(b")") + 2 :].split()
            try:
                if fields[0] in (b"Z", b"X"):
                    return None
                return int(fields[19])  # field 22 of proc(5): starttime, in ticks since boot
            except (IndexError, ValueError):
                return None
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                if proc.status() == psutil.STATUS_ZOMBIE:
                    return None
                return round(proc.create_time() * 1000)
        except (psutil.Error, OSError, ValueError):
            return None

    def __repr__(self) -> str:
        return "PsutilProbe()"


_PROC_STAT = os.path.exists(f"/proc/{os.getpid()}/stat")


def owner_alive(pid: int | None, started_at: int | None, probe: ProcessProbe) -> bool:
    """Apply the liveness rule to a recorded (pid, start time) on this host.

    Returns False for no pid, a gone pid, a reused pid (start time differs) or a probe that
    raised; when either start time is unknown, the probe's ``pid_exists`` answer.  Never raises.
    """
    if pid is None or not _valid_pid(pid):
        return False
    try:
        current = probe.start_time(pid)
        if current is None or started_at is None:
            return bool(probe.pid_exists(pid))
        return current == started_at
    except Exception:  # a probe that raises proves nothing about a live owner
        log.warning("liveness probe raised for pid %s; treating the owner as dead", pid)
        return False


class LivenessCache:
    """Answers :func:`owner_alive` once per distinct owner for the life of one sweep.

    A sweep over many rows of few owners probes each owner once.  Create a new cache per sweep:
    answers are not refreshed.
    """

    __slots__ = ("_answers", "_probe", "probes")

    def __init__(self, probe: ProcessProbe) -> None:
        self._probe = probe
        self._answers: dict[tuple[int | None, int | None], bool] = {}
        self.probes = 0
        """How many owners were actually probed."""

    def alive(self, pid: int | None, started_at: int | None) -> bool:
        """:func:`owner_alive` for this owner, probed at most once per cache."""
        if not _valid_pid(pid):
            return False  # nothing to probe: no (or an invalid) pid is never alive
        key = (pid, started_at)
        answer = self._answers.get(key)
        if answer is None:
            self.probes += 1
            answer = self._answers[key] = owner_alive(pid, started_at, self._probe)
        return answer


def host_identity() -> str:
    """This host as an owner is recorded: the scope inside which a pid can be probed.

    ``<hostname>/m-<machine>/boot-<boot>/pidns-<namespace>``, each part present where the
    system tells it:

    * the machine: ``/etc/machine-id`` (or D-Bus's copy), else the hardware address
      ``uuid.getnode()`` finds (never a random one);
    * the boot: the kernel's boot id (random per boot), else the boot time psutil reports.
      Start times are boot-relative, so after a reboot a pid and start time could repeat; the
      boot part makes the previous boot's owners "another host", whose only proof of death is
      an expired lease -- never mistaken for a live local process;
    * the pid namespace (Linux): containers on one machine share its boot id (and often an
      image's machine id and a hostname), but each sees its own pids -- pid 1 in one is not pid
      1 in another -- so two processes that cannot probe each other never share a host.

    Parts that cannot be read are left out.  The host part only decides *how* an owner is
    judged (probed here, or by its lease elsewhere); which incarnation owns a row is decided by
    the owner token, 128 random bits per process incarnation (:class:`Incarnation`).  The
    identity errs on the safe side: two processes that could probe each other but read
    different parts (psutil's boot time on Windows may differ by a second between processes)
    judge each other by lease, later but never wrongly.
    """
    parts = [socket.gethostname() or "localhost"]
    machine = _machine_id()
    if machine:
        parts.append(f"m-{machine}")
    boot = _boot_id()
    if boot:
        parts.append(f"boot-{boot}")
    namespace = _pid_namespace()
    if namespace:
        parts.append(f"pidns-{namespace}")
    return "/".join(parts)


def _first_line(path: str) -> str:
    """The stripped first line of a small text file, or "" when it cannot be read."""
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.readline().strip()
    except OSError:
        return ""


def _machine_id() -> str:
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        found = "".join(ch for ch in _first_line(path).lower() if ch in "0123456789abcdef")
        if found:
            return found[:16]
    node = uuid.getnode()
    # uuid.getnode() sets the multicast bit on a random number when no address was found: a
    # random per-process value would make every process "another host" (safe, but no probing).
    if node >> 40 & 1:
        return ""
    return f"{node:012x}"


def _boot_id() -> str:
    boot = _first_line("/proc/sys/kernel/random/boot_id").replace("-", "")[:16]
    if boot:
        return boot
    try:
        return f"t{int(psutil.boot_time())}"
    except (psutil.Error, OSError, ValueError):
        return ""


def _pid_namespace() -> str:
    try:
        link = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except (OSError, AttributeError, NotImplementedError):
        return ""
    return "".join(ch for ch in link if ch.isdigit())


def recorded_owner_alive(
    owner: Mapping[str, Any], me: Incarnation, liveness: LivenessCache, now: float
) -> bool:
    """Whether the owner recorded in a row's ``owner_*`` / ``lease_expires_at`` columns lives.

    This incarnation is alive by definition, whatever a probe says; an owner on another host
    cannot be probed, so only an expired lease proves it dead; on this host the liveness rule
    applies (each owner probed once per ``liveness`` cache).
    """
    if owner["owner_token"] == me.token:
        return True
    host = owner["owner_host"]
    if host is not None and host != me.host:
        lease = owner["lease_expires_at"]
        return lease is None or lease > now
    return liveness.alive(owner["owner_pid"], owner["owner_started_at"])


def _valid_pid(pid: object) -> bool:
    # bool is an int; pid 0 is the kernel's and psutil reports it as existing.
    return isinstance(pid, int) and not isinstance(pid, bool) and pid > 0


def _check_pid(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not _valid_pid(value):
        raise ValueError(f"{attribute.name} must be a positive int, not {value!r}")


def _check_started_at(_: object, attribute: attrs.Attribute[int | None], value: object) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise TypeError(f"{attribute.name} must be an int or None, not {value!r}")


def _check_text(_: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{attribute.name} must be a non-empty string, not {value!r}")


@attrs.frozen
class Incarnation:
    """One run of one process: the identity a row's owner is recorded with.

    ``host`` is :func:`host_identity` (where the pid can be probed), ``token`` 128 random bits
    drawn when the incarnation is built: two processes with the same pid -- on two hosts, in
    two containers, or one after the other -- never share a token, and the ledger guards every
    owner's write by the token alone.  ``started_at`` is None when this process could not read
    its own start time; such an incarnation *fails closed*: :meth:`is_self` is never true for
    it, so nothing that needs proof of identity (the runtime retry sweep) acts on its behalf.
    """

    host: str = attrs.field(validator=_check_text)
    pid: int = attrs.field(validator=_check_pid)
    started_at: int | None = attrs.field(validator=_check_started_at)
    token: str = attrs.field(validator=_check_text)

    @classmethod
    def current(cls, probe: ProcessProbe | None = None) -> Incarnation:
        """This process's incarnation: stable within the process, new after a fork.

        With a custom ``probe`` a fresh incarnation (new token) is built every call.
        """
        pid = os.getpid()
        if probe is not None:
            return cls._build(pid, probe)
        cache = _current
        with cache.lock:
            # Keyed by pid as well: a forked child is a new process with its own incarnation.
            found = cache.by_pid.get(pid)
            if found is None:
                found = cache.by_pid[pid] = cls._build(pid, PsutilProbe())
            return found

    @classmethod
    def _build(cls, pid: int, probe: ProcessProbe) -> Incarnation:
        try:
            started = probe.start_time(pid)
        except Exception:
            started = None
        # 128 random bits: two processes (on any hosts) never share an owner token.
        return cls(host_identity(), pid, started, secrets.token_hex(16))

    @property
    def label(self) -> str:
        """``host:pid:token``: how audit entries name this incarnation as the actor."""
        return f"{self.host}:{self.pid}:{self.token}"

    def is_self(self, pid: int | None, started_at: int | None) -> bool:
        """True when a recorded (pid, start time) is provably this incarnation's process.

        Fails closed: an unknown start time on either side is never proof.
        """
        return (
            self.started_at is not None
            and started_at is not None
            and pid == self.pid
            and started_at == self.started_at
        )


class _CurrentCache:
    """This process's incarnation, per pid, and the lock guarding it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_pid: dict[int, Incarnation] = {}

    def reset(self) -> None:
        """After a fork: a forked child is a new process and must not inherit its parent's
        incarnations (a pid reused by a descendant would otherwise take an ancestor's
        identity) nor a lock another thread held at the fork."""
        self.lock = threading.Lock()
        self.by_pid = {}


_current = _CurrentCache()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_current.reset)
