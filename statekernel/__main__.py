"""``python -m statekernel``: the ``statekernel`` command."""

from statekernel._cli.main import main

if __name__ == "__main__":
    main()
