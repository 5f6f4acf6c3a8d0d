"""The ``eroica`` command, one module per subcommand."""
