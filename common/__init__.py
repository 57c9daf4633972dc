"""The bottom layer: what every package shares (the user-facing error type and its one-line
reporting, the layers themselves)."""
