"""The daemon process: configuration, wiring, the HTTP API, metrics, boot scripts."""
