"""A torch shim for the simulated cluster, loaded only in tests (this folder first on the
node's PYTHONPATH): the real, CPU-only torch, made to show the node's simulated cards.

It loads the installed torch in its own place (``sys.modules["torch"]`` is the real
module when this import ends), then patches it:

- ``torch.version.cuda`` is set (a CUDA build, as the torch stage checks);
- ``torch.cuda``: ``is_available()`` True, ``device_count()`` the node's cards (after
  ``CUDA_VISIBLE_DEVICES``), ``get_device_properties(i)`` the name, memory, UUID, bus id
  and capability of the recorded ``nvidia-smi`` row (tests/cluster_kit/cards.py),
  ``mem_get_info`` its free/total memory; the current device per thread; synchronize,
  caches and peak statistics do nothing;
- a tensor asked for on ``cuda[:i]`` is made on the CPU, each dimension cut to
  ``SIM_MAX_DIM`` (so the compute stage's matmuls are small CPU matmuls and the
  interconnect's buffers small: their figures are not a card's), and marked: a matmul
  with a marked tensor takes ``PREFLIGHT_SIM_MATMUL_S`` (default 1 ms), the card's
  simulated time: the real small matmul, then a sleep until the thread's card clock says
  it is done (``_spend``: a matmul that overran is made up by the next ones, however far
  behind; the clock starts again when the thread places a fresh tensor on a card, where a
  timed loop begins), so a loop of them runs at the card's rate on average and every card
  of a node shows the same speed however busy the CPU is (a card is judged against its
  peers). A deficit forgiven past 100 ms, as before, still read one card of eight at 0.8x
  its peers once in a clean clone's make test (load 9 on 2 cores): the compute stage's
  8192 x 8192 bf16 figure reads about 1,100 TFLOP/s, above the H100's floor of 500. A
  sleep added after each matmul, as before, read 453-482 on a loaded 2-core machine (7 of
  8 cards below the floor), and one padded to 1 ms read 720 against its peers' 915 (0.79:
  slow); each such card was left out of the volume. Torch keeps one intra-op thread (8
  card threads' small matmuls need no more; with two, a load of 16 read 630-675);
- ``torch.distributed``: the ``nccl`` backend is gloo; an all-reduce on the cards takes
  ``PREFLIGHT_SIM_ALLREDUCE_S`` (default 20 ms), the link's simulated time, by the same
  clock: the real gloo all-reduce, then a sleep until it is due. Every pair of cards then
  measures the same time unless the CPU holds a rank back for long (a 2-core machine
  running 4 nodes' card proofs at once held ranks back by about 20 ms an all-reduce; with
  2 ms added after each, the interconnect stage's pair rounds blamed a card in every slow
  pair now and then, and the volume lost it).

Nothing of Preflight is changed: the runner's stages run as they are on a GPU node.
"""

import importlib.machinery
import importlib.util
import os
import sys
import threading
import time

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_path = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != _HERE]
_spec = importlib.machinery.PathFinder.find_spec("torch", _path)
if _spec is None or _spec.loader is None:
    raise ImportError("the torch shim found no installed torch to wrap")
_real = importlib.util.module_from_spec(_spec)
sys.modules["torch"] = _real
_spec.loader.exec_module(_real)

_cards_spec = importlib.util.spec_from_file_location(
    "_preflight_sim_cards", os.path.join(os.path.dirname(_HERE), "cards.py"))
assert _cards_spec is not None and _cards_spec.loader is not None
_cards_mod = importlib.util.module_from_spec(_cards_spec)
_cards_spec.loader.exec_module(_cards_mod)

SIM_MAX_DIM = int(os.environ.get("PREFLIGHT_SIM_MAX_DIM", "128"))
SIM_MATMUL_S = float(os.environ.get("PREFLIGHT_SIM_MATMUL_S", "0.001"))
SIM_ALLREDUCE_S = float(os.environ.get("PREFLIGHT_SIM_ALLREDUCE_S", "0.02"))
# How far behind its all-reduce clock a rank may be and still make it up (further: idle
# between pair rounds). 25 ms was too short under make test's four workers (load 9 on 2
# cores). A card's matmuls forgive no deficit (their clock starts at a fresh tensor).
CATCH_UP_S = 0.1
_ALL = _cards_mod.cards()
# One intra-op thread: the simulated cards' small CPU matmuls, 8 threads at once, do not
# need more, and more oversubscribe a loaded machine (the runner's workers set their own).
_real.set_num_threads(1)
_visible_env = os.environ.get("CUDA_VISIBLE_DEVICES")
if _visible_env is None:
    _VISIBLE = list(range(len(_ALL)))
else:
    _VISIBLE = [int(c) for c in _visible_env.split(",") if c.strip().isdigit()
                and int(c) < len(_ALL)]
_local = threading.local()


class _Props:
    def __init__(self, row):
        self.name = row["name"]
        self.total_memory = int(float(row["memory_mib"])) << 20
        self.multi_processor_count = 132
        self.uuid = row["uuid"]
        domain, bus, rest = row["bus_id"].split(":")
        self.pci_domain_id = int(domain, 16)
        self.pci_bus_id = int(bus, 16)
        self.pci_device_id = int(rest.split(".")[0], 16)
        major, minor = row["capability"].split(".")
        self.major, self.minor = int(major), int(minor)
        self.gcnArchName = row["name"]  # a CUDA build carries it too (torch 2.11, a real H200)

    def __repr__(self):
        return f"_CudaDeviceProperties(name='{self.name}', simulated)"


def _row(index=None):
    index = _current() if index is None else _index(index)
    return _ALL[_VISIBLE[index]]


def _index(device):
    if isinstance(device, int):
        return device
    text = str(device)
    return int(text.split(":")[1]) if ":" in text else _current()


def _current():
    return getattr(_local, "device", 0)


def _set_device(device):
    _local.device = _index(device)


def _mem_get_info(device=None):
    row = _row(device)
    return int(float(row["memory_free_mib"])) << 20, int(float(row["memory_mib"])) << 20


def _zero(*_a, **_k):
    return 0


def _nothing(*_a, **_k):
    return None


_cuda = _real.cuda
for _name, _value in {
        "is_available": lambda: bool(_VISIBLE), "device_count": lambda: len(_VISIBLE),
        "get_device_properties": lambda d=None: _Props(_row(d)),
        "get_device_name": lambda d=None: _row(d)["name"],
        "get_device_capability": lambda d=None: (_Props(_row(d)).major, _Props(_row(d)).minor),
        "get_arch_list": lambda: ["sm_80", "sm_90"], "current_device": _current,
        "set_device": _set_device, "synchronize": _nothing, "empty_cache": _nothing,
        "reset_peak_memory_stats": _nothing, "mem_get_info": _mem_get_info,
        "max_memory_allocated": _zero, "max_memory_reserved": _zero,
        "memory_allocated": _zero, "memory_reserved": _zero, "is_initialized": lambda: True,
}.items():
    setattr(_cuda, _name, _value)
_real.version.cuda = _cards_mod.CUDA_VERSION


def _is_cuda(device):
    if device is None:
        return False
    return str(getattr(device, "type", device)).startswith("cuda")


def _on_cpu(device):
    return "cpu" if _is_cuda(device) else device


def _small(size):
    return tuple(min(int(n), SIM_MAX_DIM) for n in size)


def _placed(tensor):
    """A fresh tensor on a simulated card: the thread's card clock starts again (a timed
    loop begins with its operands; what the thread waited before is no card's time)."""
    _local.__dict__.pop("dues", None)
    return _mark(tensor)


def _mark(tensor):
    """A tensor on a simulated card."""
    try:
        tensor._sim_cuda = True
    except (AttributeError, RuntimeError):
        pass
    return tensor


def _marked(tensor):
    return getattr(tensor, "_sim_cuda", False)


def _factory(real):
    def make(*size, **kwargs):
        if not _is_cuda(kwargs.get("device")):
            return real(*size, **kwargs)
        kwargs["device"] = "cpu"
        if len(size) == 1 and isinstance(size[0], (tuple, list)):
            return _placed(real(_small(size[0]), **kwargs))
        return _placed(real(*_small(size), **kwargs))
    return make


def _full(size, fill, **kwargs):
    if not _is_cuda(kwargs.get("device")):
        return _real_full(size, fill, **kwargs)
    kwargs["device"] = "cpu"
    return _placed(_real_full(_small(size), fill, **kwargs))


_real_full = _real.full
for _name in ("randn", "rand", "zeros", "ones", "empty"):
    setattr(_real, _name, _factory(getattr(_real, _name)))
_real.full = _full

_Tensor = _real.Tensor
_real_to = _Tensor.to


def _to(self, *args, **kwargs):
    devices = [a for a in args if isinstance(a, (str, _real.device))]
    devices += [kwargs["device"]] if "device" in kwargs else []
    to_card = any(_is_cuda(d) for d in devices)
    to_cpu = any(str(getattr(d, "type", d)) == "cpu" for d in devices)
    args = tuple(_on_cpu(a) if isinstance(a, (str, _real.device)) else a for a in args)
    if "device" in kwargs:
        kwargs["device"] = _on_cpu(kwargs["device"])
    out = _real_to(self, *args, **kwargs)
    if out is not self and to_card and not _marked(self):
        _placed(out)
    elif out is not self and (to_card or (_marked(self) and not to_cpu)):
        _mark(out)
    return out


_real_matmul = _Tensor.__matmul__


def _spend(what, seconds, start, catch_up=None):
    """Sleep until this thread's ``what`` (a card's matmul, a link's all-reduce) is done:
    ``seconds`` after the previous one was due, or after ``start`` when the clock started
    again (a fresh tensor on a card) or, given ``catch_up``, when the thread is further
    behind than that (idle meanwhile). A call that overran (the CPU held the thread back, a
    sleep woke late) is made up by the next ones, so a loop of them runs at the simulated
    rate on average, as a card would, however busy the CPU is."""
    dues = _local.__dict__.setdefault("dues", {})
    before = dues.get(what)
    behind = start - before if before is not None else None
    forgiven = behind is None or (catch_up is not None and behind >= catch_up)
    due = (start if forgiven else before) + seconds
    dues[what] = due
    left = due - time.perf_counter()
    if left > 0:
        time.sleep(left)


_HALF = (_real.bfloat16, _real.float16)


def _matmul(self, other):
    start = time.perf_counter()
    if (_marked(self) or _marked(other)) and self.dtype in _HALF \
            and getattr(other, "dtype", None) == self.dtype:
        # A CPU's bf16/fp16 matmul of 128 x 128 takes 1.2-1.5 ms on one idle core (5 ms on a
        # loaded one), more than the card's simulated 1 ms, so the cards read 160-215 TFLOP/s
        # and all failed the floor. Computed in fp32 (0.1 ms) and rounded to the dtype: the
        # same values a card's half-precision matmul, accumulating in fp32, gives.
        out = _real_matmul(self.float(), other.float()).to(self.dtype)
    else:
        out = _real_matmul(self, other)
    if _marked(self) or _marked(other):
        _spend("matmul", SIM_MATMUL_S, start)  # the card's simulated time
        _mark(out)
    return out


_Tensor.to = _to
_Tensor.__matmul__ = _matmul
_Tensor.cuda = lambda self, *a, **k: self if _marked(self) else _placed(self)

try:
    import torch.distributed as _dist

    _real_init = _dist.init_process_group

    def _init_process_group(backend=None, *args, **kwargs):
        if backend in ("nccl", "rccl"):
            backend = "gloo"
        return _real_init(backend, *args, **kwargs)

    _real_all_reduce = _dist.all_reduce

    def _all_reduce(tensor, *args, **kwargs):
        start = time.perf_counter()
        out = _real_all_reduce(tensor, *args, **kwargs)
        if _marked(tensor):
            # the link's simulated time; a rank idle between pair rounds is forgiven that
            _spend("all_reduce", SIM_ALLREDUCE_S, start, max(2 * SIM_ALLREDUCE_S, CATCH_UP_S))
        return out

    _dist.init_process_group = _init_process_group
    _dist.all_reduce = _all_reduce
except ImportError:  # a torch without distributed: the interconnect stage says so
    pass
