"""Tensor parallelism of the model service: sharding, collectives, the rank processes."""
