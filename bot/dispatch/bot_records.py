"""The bot's own records of a run: the files of a run directory that the bot writes and
reads back, never a node's.

They say which node to reach and what it was sent (``remote.json``, ``spec.json``,
``manifest.yaml``), what the dispatch holds the inputs to (``inputs.checked.json``), the
head node's listing of a corpus only the nodes hold (``corpus.listed.jsonl``), which nodes
run the volume's Ray (``ray_cluster.json``), the verification of the fetched evidence and
the report. A fetch never replaces one with the node's copy (``bot/nodes/ssh/fetch.py``
leaves these names out of what it brings back), and the evidence copy, which the fetch
replaces whole, may never be a run directory (``bot/dispatch/evidence_home.py``). One
list, named once: a new record is added here.
"""

from __future__ import annotations

# bot/nodes/ssh/dispatcher.py (write_layout), the service's submit, inputs_check.INPUTS_FILE,
# corpus.LISTING_FILE, volume_cluster.CLUSTER_FILE, upload.verify_fetched,
# bot/service/report_files.py (REPORT, PICTURE), bot/service/end_lock.py (the lock the bot
# holds while it stops a run and fetches its results), calibration_sample.SAMPLE_DIR (the
# volume's sample the bot sent a pilot's node for its calibration)
BOT_RECORDS = frozenset({
    "spec.json", "manifest.yaml", "remote.json", "inputs.checked.json", "corpus.listed.jsonl",
    "ray_cluster.json", "evidence-fetch.json", "report.html", "report-summary.png",
    ".end.lock", "calibration-sample",
})
# The fetch's own staging folders (``.fetch`` in the run directory, ``.fetch-<run id>``
# beside the evidence home): never fetched either.
STAGING_PREFIX = ".fetch"


def fetched_name(name: str) -> bool:
    """Whether a top-level name of the node's run directory is brought back."""
    return name not in BOT_RECORDS and not name.startswith(STAGING_PREFIX)
