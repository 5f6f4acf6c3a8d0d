"""``python -m eroica.cli``: the ``eroica`` command."""

from eroica.cli.main import main

main()
