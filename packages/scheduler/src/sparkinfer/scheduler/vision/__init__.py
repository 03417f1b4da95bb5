"""The runner's media rows: `inputs.py` (tower rows per request, merged per chunk), `cache.py`
(tower rows kept by content hash) and `graphs.py` (the tower under CUDA graphs)."""
