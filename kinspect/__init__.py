"""kinspect: a Kafka protocol inspector that runs as a sidecar proxy."""

__version__ = "0.1.0"
