"""Serving profiles: what one model folder costs when it answers requests (docs/report.md, "Serving profiles").

A *request* is a text in and its class probabilities out: tokenisation (cut at the model's ``max_length``), the
forward pass and the softmax are timed together, as a server pays them. :func:`serving_profile` measures one folder,
a PyTorch teacher or student (run by torch, the tokenizer from transformers) or an exported ONNX folder (run by ONNX
Runtime, the tokenizer from the `tokenizers` library, without importing torch or transformers):

- **latency at batch 1**: each text a request of its own, after ``warmup`` untimed requests; median, 95th
  percentile and mean over the texts, and the median CPU time of the process per request (every thread's), which
  other work on a shared machine does not lengthen: with one thread, what the latency is on a machine left alone;
- **throughput** at ``batch_size``: the texts in batches of that size, in the order given, each padded to its
  longest row, after one untimed batch; texts per second over the whole pass;
- **peak memory**: the process's peak resident set (``VmHWM``), which counts the interpreter and every library it
  imported, and the resident set before the model was loaded, so the difference is the model's share. A peak is
  a high-water mark of the whole process: measure each model in a process of its own
  (:func:`profile_in_subprocess`, which the benchmark and a workflow job of its own both give), never two models
  in one;
- **size**: the weights file and the whole folder on disk;
- the threads, the device and the runtime's version.

Nothing here reads kdpipe's batching: a request is what a user's server does with the folder.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np

from kdpipe.core.checksums import verify_folder
from kdpipe.core.store import KdpipeError, read_json, write_json
from kdpipe.models.onnx_runtime import OnnxRunner, is_onnx_folder, read_spec, softmax

REQUEST = (
    "one request: text in, class probabilities out; tokenisation (cut at max_length), the forward pass and the "
    "softmax timed together"
)
MEMORY = (
    "peak resident set of the process (VmHWM: the interpreter, the libraries it imported, the model and its "
    "activations); rss_before_load_mb: the resident set once the libraries were imported, before the model was "
    "loaded; model_mb: the difference"
)
WEIGHTS = ("model.onnx", "model.safetensors")


def rss_mb() -> float:
    """The process's resident set now, in MB of 10^6 bytes (from /proc; the peak where /proc is missing)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 1e6
    except (OSError, ValueError, IndexError):
        return peak_rss_mb()


def peak_rss_mb() -> float:
    """The process's peak resident set so far, in MB of 10^6 bytes: ``VmHWM`` of /proc/self/status, the high-water
    mark of this program's address space. Not ``ru_maxrss`` where /proc has it: that one survives ``exec``, so a
    process started by a large parent (forked, then exec'd) reports the parent's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / 1e6
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # (KiB on Linux, bytes on macOS)
    return peak / 1e6 if sys.platform == "darwin" else peak * 1024 / 1e6


def cpu_name() -> str:
    """The CPU's model name, from /proc/cpuinfo where there is one."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class _TorchServer:
    """A PyTorch model folder answering requests: transformers' tokenizer, ``load_trained``'s model, softmax."""

    def __init__(self, folder: Path, threads: int, device: str):
        import torch

        from kdpipe.core.device import pick_device
        from kdpipe.models.loading import load_tokenizer, load_trained

        torch.set_num_threads(threads)
        self.torch = torch
        self.device = pick_device(device)
        manifest = read_json(folder / "manifest.json") if (folder / "manifest.json").is_file() else {}
        self.tokenizer = load_tokenizer(str(folder))
        self.max_length = int((manifest.get("config") or {}).get("max_length") or self.tokenizer.model_max_length)
        self.model = load_trained(folder).to(self.device).eval()
        self.separate_pairs = getattr(self.model, "separate_pairs", False)
        self.runtime = {"torch": torch.__version__}
        if self.device.type == "cuda":
            self.where = torch.cuda.get_device_name(self.device)
        else:
            self.where = f"CPU ({cpu_name()}), PyTorch"

    def __call__(self, texts: list[str]) -> np.ndarray:
        torch = self.torch
        with torch.inference_mode():
            batch = self.tokenizer(
                texts, truncation=True, max_length=self.max_length, padding=True, return_tensors="pt"
            )
            inputs = {k: v.to(self.device) for k, v in batch.items()}
            probs = torch.softmax(self.model(**inputs).logits.float(), -1).cpu().numpy()
        return probs


class _OnnxServer:
    """An exported folder answering requests (:class:`kdpipe.models.onnx_runtime.OnnxRunner`)."""

    def __init__(self, folder: Path, threads: int):
        import onnxruntime

        verify_folder(folder)  # (as every reader of an artifact does: a damaged or swapped graph is refused)
        self.runner = OnnxRunner(folder, threads=threads)
        self.max_length = self.runner.max_length
        self.runtime = {"onnxruntime": onnxruntime.__version__}
        self.where = f"CPU ({cpu_name()}), ONNX Runtime {self.runner.spec.get('precision', 'fp32')}"

    def __call__(self, texts: list[str]) -> np.ndarray:
        return softmax(self.runner.run(self.runner.encode(texts))["logits"])


def _sizes(folder: Path) -> dict:
    files = [p for p in folder.rglob("*") if p.is_file()]
    weights = sum(p.stat().st_size for p in files if p.name in WEIGHTS)
    return {"weights_mb": weights / 1e6, "folder_mb": sum(p.stat().st_size for p in files) / 1e6}


def _import_runtime(onnx: bool) -> None:
    """Import what serving the folder needs before the resident set is read, so that ``rss_before_load_mb`` holds
    the libraries and ``model_mb`` the model: ONNX Runtime and tokenizers, or torch and transformers (through
    kdpipe's loader)."""
    if onnx:
        import onnxruntime  # noqa: F401
        import tokenizers  # noqa: F401
    else:
        import torch  # noqa: F401

        import kdpipe.models.loading  # noqa: F401


def serving_profile(
    model_dir: str | Path,
    texts: list[str],
    *,
    name: str | None = None,
    batch_size: int = 32,
    warmup: int = 10,
    threads: int = 1,
    device: str = "cpu",
) -> dict:
    """The serving profile of the model folder ``model_dir`` (a trained teacher or student, or an exported ONNX
    folder) over ``texts``, measured in this process (see the module's docstring for each field). ``threads``:
    torch's or ONNX Runtime's intra-op threads; ``device``: where a PyTorch model runs (an ONNX folder runs on the
    CPU)."""
    folder = Path(model_dir)
    # the fast tokenizers' own thread pool would add cores to a batch beyond ``threads``
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if len(texts) <= warmup:
        raise KdpipeError(f"serving profile of {folder}: {len(texts)} texts, but {warmup} go to the warm-up")
    onnx = is_onnx_folder(folder)
    _import_runtime(onnx)
    before = rss_mb()
    started = time.perf_counter()
    server = _OnnxServer(folder, threads) if onnx else _TorchServer(folder, threads, device)
    load_s = time.perf_counter() - started
    for text in texts[:warmup]:
        server([text])
    latencies, cpu = [], []
    for text in texts[warmup:]:
        start, start_cpu = time.perf_counter(), time.process_time()
        server([text])
        latencies.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    ms = 1000 * np.asarray(latencies)
    server(texts[:batch_size])  # (one untimed batch: the first at this size allocates)
    start = time.perf_counter()
    for i in range(0, len(texts), batch_size):
        server(texts[i : i + batch_size])
    throughput_s = time.perf_counter() - start
    peak = peak_rss_mb()
    manifest = read_json(folder / "manifest.json") if (folder / "manifest.json").is_file() else {}
    spec = read_spec(folder) if onnx else {}
    return {
        "model": name or folder.name,
        "folder": str(folder),
        "kind": manifest.get("kind"),
        "format": "onnx" if onnx else "pytorch",
        "precision": spec.get("precision", "fp32") if onnx else "fp32",
        "source": spec.get("source") if onnx else None,
        "request": REQUEST,
        "max_length": server.max_length,
        "latency_ms": {
            "batch_size": 1,
            "requests": len(ms),
            "warmup": warmup,
            "median": float(np.median(ms)),
            "p95": float(np.percentile(ms, 95)),
            "mean": float(ms.mean()),
            "cpu_median": float(np.median(1000 * np.asarray(cpu))),
        },
        "throughput": {"batch_size": batch_size, "texts": len(texts), "texts_per_s": len(texts) / throughput_s},
        "memory": {
            "peak_rss_mb": peak,
            "rss_before_load_mb": before,
            "model_mb": peak - before,
            "method": MEMORY,
        },
        "size": _sizes(folder),
        "load_s": load_s,
        "threads": threads,
        "device": server.where,
        "runtime": server.runtime,
        "date": date.today().isoformat(),
    }


def write_profile(profile: dict, out_json: str | Path) -> None:
    """A profile as JSON, written atomically."""
    write_json(out_json, profile)


def profile_in_subprocess(
    model_dir: str | Path,
    texts: list[str],
    *,
    name: str | None = None,
    batch_size: int = 32,
    warmup: int = 10,
    threads: int = 1,
    device: str = "cpu",
    nice: int = 0,
) -> dict:
    """:func:`serving_profile` in a fresh Python process (``OMP_NUM_THREADS`` = ``threads``, raised by ``nice``),
    so that its peak memory is this model's alone and no library another model needed is loaded."""
    import kdpipe

    options = {"name": name, "batch_size": batch_size, "warmup": warmup, "threads": threads, "device": device}
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.json"
        out = Path(tmp) / "profile.json"
        job.write_text(json.dumps({"model_dir": str(model_dir), "texts": list(texts), "options": options}))
        code = (
            "import json, sys; from kdpipe.models.serving import serving_profile, write_profile; "
            "job = json.load(open(sys.argv[1])); "
            "write_profile(serving_profile(job['model_dir'], job['texts'], **job['options']), sys.argv[2])"
        )
        root = str(Path(kdpipe.__file__).resolve().parents[1])
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
        command = [sys.executable, "-c", code, str(job), str(out)]
        if nice:
            command = ["nice", "-n", str(nice), *command]
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise KdpipeError(f"serving profile of {model_dir}: its process failed ({tail})")
        return json.loads(out.read_text())
