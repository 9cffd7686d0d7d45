"""The example training workload and the resume test in a new process.

``python -m runner.workloads.train`` trains a small MLP (with dropout, a shuffled data
order and a little Python-random noise, so every RNG matters) on the CSV shards of the
inputs directory. The pilot stage (:func:`train_pilot`) runs it three times: A runs K+M
steps straight through; B runs K steps and writes a checkpoint; C, a new process, loads
that checkpoint and runs M steps (A and B run in the stage's own process, each from a
fresh seed, which keeps the test to one extra torch start-up). C's parameters, optimizer
state and losses must equal A's bit for bit (deterministic algorithms on), or within
``training.tolerance``.

A checkpoint is ``checkpoints/step-<k>/state.pt`` written atomically (temporary file,
fsync, rename) and ``COMPLETE`` written last, holding the checkpoint's SHA-256: a
checkpoint without it, or whose bytes differ, is refused. It holds the model, optimizer,
scheduler, step, RNG states (python, torch CPU, CUDA when present) and the data position.
``task.params.break_resume_rng: true`` makes C skip restoring the RNG states, to prove the
comparison catches a broken resume.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import random
import subprocess
import sys
from typing import Any, Dict, List, Optional, Tuple

from runner.inputs import Item

FEATURES = 6
MARKER = "COMPLETE"


class CheckpointError(RuntimeError):
    """A checkpoint is incomplete or does not match its completion marker."""


def read_shards(items: List[Item]) -> Tuple[List[List[float]], Dict[str, str]]:
    """Rows of every readable shard, and a refusal reason per unreadable one."""
    rows: List[List[float]] = []
    refused: Dict[str, str] = {}
    for item in items:
        try:
            with open(item.path, encoding="utf-8", newline="") as fh:
                reader = csv.reader(fh)
                header = next(reader, None)
                part = [[float(v) for v in rec] for rec in reader if rec]
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            refused[item.id] = f"unreadable shard: {exc}"
            continue
        if not header or len(header) != FEATURES + 1 or not part:
            refused[item.id] = f"expected a header and rows of {FEATURES + 1} columns"
            continue
        if any(len(r) != FEATURES + 1 for r in part):
            refused[item.id] = f"a row does not have {FEATURES + 1} columns"
            continue
        rows.extend(part)
    return rows, refused


def build(seed: int) -> Tuple[Any, Any, Any]:
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.ReLU(),
                                torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.7)
    return model, opt, sched


def rng_state() -> Dict[str, Any]:
    import torch

    state: Dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    import torch

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(directory: str, state: Dict[str, Any]) -> str:
    import torch

    os.makedirs(directory, exist_ok=True)
    final = os.path.join(directory, "state.pt")
    tmp = final + ".tmp"
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    digest = _sha256(final)
    marker_tmp = os.path.join(directory, MARKER + ".tmp")
    with open(marker_tmp, "w", encoding="utf-8") as fh:
        json.dump({"sha256": digest, "step": state["step"]}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(marker_tmp, os.path.join(directory, MARKER))
    return final


def load_checkpoint(directory: str) -> Dict[str, Any]:
    import torch

    marker = os.path.join(directory, MARKER)
    path = os.path.join(directory, "state.pt")
    try:
        with open(marker, encoding="utf-8") as fh:
            expected = json.load(fh)["sha256"]
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{directory}: no valid {MARKER} marker (incomplete checkpoint)") \
            from exc
    if not os.path.exists(path) or _sha256(path) != expected:
        raise CheckpointError(f"{path}: does not match its {MARKER} marker")
    return torch.load(path, weights_only=False)  # type: ignore[no-any-return]


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def train(rows: List[List[float]], *, seed: int, steps: int, batch: int = 16,
          resume_from: Optional[str] = None, checkpoint_to: Optional[str] = None,
          restore_rng: bool = True, device: str = "cpu") -> Dict[str, Any]:
    """Run ``steps`` optimizer updates; return the losses and the final state."""
    import torch

    torch.use_deterministic_algorithms(True)
    random.seed(seed)
    model, opt, sched = build(seed)
    data = torch.tensor(rows, dtype=torch.float32)
    step, pos, order = 0, 0, torch.randperm(len(rows))
    if resume_from:
        ck = load_checkpoint(resume_from)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        sched.load_state_dict(ck["scheduler"])
        step, pos, order = ck["step"], ck["data_position"], ck["data_order"]
        if restore_rng:
            set_rng_state(ck["rng"])
    model.to(device)
    losses: List[float] = []
    for _ in range(steps):
        if pos + batch > len(order):
            order, pos = torch.randperm(len(rows)), 0
        idx = order[pos:pos + batch]
        pos += batch
        x, y = data[idx, :FEATURES].to(device), data[idx, FEATURES:].to(device)
        x = x + random.gauss(0.0, 0.01)  # python RNG in the loop, so its state matters
        model.train()
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        sched.step()
        step += 1
        losses.append(float(loss.item()))
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(),
             "scheduler": sched.state_dict(), "step": step, "data_position": pos,
             "data_order": order, "rng": rng_state()}
    if checkpoint_to:
        save_checkpoint(checkpoint_to, state)
    return {"losses": losses, "state": state}


def flatten(result: Dict[str, Any]) -> Dict[str, Any]:
    """Every tensor that must match after a resume, by a readable name."""
    out: Dict[str, Any] = {}
    for name, tensor in result["state"]["model"].items():
        out[f"model.{name}"] = tensor
    for idx, slots in result["state"]["optimizer"]["state"].items():
        for name, value in slots.items():
            out[f"optimizer.state.{idx}.{name}"] = value
    return out


def compare(a: Dict[str, Any], c: Dict[str, Any], resume_steps: int) -> List[Dict[str, Any]]:
    """The tensors (and losses) where C differs from A, with the largest difference."""
    import torch

    diffs: List[Dict[str, Any]] = []
    la, lc = a["losses"][-resume_steps:], c["losses"]
    if la != lc:
        worst = max((abs(x - y) for x, y in zip(la, lc)), default=float("inf"))
        diffs.append({"tensor": "losses", "max_abs_diff": worst, "a": la, "c": lc})
    fa, fc = flatten(a), flatten(c)
    for name in sorted(set(fa) | set(fc)):
        ta, tc = fa.get(name), fc.get(name)
        if ta is None or tc is None:
            diffs.append({"tensor": name, "max_abs_diff": None, "detail": "missing on one side"})
        elif not torch.equal(torch.as_tensor(ta).cpu(), torch.as_tensor(tc).cpu()):
            delta = (torch.as_tensor(ta).double() - torch.as_tensor(tc).double()).abs().max()
            diffs.append({"tensor": name, "max_abs_diff": float(delta)})
    return diffs


def main(argv: Optional[List[str]] = None) -> int:
    import torch

    p = argparse.ArgumentParser(prog="python -m runner.workloads.train")
    p.add_argument("--shard", action="append", default=[])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--resume-from")
    p.add_argument("--checkpoint-to")
    p.add_argument("--no-restore-rng", action="store_true")
    p.add_argument("--device", default="cpu")
    p.add_argument("--result", required=True)
    args = p.parse_args(argv)
    items = [Item(id=os.path.basename(s), path=s, size=0) for s in args.shard]
    rows, _refused = read_shards(items)
    result = train(rows, seed=args.seed, steps=args.steps, resume_from=args.resume_from,
                   checkpoint_to=args.checkpoint_to, restore_rng=not args.no_restore_rng,
                   device=args.device)
    torch.save({"losses": result["losses"], "state": result["state"]}, args.result)
    return 0


def handle(items: List[Item], ctx: Any) -> List[Dict[str, Any]]:
    """The handler form (what the memory stage measures): one training step on a batch.

    The pilot stage itself runs :func:`train_pilot` for ``task.kind: train``.
    """
    import torch

    rows, refused = read_shards(items)
    if rows:
        was = torch.are_deterministic_algorithms_enabled()
        try:
            train(rows, seed=ctx.spec.training.seed, steps=1, device=ctx.device)
        finally:
            torch.use_deterministic_algorithms(was)
    return [{"id": it.id, "status": "refused", "reason": refused[it.id]} if it.id in refused
            else {"id": it.id, "status": "accepted", "category": "train"} for it in items]


def train_pilot(ctx: Any, remaining: List[Item], recorder: Any) -> Dict[str, Any]:
    """The resume test in new processes (A, B, C), then the shards into the ledger."""

    from runner.stages import StageFailure

    spec = ctx.spec
    rows, refused = read_shards(remaining)
    readable = [it for it in remaining if it.id not in refused]
    k, m = max(1, spec.training.steps), max(1, spec.training.resume_steps)
    work = os.path.join(ctx.run_dir, "checkpoints")
    os.makedirs(work, exist_ok=True)
    params = dict(spec.project.params or {}, **(spec.task.params or {}))
    facts: Dict[str, Any] = {"steps": k, "resume_steps": m, "seed": spec.training.seed,
                             "shards": len(readable),
                             "rows": len(rows), "checkpoint": os.path.join(work, f"step-{k}")}
    if readable:
        a, c = _run_abc(ctx, readable, rows, work, k, m, bool(params.get("break_resume_rng")))
        diffs = compare(a, c, m)
        facts.update({"losses_a": a["losses"], "losses_c": c["losses"],
                      "bit_identical": not diffs, "differences": diffs[:20],
                      "tolerance": spec.training.tolerance})
    results = [{"id": it.id, "status": "accepted", "category": "train"} for it in readable]
    results += [{"id": i, "status": "refused", "reason": r} for i, r in refused.items()]
    facts["recorded"] = recorder.record([it.id for it in remaining], results)
    if not readable:
        raise StageFailure("pilot", "no readable training shard", facts=facts,
                           hint="check inputs.dir and the shard format")
    _judge(facts, spec.training.tolerance, StageFailure)
    return facts


def _run_abc(ctx: Any, readable: List[Item], rows: List[List[float]], work: str, k: int,
             m: int, break_rng: bool) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """A and B run here (each from a fresh seed); C runs in a new process from B's checkpoint."""
    import torch

    seed = ctx.spec.training.seed
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        a = train(rows, seed=seed, steps=k + m, device=ctx.device)
        train(rows, seed=seed, steps=k, checkpoint_to=f"{work}/step-{k}", device=ctx.device)
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
    args = [f"--seed={seed}", f"--device={ctx.device}", f"--steps={m}",
            f"--resume-from={work}/step-{k}", f"--result={work}/C.pt"]
    args += [f"--shard={it.path}" for it in readable]
    _proc(args + (["--no-restore-rng"] if break_rng else []))
    return a, torch.load(f"{work}/C.pt", weights_only=False)


def _judge(facts: Dict[str, Any], tol: Optional[float], failure: Any) -> None:
    diffs = facts["differences"]
    if not diffs:
        return
    worst = max((d["max_abs_diff"] for d in diffs if d["max_abs_diff"] is not None),
                default=float("inf"))
    if tol is not None and worst <= tol:
        facts["within_tolerance"] = True
        return
    names = ", ".join(f"{d['tensor']} (max |diff| {d['max_abs_diff']:.3g})"
                      if d["max_abs_diff"] is not None else d["tensor"] for d in diffs[:6])
    raise failure("pilot", f"resume in a new process differs from the straight run: {names}",
                  facts=facts, error_type="ResumeMismatch",
                  hint="restore every RNG state, the optimizer, the scheduler and the data "
                       "position; set training tolerance only for a non-deterministic device")


def _proc(args: List[str]) -> None:
    from runner.stages import StageFailure

    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # deterministic cuBLAS
    proc = subprocess.run([sys.executable, "-m", "runner.workloads.train"] + args, env=env,
                          capture_output=True, check=False)
    if proc.returncode != 0:
        tail = proc.stderr.decode("utf-8", errors="replace").strip().splitlines()[-1:]
        raise StageFailure("pilot", f"training process failed ({proc.returncode}): "
                           f"{tail[0] if tail else 'no message'}", error_type="TrainingFailed")


if __name__ == "__main__":
    sys.exit(main())
