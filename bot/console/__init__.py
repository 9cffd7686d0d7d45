"""The terminal transport: rich rendering of the neutral messages, live status."""
