"""The node kinds, as plug-ins (``registry.py``: a kind's name → its adapter).

A kind is one module (``local.py``) or package (``ssh/``) here plus one line of
``registry.KINDS``. This package is the only code that names a kind (with the manifest's
node models, ``bot/manifest/nodes.py``) and the only one that starts processes or SSH
sessions (``ssh/`` alone imports asyncssh); ``tests/test_boundaries.py`` checks both.
"""
