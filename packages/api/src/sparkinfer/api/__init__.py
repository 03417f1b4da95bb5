"""The SparkInfer OpenAI-compatible HTTP server."""
