"""sparkinfer-lab: GPU tuning and profiling tools for development (not part of the product)."""
