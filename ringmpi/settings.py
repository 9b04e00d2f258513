"""Every RINGMPI_* environment variable, read once into one `Settings` object.

Like NCCL's variables they are read at the first use (the first collective call, the first
`ringmpi.Comm` call, or an uncaught exception), never at `import ringmpi`: a program may
set them in `os.environ` after the import. `reload()` reads them again (tests, or a program
that changes its environment later) and bumps `generation`, which is what cached plans and
choices compare against.

    RINGMPI_ALGO         force algorithms: "ring" wherever it exists, or per collective
                         "allreduce=ring,broadcast=pipeline" (like NCCL_ALGO)
    RINGMPI_DEBUG        WARN (default), INFO (each auto choice and why), TRACE (every call)
    RINGMPI_DEBUG_FILE   write those lines to this file instead of stderr (%h host, %p pid)
    RINGMPI_CHECK        1: compare every call's arguments across ranks first
    RINGMPI_STALL_WARN   seconds a rank may wait in one call before it is named (default 60; 0 off)
    RINGMPI_STALL_ABORT  seconds after which the whole job is aborted instead (default 600, the
                         10 minutes of torch.distributed's default timeout; 0: never)
    RINGMPI_PROFILE      the profile `auto` reads (default ~/.cache/ringmpi/profile-pP.json)
    RINGMPI_TUNE         1 (default): `auto` learns online, trying the candidates on the first
                         calls of each size; 0: `auto` is the profile's prediction alone
    RINGMPI_CUDA_AWARE   1: the MPI library reads device memory (refused when the library says
                         it cannot); 0: stage device buffers through the host; unset: ask
                         the library (`ringmpi info`)
    RINGMPI_STAGE_CHUNK  bytes per chunk of the device staging pipeline (default: its formula)
    RINGMPI_SHM_CMA      1 (default): on one host, shared-memory algorithms read ordinary
                         arrays straight from the peer's memory (Linux cross-memory attach)
                         where every rank may; 0: stage them through shared segments
    RINGMPI_ABORT_ON_EXCEPTION  1 (default): once MPI runs on more than one rank, an uncaught
                         exception on one rank prints its traceback and aborts the whole job
                         (MPI_Abort, like `python -m mpi4py`) instead of leaving the other
                         ranks waiting; 0: the rank exits as Python does
    RINGMPI_PROGRESS     thread (default): a progress thread advances requests (`iallreduce`,
                         persistent `start`) while the caller computes; calls: they advance
                         only inside ringmpi calls (test, wait, any collective)
    RINGMPI_DETERMINISTIC 1: floating-point SUM, AVG and PROD give the bits of the rank-order
                         fold ((x0 + x1) + x2) + ... whatever the algorithm, the size, the
                         hosts (a call's `deterministic=` wins); `auto` chooses among the
                         algorithms that keep it, and one named that cannot is refused
    RINGMPI_PARTIALS     what a 16-bit float's partial sums travel as: 32 (default: float32,
                         one rounding at the end) or 16 (16-bit hops, half the bytes of the
                         reduce-scatter, a rounding per hop)
"""
from __future__ import annotations

import logging
import os
import socket
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

from .errors import RingmpiUsageError
from .units import parse_size

__all__ = ["Settings", "settings", "reload", "on_reload", "log", "logger", "DEBUG_LEVELS"]

DEBUG_LEVELS = ("WARN", "INFO", "TRACE")


@dataclass(frozen=True)
class Settings:
    algo: tuple = ()            # ((collective or "", algorithm), ...) in the order given
    debug: str = "WARN"
    debug_file: str = ""
    check: bool = False
    stall_warn: float = 60.0
    stall_abort: float = 600.0
    profile: str = ""
    abort_on_exception: bool = True
    tune: bool = True
    cuda_aware: str = ""        # "", "0" or "1"
    stage_chunk: int = 0        # bytes; 0: the staging pipeline's formula
    shm_cma: bool = True
    progress: str = "thread"    # "thread" or "calls" (ringmpi.requests)
    deterministic: bool = False
    partials: int = 32          # bits of a 16-bit float's partial sums on the wire: 32 or 16
    generation: int = 0

    def forced(self, collective: str) -> str | None:
        """The algorithm RINGMPI_ALGO names for `collective` (a per-collective entry wins)."""
        hit = None
        for coll, alg in self.algo:
            if coll == collective:
                return alg
            if coll == "" and hit is None:
                hit = alg
        return hit

    @property
    def info(self) -> bool:
        return self.debug in ("INFO", "TRACE")


def _seconds(env: dict, name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise RingmpiUsageError(f"{name}={raw!r}: expected a number of seconds >= 0")
    return value


def _flag(env: dict, name: str) -> bool:
    return _choice(env, name) == "1"


def _algo(raw: str) -> tuple:
    out = []
    for part in filter(None, (x.strip() for x in raw.split(","))):
        coll, _, alg = part.rpartition("=")
        if not alg:
            raise RingmpiUsageError(f"RINGMPI_ALGO={raw!r}: empty algorithm in {part!r}; expected "
                                    "'ring' or 'allreduce=ring,broadcast=pipeline'")
        out.append((coll.strip(), alg.strip()))
    return tuple(out)


def _read(env: dict, generation: int) -> Settings:
    debug = env.get("RINGMPI_DEBUG", "").strip().upper() or "WARN"
    if debug not in DEBUG_LEVELS:
        raise RingmpiUsageError(f"RINGMPI_DEBUG={env['RINGMPI_DEBUG']!r}: expected one of {', '.join(DEBUG_LEVELS)}")
    return Settings(algo=_algo(env.get("RINGMPI_ALGO", "")), debug=debug,
                    debug_file=env.get("RINGMPI_DEBUG_FILE", ""), check=_flag(env, "RINGMPI_CHECK"),
                    abort_on_exception=_choice(env, "RINGMPI_ABORT_ON_EXCEPTION") != "0",
                    tune=_flag(env, "RINGMPI_TUNE") or env.get("RINGMPI_TUNE", "").strip() == "",
                    stall_warn=_seconds(env, "RINGMPI_STALL_WARN", 60.0),
                    stall_abort=_seconds(env, "RINGMPI_STALL_ABORT", 600.0),
                    profile=env.get("RINGMPI_PROFILE", ""), cuda_aware=_choice(env, "RINGMPI_CUDA_AWARE"),
                    stage_chunk=_bytes(env, "RINGMPI_STAGE_CHUNK"), shm_cma=_choice(env, "RINGMPI_SHM_CMA") != "0",
                    progress=_progress(env), deterministic=_flag(env, "RINGMPI_DETERMINISTIC"),
                    partials=_partials(env), generation=generation)


def _one_of(env: dict, name: str, allowed: dict[str, str], unset: str = "") -> str:
    """The variable's value (stripped, lower case; `unset` when unset or empty), one of
    `allowed` (value -> what it means, for the error)."""
    raw = env.get(name, "").strip().lower() or unset
    if raw not in allowed:
        raise RingmpiUsageError(f"{name}={env[name]!r}: expected " +
                                " or ".join(f"{v} ({meaning})" if meaning else v for v, meaning in allowed.items() if v))
    return raw


def _partials(env: dict) -> int:
    return int(_one_of(env, "RINGMPI_PARTIALS", {"32": "float32 partial sums", "16": "16-bit hops"}, "32"))


def _progress(env: dict) -> str:
    return _one_of(env, "RINGMPI_PROGRESS", {"thread": "", "calls": ""}, "thread")


def _choice(env: dict, name: str) -> str:
    """"0", "1" or "" (unset)."""
    return _one_of(env, name, {"": "", "0": "", "1": ""})


def _bytes(env: dict, name: str) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return 0
    try:
        value = parse_size(raw)
    except (ValueError, TypeError):
        value = 0
    if value < 1:
        raise RingmpiUsageError(f"{name}={raw!r}: expected a size in bytes >= 1 (e.g. 1M)")
    return int(value)


_CURRENT: list[Settings] = []
_ON_RELOAD: list = []
_READING = threading.RLock()   # one thread reads the environment; the others wait for its result


def on_reload(fn) -> None:
    """Call `fn()` whenever the settings are read again (caches made under the old ones go)."""
    _ON_RELOAD.append(fn)


def settings() -> Settings:
    """The settings in force (read from the environment at the first call)."""
    return _CURRENT[0] if _CURRENT else first_use(_CURRENT, _READING, reload)


def first_use(slot: list, lock: Any, fill: Callable[[], Any]) -> Any:
    """What `slot` holds, which `fill()` puts there at the first use: one thread fills it,
    the others that ask meanwhile wait for it under `lock` (a process's one engine, its
    settings)."""
    with lock:
        if not slot:
            fill()
    return slot[0]


def reload(env: dict | None = None) -> Settings:
    """Read the environment (or `env`) again; plans and choices made before are dropped."""
    with _READING:
        gen = _CURRENT[0].generation + 1 if _CURRENT else 1
        new = _read(dict(os.environ if env is None else env), gen)
        _CURRENT[:] = [new]
        for fn in _ON_RELOAD:
            fn()
    return new


TRACE = 5  # below logging.DEBUG: every call
_LEVELS = {"WARN": logging.WARNING, "INFO": logging.INFO, "TRACE": TRACE}


class _Format(logging.Formatter):
    """'ringmpi WARN|INFO|TRACE message', NCCL_DEBUG's names, without renaming logging's levels."""
    def format(self, record: logging.LogRecord) -> str:
        name = "WARN" if record.levelno >= logging.WARNING else "INFO" if record.levelno >= logging.INFO else "TRACE"
        return f"ringmpi {name} {record.getMessage()}"


def logger() -> logging.Logger:
    """The "ringmpi" logger, set up from RINGMPI_DEBUG (its level) and RINGMPI_DEBUG_FILE
    (%h: host name, %p: process id, as NCCL_DEBUG_FILE) at the first use after each reload."""
    log_ = logging.getLogger("ringmpi")
    try:
        st = settings()
    except RingmpiUsageError:
        st = Settings()
    if getattr(log_, "_ringmpi_generation", None) != st.generation:
        for h in list(log_.handlers):
            log_.removeHandler(h)
        if st.debug_file:
            path = st.debug_file.replace("%h", socket.gethostname()).replace("%p", str(os.getpid()))
            handler: logging.Handler = logging.FileHandler(path)
        else:
            handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_Format())
        log_.addHandler(handler)
        log_.setLevel(_LEVELS[st.debug])
        log_.propagate = False
        log_._ringmpi_generation = st.generation  # type: ignore[attr-defined]
    return log_


def log(message: str, level: str = "INFO") -> None:
    """One line 'ringmpi LEVEL message' (NCCL_DEBUG style) through the "ringmpi" logger."""
    logger().log(_LEVELS.get(level, logging.INFO), message)
