"""The scripts the doctor runs on the hosts: their source, argv, and how they are run
(in parallel, with a deadline) and read back.

Each script is a self-contained Python source string run as ``python -c SCRIPT
ARGS...`` through a :class:`~dmlctl.transport.base.Transport`. They need nothing but
the standard library of Python 3.8 or newer (the probe also imports torch and the
packages it is asked about, when present), so a host with an old or bare interpreter
still answers and the doctor can say what is missing. Tests build scripted results with the same
``*_argv`` helpers the doctor uses.

* :data:`PROBE` prints one JSON object (keys: :data:`PROBE_KEYS`) on one line;
  :func:`read_probe` reads it back.
* :data:`LISTENER` listens on a TCP port (at the address the other hosts connect to),
  prints ``ready`` and greets each connection with :data:`GREETING` until its lifetime
  ends or its stdin closes (so a dropped SSH channel never leaves the port taken).
* :data:`CONNECT` connects to ``address:port``, expects :data:`GREETING`, prints
  ``ok`` and exits 0, or prints the reason and exits 1.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dmlctl.transport.base import Process, Result, Transport

if TYPE_CHECKING:
    from dmlctl.spec.models import ResolvedHost

PROBE_KEYS = (
    "python",
    "platform",
    "torch",
    "torch_error",
    "torch_reused",
    "cuda",
    "gpus",
    "cuda_version",
    "nccl",
    "driver",
    "packages",
    "workdir",
    "disk_free",
    "disk_error",
    "port",
    "port_free",
    "port_error",
    "time",
    "elapsed",
)
"""Every key of the probe's JSON object (values are null when not applicable).
``packages`` maps each import name asked about to ``{"dist", "version", "error"}``:
``error`` is null or one short line (why the import failed), ``version`` the
installed distribution's version (else the module's ``__version__``, else null).

``torch_reused``: torch's facts (version, CUDA, GPUs, CUDA and NCCL versions) come from
an earlier probe on the host, with any workdir, because nothing they depend on changed:
the interpreter, torch's ``__init__.py`` (path, mtime, size), ``CUDA_VISIBLE_DEVICES``,
the driver's GPUs and version. After an import that succeeded they are kept in the
user's cache, one file per such key (``$XDG_CACHE_HOME``, else ``~/.cache``:
``dmlctl/probe-torch-<digest>.json``; a home shared by several machines holds each
one's). Only a probe asked to (``reuse``: the launch's preflight, which runs at every
launch) reuses them; ``dmlctl doctor`` always imports torch (about 1 s of CPU)."""

# Python >= 3.8, standard library only: no annotations, no walrus, no match. The
# answer's time is taken last, after the slow imports, so the controller can bound
# when it was produced (see ``elapsed`` and read_probe); os._exit skips torch's slow
# teardown, which would only widen that window.
PROBE = r"""
import importlib, json, os, platform, shutil, socket, sys, time
t0 = time.monotonic()
out = {"python": "%d.%d.%d" % sys.version_info[:3], "platform": platform.platform(),
       "torch": None, "torch_error": None, "cuda": False, "gpus": 0,
       "cuda_version": None, "nccl": None, "driver": None,
       "packages": {}, "workdir": None, "disk_free": None, "disk_error": None,
       "port": None, "port_free": None, "port_error": None}
def err(e):
    return ("%s: %s" % (type(e).__name__, e))[:500]
def short(e):  # an import error's own message says it all; others need their type
    text = str(e) if isinstance(e, ImportError) else "%s: %s" % (type(e).__name__, e)
    lines = text.strip().splitlines()
    return (lines[0] if lines else type(e).__name__)[:200]
try:  # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  ..."
    with open("/proc/driver/nvidia/version") as f:
        driver_line = f.readline()
except Exception:
    driver_line = None
out["driver"] = next((w for w in (driver_line or "").split() if w[:1].isdigit() and "." in w),
                     None)
TORCH_FACTS = ("torch", "cuda", "gpus", "cuda_version", "nccl")
def torch_key():  # what a torch import's answer depends on; None: cannot tell
    try:
        import importlib.util
        spec = importlib.util.find_spec("torch")
        st = os.stat(spec.origin)
        try:
            gpus = sorted(os.listdir("/proc/driver/nvidia/gpus"))
        except OSError:
            gpus = None
        return [os.path.realpath(sys.executable), spec.origin, st.st_mtime_ns, st.st_size,
                os.environ.get("CUDA_VISIBLE_DEVICES"), gpus, driver_line]
    except Exception:
        return None
def cache_path(key):  # one file per key in the user's cache: any workdir, any project
    import hashlib
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]
    return os.path.join(base, "dmlctl", "probe-torch-%s.json" % digest)
key = torch_key() if len(sys.argv) > 4 and sys.argv[4] == "reuse" else None
cache = cache_path(key) if key is not None else None
cached = None
if key is not None:
    try:
        with open(cache) as f:
            cached = json.load(f)
        if cached.get("key") != key:
            cached = None
    except Exception:
        cached = None
out["torch_reused"] = cached is not None
if cached is not None:
    for k in TORCH_FACTS:
        out[k] = cached[k]
else:
    try:
        import torch
        out["torch"] = str(torch.__version__)
        try:
            out["cuda"] = bool(torch.cuda.is_available())
            out["gpus"] = int(torch.cuda.device_count())
            out["cuda_version"] = torch.version.cuda
            if out["gpus"]:
                import torch.cuda.nccl
                out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as e:
            out["torch_error"] = "cuda: " + err(e)
    except BaseException as e:
        out["torch_error"] = err(e)
    if key is not None and out["torch_error"] is None:
        try:
            os.makedirs(os.path.dirname(cache), mode=0o700, exist_ok=True)
            tmp = "%s.%d.tmp" % (cache, os.getpid())  # probes of other hosts may write too
            with open(tmp, "w") as f:
                json.dump(dict({"key": key}, **{k: out[k] for k in TORCH_FACTS}), f)
            os.replace(tmp, cache)
        except Exception:
            pass
try:
    from importlib import metadata
except ImportError:  # Python < 3.8: versions from __version__ only
    metadata = None
for pair in (sys.argv[3] if len(sys.argv) > 3 else "").split(","):
    if not pair:
        continue
    name, _, dist = pair.partition("=")
    found = out["packages"][name] = {"dist": dist or name, "version": None, "error": None}
    if name == "torch" and cached is not None:  # imported by an earlier probe, unchanged
        found["version"] = cached["torch"]
        continue
    try:
        mod = importlib.import_module(name)
    except BaseException as e:
        found["error"] = short(e)
        continue
    try:
        found["version"] = str(metadata.version(found["dist"]))
    except Exception:
        v = getattr(mod, "__version__", None)
        found["version"] = None if v is None else str(v)
try:
    wd = os.path.abspath(os.path.expanduser(sys.argv[1]))
    out["workdir"] = wd
    os.makedirs(wd, exist_ok=True)
    out["disk_free"] = int(shutil.disk_usage(wd).free)
except Exception as e:
    out["disk_error"] = err(e)
if len(sys.argv) > 2 and sys.argv[2]:
    out["port"] = int(sys.argv[2])
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", out["port"]))
        out["port_free"] = True
    except Exception as e:
        out["port_free"] = False
        out["port_error"] = err(e)
    finally:
        s.close()
out["elapsed"] = time.monotonic() - t0
out["time"] = time.time()
sys.stdout.write(json.dumps(out) + "\n")
sys.stdout.flush()
os._exit(0)
"""

GREETING = "dmlctl-rendezvous"
"""What the listener sends each connection: proves the connect probe reached *it*."""

LISTENER = r"""
import os, socket, sys, threading, time
def eof():  # the controller closed stdin, or its connection died: stop listening
    sys.stdin.read()
    os._exit(0)
threading.Thread(target=eof, daemon=True).start()
port, life = int(sys.argv[1]), float(sys.argv[2])
where = sys.argv[3] if len(sys.argv) > 3 else ""
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    try:  # where the other hosts connect; every interface only if that is no local one
        s.bind((where, port))
    except OSError:
        s.bind(("", port))
    s.listen(64)
except Exception as e:
    sys.stderr.write("cannot listen on port %d: %s\n" % (port, e))
    sys.exit(1)
sys.stdout.write("ready\n")
sys.stdout.flush()
end = time.monotonic() + life
while True:
    left = end - time.monotonic()
    if left <= 0:
        break
    s.settimeout(min(left, 1.0))
    try:
        c, _ = s.accept()
    except socket.timeout:
        continue
    try:
        c.sendall(b"GREETING\n")
    except Exception:
        pass
    c.close()
s.close()
""".replace("GREETING", GREETING)

CONNECT = r"""
import socket, sys
addr, port, t = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
try:
    c = socket.create_connection((addr, port), timeout=t)
    data = c.recv(64)
    c.close()
except Exception as e:
    print("cannot connect to %s:%d: %s" % (addr, port, e))
    sys.exit(1)
if not data.startswith(b"GREETING"):
    print("%s:%d answered, but not the dmlctl listener: %r" % (addr, port, data[:40]))
    sys.exit(1)
print("ok")
""".replace("GREETING", GREETING)


def probe_argv(
    host: ResolvedHost,
    port: int | None,
    packages: Sequence[tuple[str, str]] = (),
    *,
    reuse_torch: bool = False,
) -> list[str]:
    """``[python, -c, PROBE, workdir, port or "", "mod=dist,…"(, "reuse")]``: probe
    ``host`` (and ``port``), importing each ``(import name, distribution)`` of
    ``packages``. ``reuse_torch``: take torch's facts from the host's last probe when
    nothing they depend on changed (see :data:`PROBE_KEYS`), instead of importing it."""
    asked = ",".join(f"{module}={dist}" for module, dist in packages)
    argv = [host.python, "-c", PROBE, host.workdir, "" if port is None else str(port), asked]
    return [*argv, "reuse"] if reuse_torch else argv


def listener_argv(host: ResolvedHost, port: int, lifetime: float, address: str = "") -> list[str]:
    """Listen on ``address:port`` of ``host`` (the address the other hosts connect to;
    every interface only where that is no address of ``host``) for at most
    ``lifetime`` seconds."""
    return [host.python, "-c", LISTENER, str(port), f"{lifetime:g}", address]


def connect_argv(host: ResolvedHost, address: str, port: int, timeout: float) -> list[str]:
    """From ``host``, connect to the listener at ``address:port`` within ``timeout`` s."""
    return [host.python, "-c", CONNECT, address, str(port), f"{timeout:g}"]


def read_probe(stdout: str, sent: float, received: float) -> dict[str, Any] | None:
    """The probe's JSON object from its ``stdout`` (the last line that parses; lines a
    shell profile printed are ignored), or None if there is none.

    ``sent``/``received`` are this machine's clock just before the request and just
    after the reply. Adds ``clock_skew`` (remote time minus the midpoint of the window
    in which the answer can have been produced: after the probe's own ``elapsed`` run
    time, before the reply arrived) and ``clock_uncertainty`` (half that window).
    """
    for line in reversed(stdout.splitlines()):
        try:
            facts = json.loads(line) if line.startswith("{") else None
        except ValueError:
            continue
        if isinstance(facts, dict) and isinstance(facts.get("time"), (int, float)):
            elapsed = min(max(0.0, float(facts.get("elapsed") or 0)), received - sent)
            facts["clock_skew"] = float(facts["time"]) - (sent + elapsed + received) / 2
            facts["clock_uncertainty"] = (received - sent - elapsed) / 2
            return facts
    return None


@dataclass(frozen=True)
class Answer:
    """A finished command and this machine's clock just before and just after it."""

    result: Result
    sent: float
    received: float


def _ask(t: Transport, argv: Sequence[str], timeout: float, clock: Callable[[], float]) -> Answer:
    sent = clock()
    result = t.run(argv, timeout=timeout)
    return Answer(result, sent, clock())


def fan_out(
    calls: Mapping[str, tuple[Transport, Sequence[str]]],
    *,
    timeout: float,
    clock: Callable[[], float],
) -> dict[str, Answer | str]:
    """Run each ``(transport, argv)`` (by host name) in its own thread, all at once, and
    wait at most ``timeout`` s in all (each ``run`` gets ``timeout`` too).

    Returns every host's :class:`Answer`, or a one-line reason where there is none
    (``timed out after …`` or the exception a transport raised). Never waits on a
    call past the deadline: its thread is left to end (transports bound it by their
    own timeout) and its result is dropped.
    """
    pool = cf.ThreadPoolExecutor(max_workers=max(1, len(calls)), thread_name_prefix="doctor")
    futures = {
        name: pool.submit(_ask, t, argv, timeout, clock) for name, (t, argv) in calls.items()
    }
    cf.wait(futures.values(), timeout=timeout)
    pool.shutdown(wait=False, cancel_futures=True)  # never wait on a hung host
    out: dict[str, Answer | str] = {}
    for name, fut in futures.items():
        if not fut.done():
            out[name] = f"timed out after {timeout:g} s"
        elif (exc := fut.exception()) is not None:
            out[name] = f"{type(exc).__name__}: {exc}"
        else:
            out[name] = fut.result()
    return out


def wait_ready(proc: Process, timeout: float) -> bool:
    """True once ``proc`` printed ``ready`` (within ``timeout`` s); never blocks longer."""
    ready = threading.Event()

    def read() -> None:
        for line in proc.lines():
            if line.strip() == "ready":
                ready.set()
                return

    threading.Thread(target=read, daemon=True, name="doctor-listener").start()
    return ready.wait(timeout)
