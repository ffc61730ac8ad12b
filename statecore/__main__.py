"""``python -m statecore``: the ``statecore`` command line."""

from statecore.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
