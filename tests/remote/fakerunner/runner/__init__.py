"""A tiny stand-in for the real runner (standard library only), used by the SSH tests."""
