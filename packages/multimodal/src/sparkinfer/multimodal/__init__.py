"""Media decoding for SparkInfer: data URLs, images (Pillow), video (PyAV)."""
