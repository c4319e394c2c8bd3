"""Wire primitives: varints, compact and fixed-width reads, single-fact peeks into a frame."""
