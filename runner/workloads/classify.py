"""The example workload: classify documents with a tiny deterministic torch model.

Each document becomes a hashed bag-of-words vector (words hashed with CRC-32 into
``DIM`` buckets, log-scaled counts); each category has a prototype vector built the same
way from the keyword lists below. The category is the prototype with the highest cosine
similarity. No download, no randomness: the same text gives the same answer on any
machine. Runs on CUDA when the context's device says so, on CPU otherwise.

Inputs that are unreadable, empty, not UTF-8, binary, or that match no category at all
are refused with a reason; accepted documents get one JSON output each, returned for the
runner to write before it records the item as done: ``outputs/<id>.json`` in a pilot, a
line of the batch's shard on a volume's worker (runner/outputs.py: one fsync per batch,
not one per document).
"""

from __future__ import annotations

import re
import zlib
from typing import Any, Dict, List, Sequence

from runner.inputs import Item
from runner.workloads import WorkloadContext

DIM = 4096
WORD = re.compile(r"[a-z]+")
MAX_BYTES = 1 << 20

KEYWORDS: Dict[str, Sequence[str]] = {
    "invoice": (
        "invoice", "invoices", "amount", "due", "payment", "paid", "pay", "total",
        "subtotal", "vat", "tax", "bill", "billing", "qty", "unit", "price", "eur", "gbp",
        "usd", "bank", "transfer", "iban", "statement", "account", "late", "interest",
        "net", "days", "fee", "quote", "reference", "customer", "rental", "charges",
    ),
    "contract": (
        "agreement", "contract", "lease", "parties", "party", "clause", "clauses", "term",
        "terms", "shall", "hereby", "obligations", "liability", "liable", "confidential",
        "confidentiality", "governed", "governing", "law", "laws", "jurisdiction", "courts",
        "terminate", "termination", "breach", "signed", "witness", "landlord", "tenant",
        "provider", "client", "consent", "notice", "indemnify", "disclosure", "schedule",
    ),
    "support": (
        "support", "ticket", "help", "desk", "issue", "problem", "error", "cannot", "fails",
        "failed", "login", "log", "password", "reset", "account", "please", "thanks",
        "hello", "hi", "regards", "escalate", "workaround", "reproduce", "browser",
        "troubleshooting", "priority", "customer", "urgent", "access", "bug", "crash",
        "screenshot", "reply", "sorry", "trouble",
    ),
    "research": (
        "abstract", "research", "study", "studies", "hypothesis", "experiment",
        "experiments", "results", "method", "methodology", "methods", "evaluation",
        "evaluate", "benchmark", "benchmarks", "measured", "measure", "baseline",
        "significant", "significance", "ablation", "paper", "references", "analysis",
        "data", "propose", "report", "section", "seeds", "median", "model", "models",
        "limitations", "future", "work", "reproduce", "appendix", "training", "learning",
    ),
}


def handle(items: List[Item], ctx: WorkloadContext) -> List[Dict[str, Any]]:
    """Classify a batch; one result per item, in order."""
    import torch

    device = torch.device(ctx.device if ctx.device == "cuda" and torch.cuda.is_available()
                          else "cpu")
    categories = list(ctx.spec.task.categories) or list(KEYWORDS)
    protos = _prototypes(categories, device)
    results: List[Dict[str, Any]] = []
    texts: List[str] = []
    readable: List[Item] = []
    for item in items:
        text, reason = read_text(item.path)
        if reason:
            results.append({"id": item.id, "status": "refused", "reason": reason})
        else:
            readable.append(item)
            texts.append(text)
            results.append({"id": item.id})
    if readable:
        feats = torch.stack([features(t) for t in texts]).to(device)
        sims = _cosine(feats, protos)
        by_id = {it.id: (it, t, sims[i]) for i, (it, t) in enumerate(zip(readable, texts))}
        for res in results:
            if res["id"] in by_id:
                res.update(_decide(categories, *by_id[res["id"]]))
    return results


def _decide(categories: List[str], item: Item, text: str,
            sims: Any) -> Dict[str, Any]:
    scores = {c: round(float(s), 6) for c, s in zip(categories, sims.tolist())}
    best = max(categories, key=lambda c: (scores[c], -categories.index(c)))
    if scores[best] <= 0.0:
        return {"status": "refused",
                "reason": "no recognisable content: no word of any category's vocabulary"}
    record = {"id": item.id, "category": best, "scores": scores, "chars": len(text),
              "words": len(WORD.findall(text.lower()))}
    return {"status": "accepted", "category": best, "output": record}


def read_text(path: str) -> tuple[str, str]:
    """The text of a file, or ("", reason) when it must be refused."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        return "", f"unreadable: {exc.strerror or exc}"
    if len(data) > MAX_BYTES:
        return "", f"too large: over {MAX_BYTES} bytes"
    if not data.strip():
        return "", "empty input"
    if b"\x00" in data:
        return "", "not text: contains NUL bytes"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return "", f"not valid UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start}"
    return text, ""


def features(text: str) -> Any:
    """Hashed bag-of-words: log(1 + count) per CRC-32 bucket."""
    import torch

    vec = torch.zeros(DIM, dtype=torch.float32)
    for word in WORD.findall(text.lower()):
        vec[zlib.crc32(word.encode("ascii")) % DIM] += 1.0
    return torch.log1p(vec)


def _prototypes(categories: List[str], device: Any) -> Any:
    import torch

    rows = [features(" ".join(KEYWORDS.get(c, (c,)))) for c in categories]
    return torch.stack(rows).to(device)


def _cosine(a: Any, b: Any) -> Any:
    import torch

    an = torch.nn.functional.normalize(a, dim=1)
    bn = torch.nn.functional.normalize(b, dim=1)
    return an @ bn.T
