"""Reading and judging a manifest: source with lines, pydantic model, rules, catalog,
secrets, project check. No I/O beyond reading the manifest's own files.
"""
