"""The store contract kit: the behaviour every :class:`~statecore.store.Store` must show.

:class:`StoreContract` is a pytest base class holding the whole contract as test methods.  A
store implementation passes the contract by subclassing it and providing a ``store`` fixture
that is a *factory*: a callable returning a fresh, empty, unregistered store on every call.  The
kit registers its own entity kinds (:data:`TICKET_KIND`, ``OBLIGATION_KIND``) and closes every
store it opened when the test ends; a test may open several stores::

    import itertools
    from pathlib import Path

    import pytest

    from stores.testing import StoreContract, StoreFactory
    from mystore import MyStore

    class TestMyStore(StoreContract):
        @pytest.fixture
        def store(self, tmp_path: Path) -> StoreFactory:
            paths = (tmp_path / f"store-{n}.db" for n in itertools.count())
            return lambda: MyStore(next(paths))

The class has no ``Test`` prefix, so pytest collects it only through such subclasses.  Inside
the kit, ``new_store`` is the kit-owned wrapper of the user's factory and ``db`` one fresh
store with the kit's kinds registered.  The tests use no sleeps: time comes from
:class:`~statecore.FakeClock`, and the thread race is bounded by join timeouts.

The contract is split into one class per section (``stores.testing.insert``,
``stores.testing.transition``, ...); a store may run one section alone by subclassing it.
The timer section (``stores.testing.timers``) tests the optional ``due_timers`` and
``catalog`` and is skipped for a store without them.

:func:`lifecycle_tests` (``stores.testing.lifecycle``) builds, from any entity kind, the same
kind of base class testing every transition its lifecycle declares against a store.

This package imports pytest and no pytest plugin (no pytest-asyncio, no hypothesis): it is
test-support code, installed with the package and usable once pytest is installed (the
``statecore[testing]`` extra).  Keep every section synchronous and plugin-free, so that a
project running the kit gets no plugin and no warnings from it.  For pytest's detailed
assertion messages from the kit's own asserts, call
``pytest.register_assert_rewrite("stores.testing")`` (in a ``conftest.py``, or before the
first import of this package).
"""

from __future__ import annotations

from stores.testing._kit import TICKET, TICKET_KIND, StoreFactory, StoreOpener, TicketState
from stores.testing.atomic import AtomicContract
from stores.testing.audit import AuditContract
from stores.testing.batches import BatchContract
from stores.testing.bulk import BulkTransitionContract
from stores.testing.insert import InsertContract
from stores.testing.isolation import IsolationContract
from stores.testing.lifecycle import lifecycle_tests
from stores.testing.obligations import ObligationContract
from stores.testing.overrides import OverrideContract
from stores.testing.prune import PruneContract
from stores.testing.races import RaceContract
from stores.testing.registration import RegistrationContract
from stores.testing.select import SelectContract
from stores.testing.timers import TimerContract
from stores.testing.transition import TransitionContract

__all__ = [
    "TICKET",
    "TICKET_KIND",
    "StoreContract",
    "StoreFactory",
    "StoreOpener",
    "TicketState",
    "TimerContract",
    "lifecycle_tests",
]


class StoreContract(
    RegistrationContract,
    InsertContract,
    TransitionContract,
    BulkTransitionContract,
    BatchContract,
    OverrideContract,
    RaceContract,
    AuditContract,
    SelectContract,
    PruneContract,
    AtomicContract,
    IsolationContract,
    ObligationContract,
    TimerContract,
):
    """The Store contract as pytest tests; subclass it and provide a ``store`` factory fixture.

    Each section of the contract is a class of its own (``stores.testing.<section>``); this
    class runs them all.  See the package docstring for an example.
    """
