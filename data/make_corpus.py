"""Write the demo's volume corpus: COUNT documents made deterministically (the same bytes on
every machine, every time), so `make demo` has a full run to approve after its pilot.

    python data/make_corpus.py [DIR] [COUNT]      (default: data/corpus 3000)

Each document is a few sentences of one category of the example classifier (invoice,
contract, support, research); every 1000th is not valid UTF-8, which the classifier must
refuse (the demo manifest lists them in volume.inputs.expected_refusals). Files already
there with the right content are left alone; nothing else in DIR is touched.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

SENTENCES = {
    "invoice": (
        "Invoice INV-{n:05d}: amount due {a}.00 EUR, payment within 30 days.",
        "Please pay the total by bank transfer to the account on this statement.",
        "Subtotal {a}.00, VAT 20 percent, late payment interest applies after the due date.",
        "Billing reference {n}: unit price and quantity as quoted to the customer.",
    ),
    "contract": (
        "This agreement is made between the parties named below on day {d}.",
        "The tenant shall give notice of termination under clause {d} of the lease.",
        "Each party keeps the terms confidential; the agreement is governed by French law.",
        "Liability for breach is limited as set out in schedule {d}, signed by both parties.",
    ),
    "support": (
        "Hello support, I cannot log in since the password reset, ticket {n}.",
        "The app fails with an error in the browser; please help, it is urgent.",
        "Thanks for the reply; the workaround did not fix the issue, can you escalate?",
        "Sorry for the trouble: I attach a screenshot of the crash. Regards.",
    ),
    "research": (
        "Abstract. We study the effect of method {d} on model training and report results.",
        "The experiments measure the baseline against the proposed method over {d} seeds.",
        "Our analysis finds a significant improvement; limitations and future work follow.",
        "Section {d} describes the evaluation data and the benchmark methodology.",
    ),
}
CATEGORIES = tuple(SENTENCES)
BAD_EVERY = 1000  # doc-01000, doc-02000, ...: bytes that are not UTF-8


def document(n: int) -> bytes:
    """Document number ``n`` (1-based), the same on every call."""
    if n % BAD_EVERY == 0:
        return b"scan page \xb0\xff\xfe " + str(n).encode()
    rng = random.Random(n)
    category = CATEGORIES[n % len(CATEGORIES)]
    lines = [rng.choice(SENTENCES[category]).format(n=n, a=rng.randint(10, 9999),
                                                     d=rng.randint(1, 40))
             for _ in range(rng.randint(2, 6))]
    return ("\n".join(lines) + "\n").encode("utf-8")


def write_corpus(directory: Path, count: int) -> int:
    """Write documents 1..count into ``directory``; returns how many files changed."""
    directory.mkdir(parents=True, exist_ok=True)
    changed = 0
    for n in range(1, count + 1):
        path = directory / f"doc-{n:05d}.txt"
        data = document(n)
        if not path.is_file() or path.read_bytes() != data:
            path.write_bytes(data)
            changed += 1
    return changed


def main(argv: list[str]) -> int:
    directory = Path(argv[1]) if len(argv) > 1 else Path("data/corpus")
    count = int(argv[2]) if len(argv) > 2 else 3000
    changed = write_corpus(directory, count)
    print(f"{directory}: {count} documents ({changed} written, {count - changed} already there)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
