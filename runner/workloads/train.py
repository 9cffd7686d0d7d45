"""The training pilot: a trainer's resume tested in a new process, and the example trainer.

The pilot stage (:func:`train_pilot`) drives the trainer named by ``task.trainer`` (the
protocol is in :mod:`runner.workloads.trainer`; without one, this module's example
trainer). It runs the trainer three times: A runs K+M steps straight through; B runs K
steps and writes a checkpoint; C, a new process (``python -m runner.workloads.train
JOB.json``), loads that checkpoint and runs M steps (A and B run in the stage's own
process, each from a fresh seed, which keeps the test to one extra torch start-up). C's
parameters, optimizer state and losses must equal A's bit for bit (deterministic
algorithms on), or within ``training.tolerance``; otherwise the differing tensors are
named with their largest difference.

A checkpoint is ``checkpoints/step-<k>/state.pt`` written atomically (temporary file,
fsync, rename) and ``COMPLETE`` written last, holding the checkpoint's SHA-256: a
checkpoint without it, or whose bytes differ, is refused. It holds the model, optimizer,
scheduler, step, RNG states (python, torch CPU, CUDA when present, numpy when imported)
and the data order and position. ``task.params.break_resume_rng: true`` makes C skip
restoring the RNG states, to prove the comparison catches a broken resume.

The example trainer (:func:`read`, :func:`build`, :func:`step`) is a small MLP (with
dropout, and a little python-random noise, so every RNG matters) on CSV shards of
``FEATURES`` inputs and one target.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import subprocess
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

from runner.inputs import Item
from runner.recording import ItemRecorder
from runner.workloads.trainer import (
    BUILTIN,
    CheckpointError,
    Trainer,
    TrainerError,
    load_checkpoint,
    load_trainer,
    rng_state,
    save_checkpoint,
    seed_all,
    set_rng_state,
)

FEATURES = 6
batch_size = 16
Probe = Callable[[Dict[str, Any]], None]


# ---- the example trainer ---------------------------------------------------------------

def read(items: List[Item], params: Dict[str, Any]) -> Tuple[List[List[float]], Dict[str, str]]:
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


def build(seed: int, params: Dict[str, Any], device: str) -> Tuple[Any, Any, Any]:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.ReLU(),
                                torch.nn.Dropout(0.2), torch.nn.Linear(16, 1)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=float(params.get("lr", 0.01)),
                            weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.7)
    return model, opt, sched


def step(model: Any, optimizer: Any, batch: List[List[float]], device: str) -> Any:
    import torch

    data = torch.tensor(batch, dtype=torch.float32, device=device)
    x, y = data[:, :FEATURES], data[:, FEATURES:]
    x = x + random.gauss(0.0, 0.01)  # python RNG in the loop, so its state matters
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()  # type: ignore[no-untyped-call]
    optimizer.step()
    return loss


# ---- the runner's training loop --------------------------------------------------------

def train(trainer: Trainer, examples: Any, *, seed: int, steps: int,
          params: Optional[Dict[str, Any]] = None, resume_from: Optional[str] = None,
          checkpoint_to: Optional[str] = None, restore_rng: bool = True,
          device: str = "cpu", probe: Optional[Tuple[int, Probe]] = None) -> Dict[str, Any]:
    """Run ``steps`` of the trainer's updates; return the losses and the final state.

    ``probe``: (n, fn) calls ``fn`` with the losses and live state after n steps.
    """
    import torch

    torch.use_deterministic_algorithms(True)
    seed_all(seed)
    model, opt, sched = trainer.build(seed, dict(params or {}), device)
    count, size = len(examples), trainer.batch_size
    done, pos, order = 0, 0, torch.randperm(count)
    if resume_from:
        ck = load_checkpoint(resume_from)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        if sched is not None and ck.get("scheduler") is not None:
            sched.load_state_dict(ck["scheduler"])
        done, pos, order = ck["step"], ck["data_position"], ck["data_order"]
        if restore_rng:
            set_rng_state(ck["rng"])
    losses: List[float] = []
    for _ in range(steps):
        if pos + size > len(order):
            order, pos = torch.randperm(count), 0
        idx = order[pos:pos + size]
        pos += size
        batch = examples[idx] if isinstance(examples, torch.Tensor) \
            else [examples[i] for i in idx.tolist()]
        model.train()
        losses.append(trainer.step(model, opt, batch, device))
        if sched is not None:
            sched.step()
        done += 1
        if probe is not None and done == probe[0]:
            probe[1]({"losses": losses, "state": {"model": model.state_dict(),
                                                  "optimizer": opt.state_dict()}})
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(),
             "scheduler": sched.state_dict() if sched is not None else None, "step": done,
             "data_position": pos, "data_order": order, "rng": rng_state(),
             "trainer": trainer.ref}
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
            delta = (torch.as_tensor(ta).cpu().double()
                     - torch.as_tensor(tc).cpu().double()).abs().max()
            diffs.append({"tensor": name, "max_abs_diff": float(delta)})
    return diffs


# ---- process C, the handler form and the pilot stage -----------------------------------

def main(argv: Optional[List[str]] = None) -> int:
    """Process C: run the job file the pilot stage wrote, save the result with torch."""
    import torch

    p = argparse.ArgumentParser(prog="python -m runner.workloads.train")
    p.add_argument("job", help="the JSON job file written by the pilot stage")
    job_path = p.parse_args(argv).job
    with open(job_path, encoding="utf-8") as fh:
        job = json.load(fh)
    try:
        trainer = load_trainer(job["trainer"], job.get("project_dir"))
        items = [Item(id=i, path=path, size=size) for i, path, size in job["items"]]
        examples, _refused = trainer.read(items, job["params"])
        result = train(trainer, examples, seed=job["seed"], steps=job["steps"],
                       params=job["params"], resume_from=job["resume_from"],
                       restore_rng=job["restore_rng"], device=job["device"])
    except (TrainerError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    torch.save(result, job["result"])
    return 0


def handle(items: List[Item], ctx: Any) -> List[Dict[str, Any]]:
    """The handler form (what the memory stage measures): one step of the spec's trainer.

    The pilot stage itself runs :func:`train_pilot` for ``task.kind: train``.
    """
    import torch

    spec = ctx.spec
    trainer = load_trainer(spec.task.trainer, spec.project.dir)
    examples, refused = trainer.read(items, ctx.params)
    if len(examples):
        was = torch.are_deterministic_algorithms_enabled()
        try:
            train(trainer, examples, seed=spec.training.seed, steps=1, params=ctx.params,
                  device=ctx.device)
        finally:
            torch.use_deterministic_algorithms(was)
    return [{"id": it.id, "status": "refused", "reason": refused[it.id]} if it.id in refused
            else {"id": it.id, "status": "accepted", "category": "train"} for it in items]


def train_pilot(ctx: Any, remaining: List[Item], recorder: ItemRecorder) -> Dict[str, Any]:
    """The resume test in new processes (A, B, C), then the shards into the ledger."""
    from runner.stage import StageFailure

    spec = ctx.spec
    ref = spec.task.trainer
    k, m = max(1, spec.training.steps), max(1, spec.training.resume_steps)
    work = os.path.join(ctx.run_dir, "checkpoints")
    os.makedirs(work, exist_ok=True)
    params = dict(spec.project.params or {}, **(spec.task.params or {}))
    facts: Dict[str, Any] = {"trainer": ref or f"{BUILTIN} (built-in example)",
                             "steps": k, "resume_steps": m, "seed": spec.training.seed,
                             "checkpoint": os.path.join(work, f"step-{k}")}
    try:
        trainer = load_trainer(ref, spec.project.dir)
        examples, refused = trainer.read(remaining, params)
        readable = [it for it in remaining if it.id not in refused]
        facts.update({"shards": len(readable), "examples": len(examples)})
        if readable and not len(examples):
            raise TrainerError(f"trainer {trainer.ref}: read returned no example from "
                               f"{len(readable)} readable shard(s)")
        if readable:
            _run_abc(ctx, trainer, readable, examples, params, work, (k, m), facts)
    except (TrainerError, CheckpointError) as exc:
        raise StageFailure("pilot", str(exc), facts=facts, error_type=type(exc).__name__,
                           hint="check task.trainer, project.dir and the trainer's "
                                "read/build/step (see docs/workloads.md)") from exc
    results = [{"id": it.id, "status": "accepted", "category": "train"} for it in readable]
    results += [{"id": i, "status": "refused", "reason": r} for i, r in refused.items()]
    facts["recorded"] = recorder.record([it.id for it in remaining], results)
    if not readable:
        raise StageFailure("pilot", "no readable training shard", facts=facts,
                           hint="check inputs.dir and the shard format")
    _judge(facts, "straight_differences", spec.training.tolerance, StageFailure)
    _judge(facts, "differences", spec.training.tolerance, StageFailure)
    return facts


def _run_abc(ctx: Any, trainer: Trainer, readable: List[Item], examples: Any,
             params: Dict[str, Any], work: str, km: Tuple[int, int],
             facts: Dict[str, Any]) -> None:
    """B then A run here, each from a fresh seed; C runs in a new process from B's checkpoint.

    A is compared with B's checkpoint after K steps first: two straight runs that already
    differ mean the trainer itself is not deterministic, whatever the resume does, and C
    is not started.
    """
    import torch

    (k, m), seed, device = km, ctx.spec.training.seed, ctx.device
    ck_dir = f"{work}/step-{k}"
    straight: List[Dict[str, Any]] = []
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        b_losses = train(trainer, examples, seed=seed, steps=k, params=params,
                         checkpoint_to=ck_dir, device=device)["losses"]
        b = {"losses": b_losses, "state": load_checkpoint(ck_dir, map_location="cpu")}
        a = train(trainer, examples, seed=seed, steps=k + m, params=params, device=device,
                  probe=(k, lambda view: straight.extend(compare(view, b, k))))
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
    facts.update({"losses_a": a["losses"], "losses_b": b_losses,
                  "straight_identical": not straight, "straight_differences": straight[:20],
                  "tolerance": ctx.spec.training.tolerance})
    if straight and not _within(straight, ctx.spec.training.tolerance):
        facts.update({"bit_identical": False, "differences": []})
        return
    job = {"trainer": trainer.ref, "project_dir": ctx.spec.project.dir, "params": params,
           "seed": seed, "steps": m, "device": device, "resume_from": ck_dir,
           "restore_rng": not params.get("break_resume_rng"), "result": f"{work}/C.pt",
           "items": [[it.id, it.path, it.size] for it in readable]}
    with open(f"{work}/C.json", "w", encoding="utf-8") as fh:
        json.dump(job, fh, indent=1, default=str)
    _proc(f"{work}/C.json")
    c = torch.load(f"{work}/C.pt", map_location="cpu", weights_only=False)
    diffs = compare(a, c, m)
    facts.update({"losses_c": c["losses"], "bit_identical": not diffs,
                  "differences": diffs[:20]})


def _within(diffs: List[Dict[str, Any]], tol: Optional[float]) -> bool:
    worst = max((d["max_abs_diff"] for d in diffs if d["max_abs_diff"] is not None),
                default=float("inf"))
    return tol is not None and worst <= tol


def _judge(facts: Dict[str, Any], key: str, tol: Optional[float], failure: Any) -> None:
    diffs = facts[key]
    if not diffs:
        return
    if _within(diffs, tol):
        facts["within_tolerance"] = True
        return
    names = ", ".join(f"{d['tensor']} (max |diff| {d['max_abs_diff']:.3g})"
                      if d["max_abs_diff"] is not None else d["tensor"] for d in diffs[:6])
    if key == "straight_differences":
        raise failure("pilot", "the trainer is not deterministic: two straight runs from "
                      f"the same seed differ after {facts['steps']} steps: {names}",
                      facts=facts, error_type="NonDeterministic",
                      hint="draw every random number from the seeded generators (python "
                           "random, torch, numpy), avoid non-deterministic operations; set "
                           "task.tolerance only for a non-deterministic device")
    raise failure("pilot", f"resume in a new process differs from the straight run: {names}",
                  facts=facts, error_type="ResumeMismatch",
                  hint="restore every RNG state, the optimizer, the scheduler and the data "
                       "position; set task.tolerance only for a non-deterministic device")


def _proc(job: str) -> None:
    from runner.stage import StageFailure

    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # deterministic cuBLAS
    proc = subprocess.run([sys.executable, "-m", "runner.workloads.train", job], env=env,
                          capture_output=True, check=False)
    if proc.returncode != 0:
        tail = proc.stderr.decode("utf-8", errors="replace").strip().splitlines()[-1:]
        raise StageFailure("pilot", f"training process C failed ({proc.returncode}): "
                           f"{tail[0] if tail else 'no message'}", error_type="TrainingFailed")


if __name__ == "__main__":
    sys.exit(main())
