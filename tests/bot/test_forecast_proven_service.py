"""Through the service: the volume's forecast made again once every node proved its cards
(issue 23), stored with the volume run, told in the thread, the driver's time limit
widened before it is launched, and the check after the volume scored on it.

``ProvingDispatcher`` reports each volume node's card proof as the SSH dispatcher does
(``dispatch.node`` steps, ``phase: proved`` with the healthy cards' indices), then reads
the spec it would send to the head, as the SSH dispatcher reads it after the proofs."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from bot.manifest.load import load_manifest_file
from bot.messages.model import RecordingNotifier
from bot.service import PilotService
from bot.settings import Settings
from bot.store import Store
from tests.bot.fakes import ScriptedDispatcher, pilot_script, write_manifest

PILOT = [f"doc-{n:02d}" for n in range(1, 7)]
VOLUME_IDS = [f"vol-{n:04d}" for n in range(1, 601)]
HOSTS = ("gpu-0.example", "gpu-1.example", "gpu-2.example", "gpu-3.example")
PROVEN = ([0, 1, 2, 3], list(range(4)), [0, 2], list(range(4)))


def script(ids: list[str]) -> list[dict[str, Any]]:
    """A pilot on a node whose 4 cards are healthy, each item timed 0.5 s; the volume's
    run records its 600 ids."""
    out = pilot_script(ids, refuse=())
    for event in out:
        if event["type"] == "item.done":
            event.update(elapsed_s=0.5, input_bytes=30)
        if event.get("stage") == "device" and event["type"] == "stage.passed":
            event["facts"] = {"healthy_cards": list(range(4)), "cpu_count": 16,
                              "device": "cuda"}
    return out


class ProvingDispatcher(ScriptedDispatcher):
    def __init__(self) -> None:
        super().__init__(lambda run_id: script(VOLUME_IDS if run_id in self.volumes
                                               else PILOT))  # read when each run starts
        self.launched_limit: list[float] = []
        self.volumes: set[str] = set()

    def start(self, handle: Any) -> int | None:
        if json.loads(Path(handle.spec_path).read_text(encoding="utf-8")).get("volume"):
            # the service hands the start its plan, taken from the checked manifest
            assert handle.plan is not None
            assert [n.host for n in handle.plan.volume_nodes] == list(HOSTS)
            self.volumes.add(handle.run_id)
            answers = [handle.progress({"node": f"{host}:22", "index": i, "phase": "proved",
                                        "cards": PROVEN[i], "excluded": 4 - len(PROVEN[i])})
                       for i, host in enumerate(HOSTS)]
            # the service answers the last proof with its decision; it edits no file
            spec = json.loads(Path(handle.spec_path).read_text(encoding="utf-8"))
            decided = [a.time_limit_s for a in answers if a is not None]
            assert answers[:-1] == [None] * (len(HOSTS) - 1)
            self.launched_limit.append(float(decided[-1] if decided
                                             else spec["volume"]["time_limit_s"]))
        return super().start(handle)


def manifest(root: Path, *, limit: str = "") -> Path:
    data = root / "data" / "volume"
    data.mkdir(parents=True, exist_ok=True)
    for name in VOLUME_IDS:
        (data / f"{name}.txt").write_text("invoice number 1 total due", encoding="utf-8")
    nodes = ", ".join(f"{{kind: ssh, host: {h}, workdir: /w}}" for h in HOSTS)
    starts = (datetime.now(timezone.utc) - timedelta(hours=1)).isoformat()
    node = f"{{kind: ssh, host: {HOSTS[0]}, workdir: /w}}"
    path = write_manifest(root, count=6, extra=f"""node: {node}
volume: {{inputs: {{dir: data/volume, pattern: "vol-*.txt", expected_count: 600}},
         nodes: [{nodes}]{limit}}}
lease: {{starts_at: "{starts}"}}
""")
    text = path.read_text(encoding="utf-8")
    text = text.replace('hardware: {gpu: cpu, lots: 1, days: 3, lot_price_usd_per_day: "0"}',
                        'hardware: {gpu: B200, lots: 8, days: 3, lot_price_usd_per_day: "80"}')
    path.write_text(text.replace("backend: cpu", "backend: cuda"), encoding="utf-8")
    return path


def approved(tmp_path: Path, *, limit: str = "", dispatcher: ProvingDispatcher | None = None
             ) -> tuple[PilotService, ProvingDispatcher, RecordingNotifier, str, str]:
    """A pilot finished and approved (``manifest`` written unless there is one already)."""
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path)})
    dispatcher = dispatcher or ProvingDispatcher()
    notifier = RecordingNotifier()
    service = PilotService(settings, Store(settings.db_path),
                           {"local": dispatcher, "ssh": dispatcher}, notifier)
    path = tmp_path / "manifest.yaml"
    loaded = load_manifest_file(path if path.exists() else manifest(tmp_path, limit=limit))
    sub = service.submit(loaded, submitter="bob")
    service.starter.start(sub.run_id)
    service.follower.follow(sub.run_id, timeout=30)
    volume = service.decider.decide(sub.run_id, "approve", "pilot clean", "alice")["volume_run"]
    return service, dispatcher, notifier, sub.run_id, volume


def test_the_forecast_on_the_proven_nodes_is_stored_shown_and_widens_the_limit(
        tmp_path: Path) -> None:
    service, dispatcher, notifier, pilot, volume = approved(tmp_path)
    before = service.store.get_run(pilot)["forecast"]
    assert before["workers"] == 16  # 8 B200 lots of 2: the pilot's 4 healthy + 3 × a share of 4
    fc = service.store.get_run(volume)["forecast"]
    # 4 + 4 + 2 + 4 healthy: 14 workers, 600 items × 0.5 s ÷ 14 (was ÷ 16)
    assert fc["possible"] and fc["workers"] == 14 and fc["proc_mid_s"] == round(300 / 14, 3)
    proven = fc["proven"]
    assert proven["node_cards"] == [4, 4, 2, 4] and proven["healthy"] == 14
    assert proven["rented"] == 16 and proven["differs"] is True
    assert proven["approved"]["workers"] == 16
    # the driver's limit, derived from the forecast, is widened before the driver gets it
    assert proven["time_limit"]["how"] == "widened"
    assert dispatcher.launched_limit == [proven["time_limit"]["s"]]
    # the approved one: 2 × the approved high estimate + 30 min
    assert proven["time_limit"]["was_s"] == math.ceil(2 * before["high_s"] + 1800)
    assert proven["time_limit"]["s"] == math.ceil(2 * fc["high_s"] + 1800)
    assert proven["time_limit"]["s"] > proven["time_limit"]["was_s"]
    line = notifier.latest[(volume, "forecast_proven")].blocks[0].text  # type: ignore[union-attr]
    assert line.startswith("4 nodes proven: 14 healthy cards of 16; forecast now ")
    assert "(14 workers), was " in line and "(16 workers)" in line
    assert "time limit widened to" in line
    # after the volume: scored against the forecast for the cards really used
    service.follower.follow(volume, timeout=30)
    check = service.store.get_run(volume)["forecast"]
    assert check["workers_forecast"] == 14 and check["proven"]["healthy"] == 14
    # one Ray start (the attempt) + the processing of 600 items × 0.5 s ÷ 14
    assert check["forecast_mid_s"] == round(4.6 + 300 / 14, 3)


def test_a_limit_the_manifest_sets_is_kept(tmp_path: Path) -> None:
    service, dispatcher, notifier, _, volume = approved(tmp_path, limit=", time_limit_s: 7200")
    proven = service.store.get_run(volume)["forecast"]["proven"]
    assert proven["time_limit"] == {"s": 7200.0, "was_s": 7200.0, "how": "kept",
                                    "why": "volume.time_limit_s"}
    assert dispatcher.launched_limit == [7200.0]
    line = notifier.latest[(volume, "forecast_proven")].blocks[0].text  # type: ignore[union-attr]
    assert line.endswith("time limit kept at 2 h 0 min 0 s (volume.time_limit_s)")
