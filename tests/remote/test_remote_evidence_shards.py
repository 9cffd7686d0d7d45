"""An SSH node's evidence copy in shards (issue 35, point 1) comes back through the bot's
fetch as it is, is verified member by member on the bot host, and one output opens."""

from __future__ import annotations

import io
import json
from pathlib import Path

from bot.service.handles import handle_for
from runner.evidence import copy_evidence, show_output, verify_evidence
from tests.remote.remote_kit import pilote_bot, start_run
from tests.remote.sshd_server import Sshd


def test_a_sharded_evidence_copy_is_fetched_and_verified(tmp_path: Path, sshd: Sshd) -> None:
    workdir, evidence = tmp_path / "node", tmp_path / "evidence"
    with pilote_bot(tmp_path, sshd) as (bot, pilote):
        run_id = start_run(bot, pilote, submitter="alice")
        run = bot.service.follower.follow(run_id, timeout=120)
        assert run["evidence"]["verified"], run["evidence"]
        # the node's copy made again in shards (a pilot this small keeps plain files)
        [node_copy] = (workdir / "evidence").glob(f"*/{run_id}")
        node_run = workdir / "runs" / run_id
        again = copy_evidence(str(node_run), str(node_copy), plain_max=2, shard_files=5)
        assert again.verified and again.shards >= 2, again.problems
        handle = handle_for(bot.store.run_record(run_id))
        fetched = bot.dispatcher.fetch_results(handle)
        assert fetched is not None and fetched.parent == evidence
        assert sorted(p.name for p in (fetched / "shards").iterdir())[:2] == [
            "outputs-000000.tar", "outputs-000001.tar"]
        assert not (fetched / "outputs").exists()
        checked = verify_evidence(str(fetched))
        assert checked.ok and checked.shards == again.shards, checked.problems
        first = next(line.split(",")[0] for line in
                     (fetched / "balance.csv").read_text().splitlines()[1:]
                     if line.split(",")[1] == "accepted")
        out = io.BytesIO()
        assert "member of shards/" in show_output(str(fetched), first, out)
        assert json.loads(out.getvalue())
