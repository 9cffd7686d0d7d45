"""A corpus only the nodes hold (``volume.inputs.on_nodes`` without ``volume.inputs.dir``):
listed on the head node at each dispatch, before any node is prepared.

The bot has no copy to compare the nodes with. So the head (``volume.nodes[0]``, else the
volume's one node) lists ``on_nodes`` with the runner's rule and checksums every file
(``corpus_listing.py``, its interpreter); its listing must hold ``volume.inputs.expected_count``
inputs with distinct ids, the expected refusals among them, or the dispatch is refused
naming the field. The listing is written to the run directory (``LISTING_FILE``, a header then
one row a line): its rows
are what every node's own listing must equal (``UploadPlan.corpus_check``; ``check_on_node``
asks a node through its ``Node``), and its ids are the ones the balance expects (the
service stores them on hearing the ``listed`` step).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from bot.dispatch.base import RunHandle
from bot.dispatch.corpus import (
    check_listing,
    corpus_command,
    corpus_node_only,
    corpus_on_nodes,
    listing_answer,
    listing_cap,
    write_listing,
)
from bot.dispatch.plan import plan_of
from bot.dispatch.upload import UploadPlan
from bot.errors import DispatchError
from bot.node_programs.corpus_listing import Row, listing_digest
from bot.nodes.base import Node
from runner.inputs import item_id

LIST_TIMEOUT_S = 3600.0  # a node reads and hashes its whole corpus (a terabyte at 500 MB/s)


def list_on_head(head: Node, handle: RunHandle) -> int | None:
    """The head's listing (``head``: ``volume.nodes[0]``, else the volume's one node) of a
    corpus only the nodes hold, checked and written to the run directory; how many inputs
    it holds (None: the run's corpus is not such a one)."""
    spec = plan_of(handle).spec()
    on_nodes = corpus_on_nodes(handle, spec)
    if not on_nodes or not corpus_node_only(handle, spec):
        return None
    inputs = spec.get("inputs") or {}
    pattern = str(inputs.get("pattern") or "*")
    name = f"volume.nodes[0] ({head.where})"
    try:
        # an empty listing's digest: the node prints its rows unless its folder is empty
        code, out, err = head.run(corpus_command(head.python, on_nodes, pattern,
                                                 listing_digest([]), head.workdir),
                                  timeout=LIST_TIMEOUT_S,
                                  cap=listing_cap(int(inputs.get("expected_count") or 0)))
    except DispatchError as exc:
        raise type(exc)(f"{name}: volume.inputs.on_nodes {on_nodes} could not be listed: "
                        f"{exc}; nothing was started") from exc
    answer, listed = listing_answer(out, name, on_nodes)
    if code != 0 or answer is None:
        raise DispatchError(f"{name}: the listing of volume.inputs.on_nodes {on_nodes} did "
                            f"not answer (exit {code}): {(err or out).strip()[-300:]!r}")
    if answer.get("error"):
        raise DispatchError(f"{name}: volume.inputs.on_nodes {on_nodes} cannot be listed on "
                            f"the head node ({answer['error']}); nothing was started")
    rows = list(listed)
    del out  # the node's text: a million rows are about 100 MB
    _check(name, on_nodes, pattern, rows, inputs)
    write_listing(handle.run_dir, {"node": head.where, "on_nodes": on_nodes,
                                   "pattern": pattern, "digest": listing_digest(rows),
                                   "count": len(rows)}, rows)
    handle.progress({"node": head.where, "index": 0, "phase": "listed", "count": len(rows),
                     "bytes": sum(r[1] for r in rows)})
    return len(rows)


def check_on_node(node: Node, upload: UploadPlan) -> None:
    """A node's own copy of a corpus already on the nodes (``upload.on_nodes``; nothing
    when there is none) against its reference (``UploadPlan.corpus_check``: the bot's
    checked copy, or the head's listing above): a DispatchError naming the node and the
    first input that differs (``check_listing``)."""
    if not upload.on_nodes:
        return
    command, reference = upload.corpus_check(node.python)
    code, out, err = node.run(command, timeout=LIST_TIMEOUT_S,
                              cap=listing_cap(reference.count))
    if code != 0:
        raise DispatchError(f"{node.where}: `{command[:80]}` failed (exit {code}): "
                            f"{err.strip()[-600:]}")
    check_listing(node.where, upload.on_nodes, reference, out, head=upload.head)


def _check(name: str, on_nodes: str, pattern: str, rows: list[Row],
           inputs: dict[str, Any]) -> None:
    """The manifest's rules for an inputs folder, on the head's listing."""
    where = f"{name}: volume.inputs.on_nodes {on_nodes} matching {pattern!r}"
    expected = int(inputs.get("expected_count") or 0)
    if len(rows) != expected:
        raise DispatchError(f"{where} holds {len(rows)} input(s), volume.inputs.expected_count "
                            f"says {expected}: fix the count or the corpus; nothing was started")
    twice = sorted(i for i, n in Counter(item_id(r[0]) for r in rows).items() if n > 1)
    if twice:
        raise DispatchError(f"{where}: input id {twice[0]!r} is given by two files (an id is "
                            "the name without its extension); nothing was started")
    ids = {item_id(r[0]) for r in rows}
    absent = [i for i in inputs.get("expected_refusals") or [] if i not in ids]
    if absent:
        raise DispatchError(f"{where}: volume.inputs.expected_refusals names {absent[0]!r}, "
                            "which is not among its inputs; nothing was started")
