"""CUDA graphs of the runner's forwards: `capture.py` (the capture loop every family shares),
`decode_rows.py` (static buffers of graphs whose every row is a decode row), `decode.py`,
`verify.py`, `head.py` (the MTP head) and `prefill.py` (one family each: its rows and forward).
"""
