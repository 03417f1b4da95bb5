"""CUDA graphs of the runner's forwards. The scaffold: `buckets.py` (bucket sizes, one graph per
bucket, the staging guard, the replay), `capture.py` (the capture loop), `decode_rows.py` (the
static buffers of graphs whose every row is a decode row). The families, each supplying only its
rows and forward: `decode.py`, `verify.py`, `head.py` (the MTP head) and `prefill.py`.
"""
