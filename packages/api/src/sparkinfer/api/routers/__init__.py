"""HTTP routes, one module per endpoint group."""
