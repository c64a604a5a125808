"""Running `encode_chunk` over the chunks, in parallel, with results in input order, in bounded memory.

Why encoder processes: gigatoken keeps every distinct pre-token it has seen, and offers no way to cap or
clear that cache, so an encoding process grows with the vocabulary of what it has read (~10 bytes of
memory per byte of text made of new words: URLs, numbers, hashes, typos; up to ~25 while its tables
double). Every encoder process is therefore replaced by a fresh one before its resident memory would pass
a limit (`memory_limit_mb`, `--encoder-memory-limit-mb`; one INFO line each time). A fresh one is ready
in ~0.5 s (interpreter, imports, tokenizer), which real text almost never pays and text made only of new
words pays every ~10 MB. Ids do not depend on the cache, so they are the same across a replacement.

* `workers == 1`: this process encodes, on a small thread pool (the tokenizer and Arrow's JSON reader
  release the GIL; gigatoken spreads a batch over the cores beyond those threads, if any: see
  `spread_batches`), while its own memory stays well under the limit: real text usually to the end,
  with no process started. Past ENCODER_PROCESS_START of its room, one encoder process starts (the
  same thread pool); once it is ready this process frees its tokenizer and cache, and the encoder
  process does the rest.
* `workers > 1`: N encoder processes encode every chunk, each single-threaded
  (TOKENIZERS_PARALLELISM=false, gigatoken on the calling thread). Chunk k goes to worker slot k mod N
  over that worker's own pipes, so reading the results in the order they were sent gives them in
  input order.

Encoder processes are fresh interpreters (`python -c`; never `fork`: Rust tokenizers' thread pools do not
survive it; not multiprocessing's spawn, which also imports the program's main module: ~70 MB more per
process). We do not use `ProcessPoolExecutor`: a worker killed while sending a large result leaves a
truncated message in its shared result pipe, and the executor's manager thread then waits for the rest
forever. With one pipe per worker whose only writer is that worker, a death mid-message reads as
end-of-file, and the run fails at once. At most a few chunks per worker are in flight (bounded memory).
"""

from __future__ import annotations

import collections
import ctypes
import fcntl
import gc
import logging
import os
import queue
import resource
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import Connection

from indexed_dataset import TokenmillError
from indexed_dataset.machine import GIB, available_memory_bytes, usable_cores

from .documents import EncodedChunk, EncodeSettings, encode_chunk
from .tokenizers import Tokenizer, TokenizerConfig, build_tokenizer

logger = logging.getLogger(__name__)

# Threads of the single encoder (this process, or its encoder process): one parsing the next chunk while
# another encodes the current one.
IN_PROCESS_THREADS = 2
# Resident memory (MiB) that every encoding process stays under. The main process once it has handed
# encoding over (Python, pyarrow, numpy, the writers, numba when writing MindRecord: ~225 MB) plus one
# encoder process at this limit stays under 600 MB whatever the input; a fresh one starts at ~130 MB.
DEFAULT_ENCODER_MEMORY_LIMIT_MB = 340
# Resident memory (MiB) of a fresh encoder process (interpreter, numpy, pyarrow, awkward, a GPT-2
# tokenizer): the rest of the limit is the room its cache may grow into. This process's own encoder gets
# the same room above what this process holds when it starts encoding (it holds the writers besides).
FRESH_ENCODER_MB = 130
# With one worker, this process encodes until its projected memory (see `projected_bytes`) has used this
# fraction of its room under the limit; then the encoder process starts, and takes over once it is
# ready (~0.5 s later: imports, tokenizer), or at once if this process reaches the limit first.
ENCODER_PROCESS_START = 0.75
# Resident memory (MiB) of this process once it has handed encoding over (see DEFAULT_ENCODER_MEMORY_LIMIT_MB):
# kept free when counting the encoder processes the available memory holds (`usable_workers`).
MAIN_PROCESS_MB = 225
# See `projected_bytes`.
NEXT_GROWTH_STEP = 0.6
# An encoder process: a fresh interpreter running `encoder_process_main` on two inherited pipe ends, then
# exiting without the interpreter's teardown (`end_program`): its results are sent (pipe writes are not
# buffered), and freeing its cache object by object (~0.07 s when full) would delay its replacement,
# which waits for it to be gone.
_ENCODER_PROCESS_CODE = ("import sys; from preprocess.workers import encoder_process_main as main; "
                         "from preprocess.cli_common import end_program; "
                         "main(*map(int, sys.argv[1:])); end_program(0)")
# The directory holding the `preprocess` package, put first on an encoder process's path.
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What an encoder process sends once its tokenizer is built, before any result.
_READY = "ready"
_MIB = 2**20
# Buffer of the pipes to and from encoder processes (Linux's default maximum for unprivileged users).
PIPE_BYTES = 2**20
# How often a blocked feeder re-checks whether the run was stopped (seconds).
_STOP_POLL_SECONDS = 0.1
_DIED = "a worker process died (killed, or out of memory); nothing was written"


def resident_bytes() -> int:
    """This process's resident memory now (Linux /proc), else its peak so far (an upper bound)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def usable_workers(requested: int, memory_limit_mb: int) -> int:
    """`requested` worker processes, capped at what this machine holds: one per usable core (more only
    time-share the cores), and as many encoder processes at `memory_limit_mb` each as its available memory
    holds besides this process. The ids do not depend on the number of workers, so a cap changes only
    the speed; it is logged as a warning (one line). At least 1.
    """
    cores = usable_cores()
    available = available_memory_bytes()
    by_memory = max(1, (available - MAIN_PROCESS_MB * _MIB) // (memory_limit_mb * _MIB))
    usable = min(requested, cores, by_memory)
    if usable < requested:
        logger.warning("--workers %d is more than this machine holds: using %d (%d usable cores; %.1f GiB "
                       "available / %d MB per encoder process = %d)", requested, usable, cores,
                       available / GIB, memory_limit_mb, by_memory)
    return usable


def spread_batches(threads: int) -> bool:
    """Whether the tokenizer should spread each batch over its own thread pool (gigatoken's) when
    `threads` of our threads encode batches at once (1: one of several encoder processes, each meant to
    take one core). Only when the machine has cores to spare beyond ours: otherwise every batch already
    has a core, and the pool's hand-offs cost CPU for nothing (its idle threads spin while they wait)."""
    return threads > 1 and usable_cores() > threads


def _enlarge_pipe(fd: int) -> None:
    """Give a pipe PIPE_BYTES of buffer where the system allows it (Linux), else leave it (64 KiB): a
    chunk then crosses in a few writes instead of one per 64 KiB, each waking the other process."""
    try:
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ"), PIPE_BYTES)
    except (AttributeError, OSError):  # not Linux, or above /proc/sys/fs/pipe-max-size for this user
        pass


def _encoder_environment() -> dict[str, str]:
    """This process's environment, with the `preprocess` package importable whatever the directory, and
    OpenBLAS on one thread unless the user chose otherwise: an encoder never multiplies matrices, and
    the thread pool numpy's import starts costs ~0.05 s of CPU per process, paid again at every
    replacement (~50 on 500 MB of new words)."""
    path = os.environ.get("PYTHONPATH")
    return {"OPENBLAS_NUM_THREADS": "1", **os.environ,
            "PYTHONPATH": _PACKAGE_ROOT + (os.pathsep + path if path else "")}


def _release_free_memory() -> None:
    """Give the pages freed so far back to the system (glibc keeps them otherwise): a fresh encoder
    drops the reference tokenizer it was built from, ~20 MB."""
    gc.collect()
    libc = ctypes.CDLL(None)  # the symbols this process is linked with, libc's among them
    if hasattr(libc, "malloc_trim"):  # glibc only
        libc.malloc_trim(0)


def projected_bytes(resident: int, start: int) -> int:
    """The most an encoder that grew from `start` to `resident` bytes may reach with its next chunks.

    gigatoken's cache grows in steps, when its tables double, and the step has been at most ~0.57 of what
    the encoder had grown by until then (distinct random words, from a 130 MB start: +35 MB after +82,
    +67 after +131, +131 after +231; the chunks in flight add ~2.5 bytes per byte besides). An encoder
    gets no more chunks once this passes its limit, so that the step it may take still fits."""
    return resident + int(NEXT_GROWTH_STEP * max(resident - start, 0))


def _ordered_in_threads(executor: ThreadPoolExecutor, function, items: Iterable, window: int) -> Iterator:
    """`function` of each item, in order, computed `window` items at a time on `executor`."""
    pending = collections.deque()
    try:
        for item in items:
            pending.append(executor.submit(function, item))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()


class _Failure:
    """A worker's unexpected exception, carried back with its traceback (the exception may not pickle)."""

    def __init__(self, error: BaseException) -> None:
        self.text = "".join(traceback.format_exception(error))


def encoder_process_main(task_fd: int, result_fd: int) -> None:
    """An encoder process: (tokenizer config, settings, threads) then chunks arrive on `task_fd`, READY
    then one outcome per chunk leave on `result_fd` (see `_ProcessPool`)."""
    # The main process handles Ctrl-C (and kills the workers): a worker prints no traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    tasks, results = Connection(task_fd, writable=False), Connection(result_fd, readable=False)
    try:
        config, settings, threads = tasks.recv()
        if threads == 1:  # one of several workers: each on one core
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
        try:
            tokenizer = build_tokenizer(config)
        except TokenmillError as error:  # e.g. a tokenizer file removed since the main process read it
            results.send((error, 0))
            return
        tokenizer.parallel_batches = spread_batches(threads)
        _release_free_memory()
        results.send((_READY, resident_bytes()))
        _serve(tokenizer, settings, threads, tasks, results)
    except (EOFError, OSError):  # the main process is gone (killed, or stopped the run): nothing to say
        return


def _outcome(chunk, tokenizer: Tokenizer, settings: EncodeSettings):
    """The chunk's EncodedChunk, or the error to send back instead."""
    try:
        return encode_chunk(chunk, tokenizer, settings)
    except TokenmillError as error:  # ours pickle; the main process re-raises them
        return error
    except Exception as error:  # a bug: keep its traceback
        return _Failure(error)


def _serve(tokenizer: Tokenizer, settings: EncodeSettings, threads: int, tasks, results) -> None:
    """Encode the chunks arriving on `tasks` until None, `threads` at a time, sending each outcome on
    `results` in order, with this process's resident memory (bytes) after it."""
    with ThreadPoolExecutor(threads) as executor:
        outcomes = _ordered_in_threads(executor, partial(_outcome, tokenizer=tokenizer, settings=settings),
                                       iter(tasks.recv, None), threads)
        for outcome in outcomes:
            results.send((outcome, resident_bytes()))


@dataclass(eq=False)
class _Worker:
    """One encoder process and the two pipes only it holds the other ends of."""

    process: subprocess.Popen
    tasks: Connection
    results: Connection
    resident_bytes: int = 0
    """As reported with its latest result."""
    start_bytes: int = 0
    """Resident memory once its tokenizer was built."""
    input_bytes: int = 0
    """Chunk bytes sent to it."""
    ready: bool = False
    """Its READY message was read (the tokenizer is built)."""

    def check_ready(self, block: bool) -> bool:
        """Whether the worker is ready, reading its READY message if it came (waiting for it if `block`).

        Raises:
            TokenmillError: the worker died, or could not build its tokenizer.
        """
        if not self.ready and (block or self.results.poll()):
            try:
                message, self.start_bytes = self.results.recv()
            except (EOFError, OSError):
                raise TokenmillError(_DIED) from None
            if isinstance(message, BaseException):
                raise message
            self.ready, self.resident_bytes = True, self.start_bytes
        return self.ready

    def close(self) -> None:
        self.process.wait()
        self.tasks.close()
        self.results.close()


@dataclass(frozen=True)
class _Retired:
    """In the order queue after a replaced worker's last chunk: its results have all been read."""

    worker: _Worker


class _ProcessPool:
    """N encoder processes, each with its own task and result pipe, each replaced by a fresh one (in the
    same slot) before its resident memory passes `memory_limit_mb`.

    The processes are fresh interpreters that import only the encoding modules (`python -c`, not
    multiprocessing's spawn, which would also import this program's main module and start a resource
    tracker: ~70 MB and ~0.3 s more per process). A worker's death closes its result pipe, whose only
    writer it is, so it reads as end-of-file at once.

    Args:
        workers: processes (slots).
        config: how each builds its tokenizer.
        settings: what to do with each chunk.
        threads: threads per process (and chunks each works on at once).
        memory_limit_mb: resident memory (MiB) past which a process gets no more chunks and is replaced.
    """

    def __init__(self, workers: int, config: TokenizerConfig, settings: EncodeSettings, threads: int,
                 memory_limit_mb: int) -> None:
        self.config, self.settings, self.threads = config, settings, threads
        self.memory_limit_bytes = memory_limit_mb * _MIB
        # Each process holds `threads` chunks and one more waits in its pipe, so it never idles.
        self.in_flight_per_worker = threads + 1
        self.started: list[_Worker] = []
        self.recycles = 0
        self.stop = threading.Event()
        # Held while starting a worker or killing them all, so that none starts unseen by `close`.
        self.lock = threading.Lock()
        try:
            self.slots = [self._start() for _ in range(workers)]
        except BaseException:
            self.close(kill=True)
            raise

    def _start(self) -> _Worker:
        task_reader, task_writer = os.pipe()
        result_reader, result_writer = os.pipe()
        for pipe_end in (task_writer, result_writer):
            _enlarge_pipe(pipe_end)
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", _ENCODER_PROCESS_CODE, str(task_reader), str(result_writer)],
                stdin=subprocess.DEVNULL, pass_fds=(task_reader, result_writer), env=_encoder_environment(),
                # Its own session: a terminal's Ctrl-C or a group's SIGTERM reaches this process only,
                # which kills the workers; a worker still starting would print a traceback.
                start_new_session=True)
        finally:
            # Only the worker may hold its pipes' other ends: then its death reads as end-of-file.
            os.close(task_reader)
            os.close(result_writer)
        worker = _Worker(process, Connection(task_writer, readable=False), Connection(result_reader, writable=False))
        self.started.append(worker)
        try:
            worker.tasks.send((self.config, self.settings, self.threads))
        except OSError:  # it died already
            raise TokenmillError(_DIED) from None
        return worker

    def _replace(self, slot: int, order: queue.Queue) -> bool:
        """Retire the slot's worker (it finishes the chunks it holds, then exits) and, once it is gone
        (so that two encoders never hold memory at once), start a fresh one. False if the run stopped."""
        old = self.slots[slot]
        self.recycles += 1
        logger.info("encoder process at %.0f MB resident (started at %.0f MB; limit %d MB, "
                    "--encoder-memory-limit-mb) after %.1f MB of input: replacing it with a fresh one "
                    "(replacement %d)", old.resident_bytes / _MIB, old.start_bytes / _MIB,
                    self.memory_limit_bytes // _MIB, old.input_bytes / _MIB, self.recycles)
        old.tasks.send(None)
        order.put(_Retired(old))
        while old.process.poll() is None:
            if self.stop.is_set():
                return False
            try:
                old.process.wait(_STOP_POLL_SECONDS)
            except subprocess.TimeoutExpired:
                pass
        with self.lock:
            if self.stop.is_set():
                return False
            self.slots[slot] = self._start()
        return True

    def _feed(self, chunks: Iterable, order: queue.Queue, window: threading.Semaphore) -> None:
        """Send chunk k to slot k mod N (replacing a worker past the memory limit first); tell the
        reader which worker holds each, then None."""
        try:
            for index, chunk in enumerate(chunks):
                while not window.acquire(timeout=_STOP_POLL_SECONDS):
                    if self.stop.is_set():
                        return
                slot = index % len(self.slots)
                # Replace it before it passes the limit while encoding what it holds (and this chunk).
                worker = self.slots[slot]
                if (projected_bytes(worker.resident_bytes, worker.start_bytes) > self.memory_limit_bytes
                        and not self._replace(slot, order)):
                    return
                worker = self.slots[slot]
                worker.tasks.send(chunk)
                worker.input_bytes += chunk.num_bytes
                order.put(worker)
            for worker in self.slots:
                worker.tasks.send(None)
        except (BrokenPipeError, OSError):
            order.put(TokenmillError(_DIED))
        except BaseException as error:  # e.g. an InputError from reading the input
            order.put(error)
        finally:
            order.put(None)

    def ready(self) -> bool:
        """Whether every current worker has built its tokenizer (never waits)."""
        return all(worker.check_ready(block=False) for worker in self.slots)

    @staticmethod
    def _receive(worker: _Worker) -> EncodedChunk:
        worker.check_ready(block=True)
        try:
            result, worker.resident_bytes = worker.results.recv()
        except (EOFError, OSError):
            raise TokenmillError(_DIED) from None
        if isinstance(result, BaseException):
            raise result
        if isinstance(result, _Failure):
            raise RuntimeError(f"worker process failed:\n{result.text}")
        return result

    def map_ordered(self, chunks: Iterable) -> Iterator[EncodedChunk]:
        order: queue.Queue = queue.Queue()
        window = threading.Semaphore(len(self.slots) * self.in_flight_per_worker)
        feeder = threading.Thread(target=self._feed, args=(chunks, order, window), daemon=True)
        feeder.start()
        try:
            while (item := order.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, _Retired):
                    item.worker.close()
                    continue
                yield self._receive(item)
                window.release()
        finally:
            self.stop.set()
            if feeder.is_alive():
                self.close(kill=True)
            feeder.join()

    def close(self, kill: bool) -> None:
        with self.lock:
            self.stop.set()
            started = list(self.started)
            for worker in started:
                if kill and worker.process.poll() is None:
                    worker.process.kill()
        for worker in started:
            worker.close()


class _LocalEncoder:
    """This process's own encoding (a tokenizer on a small thread pool), until `release`.

    Args:
        tokenizer: the tokenizer; this object should hold its only reference, so that `release` frees it.
        settings: what to do with each chunk.
        cap: resident bytes this process may reach while encoding.
    """

    def __init__(self, tokenizer: Tokenizer, settings: EncodeSettings, cap: int) -> None:
        self.tokenizer: Tokenizer | None = tokenizer
        tokenizer.parallel_batches = spread_batches(IN_PROCESS_THREADS)
        self.settings = settings
        self.cap = cap
        self.executor = ThreadPoolExecutor(IN_PROCESS_THREADS)
        self.window = IN_PROCESS_THREADS + 1
        self.start = resident_bytes()

    def _encode(self, chunk) -> EncodedChunk:
        return encode_chunk(chunk, self.tokenizer, self.settings)

    def map(self, chunks: Iterable) -> Iterator[EncodedChunk]:
        """EncodedChunks of `chunks`, in order."""
        return _ordered_in_threads(self.executor, self._encode, chunks, self.window)

    def near(self, fraction: float = 1.0) -> bool:
        """Whether its next chunks may take this process past `fraction` of its room under its cap."""
        return projected_bytes(resident_bytes(), self.start) > self.start + fraction * (self.cap - self.start)

    def release(self) -> None:
        """Drop the tokenizer (and its cache) and give the memory back: encoder processes took over."""
        self.tokenizer = None
        _release_free_memory()

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)


def _until(stop: Callable[[], bool], items: Iterator) -> Iterator:
    """The items of `items` until `stop()` (asked before taking each), leaving the rest in `items`."""
    while not stop():
        try:
            yield next(items)
        except StopIteration:
            return


@contextmanager
def chunk_encoder(
    workers: int,
    tokenizer: Tokenizer,
    tokenizer_config: TokenizerConfig,
    settings: EncodeSettings,
    memory_limit_mb: int = DEFAULT_ENCODER_MEMORY_LIMIT_MB,
) -> Iterator[Callable[[Iterable], Iterator[EncodedChunk]]]:
    """A function mapping an iterable of chunks to their EncodedChunks, in order.

    With one worker, this process encodes the chunks itself while its memory stays well under
    `memory_limit_mb` (real text: usually to the end, at no cost); past ENCODER_PROCESS_START of its
    room, an encoder process starts, and once it is ready (or this process reaches the limit) this
    process frees its tokenizer and its cache (the memory goes back to the system) and the encoder
    process encodes the rest. With N > 1 workers, N encoder processes encode every chunk. Each
    encoder process is replaced by a fresh one before it would pass the limit.

    Args:
        workers: 1 = one encoder (this process, then a process, on all cores); N > 1 = N single-threaded
            encoder processes.
        tokenizer: this process's tokenizer, handed over: the caller should drop its own reference,
            so that it is freed once encoder processes take over.
        tokenizer_config: how encoder processes build theirs.
        settings: what to do with each chunk.
        memory_limit_mb: resident memory (MiB) that every encoder process stays under; this process
            encodes while its growth stays under the room a fresh encoder process has (see FRESH_ENCODER_MB).

    Raises:
        TokenmillError: (while iterating) a worker died, or a chunk held bad input.
    """
    local = _LocalEncoder(tokenizer, settings, resident_bytes() + (memory_limit_mb - FRESH_ENCODER_MB) * _MIB)
    del tokenizer
    pool: _ProcessPool | None = None
    clean = False

    def start_pool() -> _ProcessPool:
        nonlocal pool
        if workers == 1:
            logger.info("this process is at %.0f MB resident, its encoder's cache growing (limit %d MB, "
                        "--encoder-memory-limit-mb): starting an encoder process to take over",
                        resident_bytes() / _MIB, memory_limit_mb)
        pool = _ProcessPool(workers, tokenizer_config, settings, IN_PROCESS_THREADS if workers == 1 else 1,
                            memory_limit_mb)
        return pool

    def hand_over() -> bool:
        """Asked before this process takes each chunk: whether the encoder processes take over now
        (N > 1 workers: at once, they do all the encoding)."""
        if pool is None and (workers > 1 or local.near(ENCODER_PROCESS_START)):
            start_pool()
        return pool is not None and (workers > 1 or pool.ready() or local.near())

    def encode_all(chunks: Iterable) -> Iterator[EncodedChunk]:
        chunks = iter(chunks)
        yield from local.map(_until(hand_over, chunks))
        if pool is not None:
            local.release()
            yield from pool.map_ordered(chunks)

    try:
        yield encode_all
        clean = True
    finally:
        if pool is not None:
            pool.close(kill=not clean)
        local.close()
