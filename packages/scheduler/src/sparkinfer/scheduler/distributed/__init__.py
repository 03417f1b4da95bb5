"""Tensor parallel serving: rank 0 runs the engine, every other rank mirrors its forwards.

`launch.py` starts the ranks, `watchdog.py` watches them, `channel.py` carries rank 0's messages,
`step_plan.py` encodes a forward's inputs as one message, `mirror.py` is rank 0's side (the model
and runner that send each step before running it) and `worker.py` the other ranks' loop.
"""
