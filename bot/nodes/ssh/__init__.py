"""The ``ssh`` node kind: a rented node reached over SSH (asyncssh, imported here only).

``dispatcher.py`` (a ``NodeDispatcher`` over ``adapter.py``'s ``SSHAdapter``, with its
own start and fetch over the sessions), ``session.py`` (connections, host keys, answered
vs unreachable), ``transfer.py`` (a copy's stall limit and ceiling),
``answers.py`` (what a launcher answers, checked), ``archive.py`` (the upload's one tar
stream), ``node.py`` (the launcher's protocol on one node), ``fetch.py`` (the run's
results brought back).
This module imports nothing, so the SSH-only parts of ``bot/dispatch/`` can name the kind.
"""

KIND = "ssh"
