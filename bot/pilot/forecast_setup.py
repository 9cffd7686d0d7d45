"""What the volume pays before its items run (its setup), each part with where its figure
comes from: the pilot's diagnostics and dispatch, measured; the inputs' upload or check on
the nodes; the card proofs; Ray's start and stop, measured by the calibration where it runs.
Pure; docs/forecast.md ("Each figure")."""

from __future__ import annotations

from typing import Any

from bot.pilot.forecast_stats import duration, plural, secs
from bot.pilot.forecast_types import Figure, ForecastInputs, Setup

RAY_START_S = 4.6          # a local Ray and its workers, per attempt (measured, embedded default)
RAY_LOW, RAY_HIGH = 0.5, 2.0  # Ray's start, measured once: two starts on a loaded machine
#                              differed 2× (4.9 and 10.9 s), so the range takes it × these
RAY_START_AT_ONCE = 8      # nodes that start Ray together (bot/dispatch/ray_cluster.py's bound)
UPLOAD_BYTES_PER_S = 50e6  # an SSH node's upload of the inputs, when not measured
HASH_BYTES_PER_S = 500e6  # a node reading and hashing its copy of the corpus (on_nodes)
UPLOAD_MEASURED_MIN = 8 << 20  # a pilot's upload under this says little of the uplink
PREPARE_AT_ONCE = 4        # nodes whose copy is made together (bot/nodes/ssh/dispatcher.py)


def setup(inp: ForecastInputs, figures: list[Figure], numbers: dict[str, Any]) -> float:
    """What the volume pays before its items: each part with where its figure comes from."""
    st, nodes = inp.setup, max(1, inp.nodes)
    parts: list[tuple[str, str, float, str]] = []
    if st.diagnostics_s is not None:
        parts.append(("setup_diagnostics", "Setup: diagnostics", st.diagnostics_s,
                      "the pilot's stages before its pilot stage, measured (the volume runs "
                      "the same)"))
    # an SSH volume's nodes get their copies PREPARE_AT_ONCE at a time: each wave as long
    # as the pilot's own dispatch (sessions, hashes, its upload, the launch)
    waves = -(-nodes // PREPARE_AT_ONCE) if st.ssh else 1
    if st.dispatch_s is not None:
        parts.append(("setup_dispatch", "Setup: dispatch", st.dispatch_s * waves,
                      "from the pilot's dispatch to its runner's start, measured (upload of "
                      "the runner and project, launch)" + (
                          f" × {waves} waves: the {plural(nodes, 'node')}' copies are made "
                          f"{PREPARE_AT_ONCE} at a time" if waves > 1 else "")))
    if st.ssh and inp.volume_bytes and st.inputs_on_nodes:
        parts.append(("setup_upload", "Setup: inputs checked on the nodes",
                      inp.volume_bytes / HASH_BYTES_PER_S,
                      f"{inp.volume_bytes:,} B ÷ {HASH_BYTES_PER_S / 1e6:g} MB/s (estimated), "
                      "read and hashed on every node at once (volume.inputs.on_nodes: none "
                      "uploaded)"))
    elif st.ssh and inp.volume_bytes:
        rate, how = upload_rate(st)
        upload = inp.volume_bytes / rate * nodes
        parts.append(("setup_upload", "Setup: inputs upload", upload,
                      f"{inp.volume_bytes:,} B ÷ {rate / 1e6:.3g} MB/s ({how}) "
                      f"× {plural(nodes, 'node')}, the bot's uplink shared by the nodes' "
                      "copies"))
    if nodes > 1:
        proof = st.proof_s if st.proof_s is not None else 0.0
        parts.append(("setup_proof", "Setup: card proofs", proof,
                      f"the pilot's card stages, measured: {secs(proof)}, on every node at once"))
    # the head first, then the other nodes RAY_START_AT_ONCE at a time
    waves = 1 + -(-(nodes - 1) // RAY_START_AT_ONCE) if nodes > 1 else 1
    per_start, where = ray_start(inp)
    ray = per_start * waves
    parts.append(("setup_ray", "Setup: Ray start and stop", ray,
                  f"{per_start:.3g} s per attempt ({where})" + (
                      f" × {waves}: the head, then the {plural(nodes - 1, 'other node')} "
                      f"{RAY_START_AT_ONCE} at a time" if nodes > 1 else "")))
    total = 0.0
    for key, label, seconds, formula in parts:
        figures.append(Figure(key, label, secs(seconds), formula))
        numbers[key + "_s"] = round(seconds, 3)
        total += seconds
    figures.append(Figure("setup", "Setup", secs(total) if total < 60 else duration(total),
                          " + ".join(secs(p[2]) for p in parts) + f" = {secs(total)}"))
    numbers.update(setup_s=round(total, 3), ray_start_s=round(per_start, 3),
                   ray_start_low_s=round(RAY_LOW * per_start, 3),
                   ray_start_high_s=round(RAY_HIGH * per_start, 3))
    return total


def upload_rate(st: Setup) -> tuple[float, str]:
    """Bytes per second the bot host sends a node, and how it is known: the pilot's own
    upload (its bytes over its whole dispatch: a rate no faster than it was) when it sent
    at least ``UPLOAD_MEASURED_MIN``; else ``UPLOAD_BYTES_PER_S``, estimated."""
    if st.uploaded_bytes is not None and st.uploaded_bytes >= UPLOAD_MEASURED_MIN \
            and st.dispatch_s:
        return st.uploaded_bytes / st.dispatch_s, (
            f"the pilot's upload: {st.uploaded_bytes:,} B in its {secs(st.dispatch_s)} "
            "dispatch, measured")
    why = ("the pilot sent too little to measure it" if st.uploaded_bytes is not None
           else "not measured")
    return UPLOAD_BYTES_PER_S, f"estimated: {why}"


def ray_start(inp: ForecastInputs) -> tuple[float, str]:
    """Seconds Ray and the workers (their handler loaded) take to start, and where that
    figure comes from: the calibration measured it on the pilot's node; else the
    embedded default's constant."""
    cal = inp.calibration
    if cal is not None and cal.skipped is None and cal.workers_ready_s is not None:
        stop = cal.ray_stop_s or 0.0
        return cal.workers_ready_s + stop, (
            f"the inputs listed, Ray imported and started with "
            f"{plural(cal.workers, 'worker')}, each with the handler loaded, "
            f"{secs(cal.workers_ready_s)}, + its stop at the end "
            f"{secs(stop)}: measured on the pilot's node by the calibration")
    return RAY_START_S, "a local Ray and its workers, measured on the embedded default"
