"""Sessions and delegations for asyncio code: ``sessions.aio`` and ``delegations.aio`` offer every
public method as a coroutine function that runs the synchronous one on a worker thread, with
the same results and errors."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from statecore.errors import InvalidTransition, UnknownEntity
from statecore.gateway import Delegations, RoutingOrigin, SessionStore
from statecore.gateway.aio import off_loop
from statecore.gateway.delegations import DelegationState
from stores.memory import InMemoryStore
from tests.statecore.gateway.gateway_rig import PROBE


class ThreadNotingStore(InMemoryStore):
    """Notes the thread of every insert and transition."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def insert(self, *args: Any, **kwargs: Any) -> Any:
        """Noted, then the ordinary insert."""
        self.threads.append(threading.current_thread().name)
        return super().insert(*args, **kwargs)

    def transition(self, *args: Any, **kwargs: Any) -> Any:
        """Noted, then the ordinary transition."""
        self.threads.append(threading.current_thread().name)
        return super().transition(*args, **kwargs)


@pytest.fixture
def store() -> Iterator[ThreadNotingStore]:
    """A store that notes which thread writes."""
    opened = ThreadNotingStore()
    yield opened
    opened.close()


def public_methods(cls: type) -> set[str]:
    """The public instance methods a class defines (static ones are pure: no store work)."""
    return {
        name
        for name, member in vars(cls).items()
        if not name.startswith("_")
        and inspect.isfunction(member)
        and not isinstance(inspect.getattr_static(cls, name), staticmethod)
    }


@pytest.mark.parametrize("cls", [SessionStore, Delegations])
def test_the_facade_offers_every_public_method_as_a_coroutine_function(
    cls: type, store: ThreadNotingStore
) -> None:
    """Nothing of the synchronous API is missing from ``aio``, and each is awaitable."""
    api = cls(store) if cls is SessionStore else cls(store, probe=PROBE)
    methods = public_methods(cls)
    assert methods
    for name in methods:
        facade = getattr(api.aio, name, None)
        assert facade is not None, f"{cls.__name__}.aio.{name} is missing"
        assert inspect.iscoroutinefunction(facade), f"{cls.__name__}.aio.{name} is not async"


@pytest.mark.asyncio
async def test_sessions_aio_runs_off_the_loop_with_the_same_results_and_errors(
    store: ThreadNotingStore,
) -> None:
    """Writes through ``sessions.aio`` happen on a worker thread; what they return is what the
    synchronous methods return, and their refusals are raised as is."""
    sessions = SessionStore(store)
    loop_thread = threading.current_thread().name
    started = await sessions.aio.start("k", platform="loopback", chat_id="c1")
    assert await sessions.aio.current("k") == started == sessions.current("k")
    assert await sessions.aio.get(started.session_id) == started
    flagged = await sessions.aio.set_resume_pending("k", True)
    assert flagged is not None
    assert flagged.resume_pending
    ended = await sessions.aio.end(started.session_id, "idle")
    assert ended.ended
    assert [e.event for e in await sessions.aio.history(started.session_id)] == [
        "start",
        "flag",
        "end",
    ]
    assert store.threads
    assert loop_thread not in store.threads
    with pytest.raises(InvalidTransition):
        await sessions.aio.end(started.session_id, "idle")
    with pytest.raises(UnknownEntity):
        await sessions.aio.end("no-such-session", "idle")
    with pytest.raises(ValueError, match="compress"):
        await sessions.aio.end(started.session_id, "compression")
    assert await sessions.aio.prune(retention=0.0, now=ended.ended_at + 1) == 1


@pytest.mark.asyncio
async def test_delegations_aio_runs_off_the_loop_with_the_same_results_and_errors(
    store: ThreadNotingStore,
) -> None:
    """A delegation dispatched, completed and delivered through ``delegations.aio`` is written
    on a worker thread and reads back as the synchronous API reads it."""
    delegations = Delegations(store, probe=PROBE)
    loop_thread = threading.current_thread().name
    origin = RoutingOrigin(platform="loopback", chat_id="c1", chat_type="dm", session_key="k")
    job = await delegations.aio.dispatch(origin, {"task": "sum"})
    completed = await delegations.aio.complete(job, {"total": 3})
    assert completed.state is DelegationState.COMPLETED
    assert [d.delegation_id for d in await delegations.aio.pending_completions()] == [job]
    delivered = await delegations.aio.mark_delivered(job)
    assert delivered == delegations.get(job) == await delegations.aio.get(job)
    assert loop_thread not in store.threads
    with pytest.raises(InvalidTransition):
        await delegations.aio.mark_delivered(job)
    with pytest.raises(TypeError, match="payload"):
        await delegations.aio.dispatch(origin, ["not", "a", "mapping"])  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_off_loop_keeps_the_wrapped_methods_name_and_runs_it_on_another_thread() -> None:
    """off_loop(f) is awaitable, named after f, and runs f on a worker thread."""
    seen: list[str] = []

    def work(x: int, *, times: int = 2) -> int:
        """Multiply."""
        seen.append(threading.current_thread().name)
        return x * times

    wrapped = off_loop(work)
    assert wrapped.__name__ == "work"
    assert wrapped.__doc__ == "Multiply."
    assert await wrapped(4, times=3) == 12
    assert seen
    assert seen[0] != threading.current_thread().name
