"""Input workers: run input_fn, take their shard of batches, stream them to the CS."""
