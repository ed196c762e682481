"""The ``callbox`` command line: one module per command group."""
