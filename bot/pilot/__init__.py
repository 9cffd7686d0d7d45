"""The pure rules of a pilot: plan and price, spec building, attempts, verdict, decisions,
leases, run states. No store, no dispatch, no transport.
"""
