"""Kafka framing: size-prefixed frames, their limits and errors, and the stream framer the pipeline uses."""
