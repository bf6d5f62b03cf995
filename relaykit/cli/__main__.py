"""``python -m relaykit.cli``: the ``relaykit`` command."""

from relaykit.cli import main

main()
