"""What a node's command prints is read with a cap (issue 32, Medium 3): a project whose
``torch`` prints a gigabyte during the card proof (the project comes first on the proof's
path) costs the bot a few MiB of memory, not the gigabyte; the proof's error names the
node and the cap. The bot's side runs in a process of its own, whose peak memory is read
from /proc (``VmHWM``, reset once the SSH session is up)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bot.dispatch.node_output import NODE_OUTPUT_CAP
from bot.dispatch.upload import SSHNode
from bot.nodes.ssh.session import SSHSessions
from tests.remote.sshd_server import Sshd
from tests.runner.test_stages_kit import REPO, write_spec

LOUD_TORCH = """import os
chunk = b"x" * (1 << 20)
for stream in (1, 2):  # 512 MiB on each of stdout and stderr
    for _ in range(512):
        os.write(stream, chunk)
"""

BOT_SIDE = """
import json, re, sys
from pathlib import Path
from bot.dispatch.card_proof import NodeCopy, prove_nodes
from bot.nodes.ssh.adapter import SSHAdapter
from bot.nodes.ssh.dispatcher import SSHDispatcher
from bot.dispatch.upload import SSHNode
from bot.errors import DispatchError

def status(key):
    text = Path("/proc/self/status").read_text()
    return int(re.search(key + r":\\s+(\\d+)", text).group(1)) // 1024  # MiB

args = json.loads(sys.argv[1])
dispatcher = SSHDispatcher(known_hosts=args["known_hosts"], client_keys=[args["key"]],
                           use_agent=False)
node = SSHNode.from_dict(args["node"])
assert dispatcher.run(node, "true")[0] == 0  # the session up: the baseline counts it
base = status("VmRSS")
Path("/proc/self/clear_refs").write_text("5")  # the peak from here on
try:
    prove_nodes([SSHAdapter(dispatcher, node)], [NodeCopy(**args["copy"])], False)
    error = ""
except DispatchError as exc:
    error = str(exc)
print(json.dumps({"growth_mib": status("VmHWM") - base, "error": error}))
dispatcher.close()
"""


def test_a_project_whose_torch_prints_a_gigabyte_costs_the_bot_a_few_mib(
        tmp_path: Path, sshd: Sshd) -> None:
    spec = write_spec(tmp_path)
    project = tmp_path / "project"
    (project / "torch").mkdir()
    (project / "torch" / "__init__.py").write_text(LOUD_TORCH, encoding="utf-8")
    run_dir = tmp_path / "node-run"
    run_dir.mkdir()
    (run_dir / "card-proof.json").write_text(spec.read_text(encoding="utf-8"))
    node = sshd.node(tmp_path, python=sys.executable)
    args = {"known_hosts": str(sshd.known_hosts), "key": str(sshd.user_key), "node": node,
            "copy": {"run_dir": str(run_dir), "package_root": str(REPO),
                     "project_dir": str(project)}}
    done = subprocess.run([sys.executable, "-c", BOT_SIDE, json.dumps(args)], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["growth_mib"] < 100, found
    where = SSHNode.from_dict(node).where
    assert found["error"].startswith(f"volume.nodes[0] ({where}): the card proof did not "
                                     f"finish: {where}: "), found["error"]
    assert f"printed more than 4 MiB on its standard error (the cap on what the bot reads " \
           f"of a node's command, {NODE_OUTPUT_CAP} bytes)" in found["error"]


@pytest.mark.parametrize("stream", ["1", "2"])
def test_any_command_s_output_past_its_cap_closes_the_channel(sshd: Sshd, tmp_path: Path,
                                                              stream: str) -> None:
    sessions = SSHSessions(known_hosts=sshd.known_hosts, client_keys=[sshd.user_key],
                           use_agent=False)
    node = SSHNode.from_dict(sshd.node(tmp_path))
    try:
        from bot.dispatch.node_output import NodeOutputTooLarge

        with pytest.raises(NodeOutputTooLarge) as caught:
            sessions.run(node, f"head -c 100000 /dev/zero >&{stream}", cap=50_000)
        assert f"{node.where}: `head -c 100000 /dev/zero >&{stream}` printed more than" \
            in str(caught.value)
        assert "closed the channel" in str(caught.value)
        code, out, err = sessions.run(node, "printf 'fine\\n'; printf 'also\\n' >&2")
        assert (code, out, err) == (0, "fine\n", "also\n")  # the connection is still good
    finally:
        sessions.close()
