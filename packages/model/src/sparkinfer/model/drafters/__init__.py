"""Block drafters of the DFlash family (DFlash, DFlash2, DSpark) for speculative decoding."""
