"""Kafka's message definitions: the spec model, the registry of layers, the importer, the api-key table."""
