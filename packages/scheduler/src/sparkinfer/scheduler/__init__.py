"""The SparkInfer engine: batching, paged KV, recurrent-state slots, CUDA graphs, sampling."""
