"""Pydantic request and response bodies, one module per endpoint (plus `common`)."""
