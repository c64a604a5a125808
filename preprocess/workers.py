"""Running `encode_chunk` over the chunks, in parallel, with results in input order.

* `workers == 1`: the main process encodes, on a small thread pool. The tokenizer and Arrow's JSON
  reader release the GIL and gigatoken spreads a batch over every core by itself, so threads
  overlap reading, parsing and encoding without starting any process.
* `workers > 1`: `spawn`ed processes (never `fork`: Rust tokenizers' thread pools do not survive
  it), each building its own tokenizer and encoding single-threaded (TOKENIZERS_PARALLELISM=false).
  Chunk k goes to worker k mod N over that worker's own pipes, so reading the results worker by
  worker gives them in input order. We do not use `ProcessPoolExecutor`: a worker killed while
  sending a large result leaves a truncated message in its shared result pipe, and the executor's
  manager thread then waits for the rest forever. With one pipe per worker whose only writer is
  that worker, a death mid-message reads as end-of-file, and the run fails at once.

Either way at most `window` chunks are in flight (bounded memory).
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import queue
import signal
import threading
import traceback
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from multiprocessing.connection import wait

from indexed_dataset import TokenmillError

from .documents import EncodedChunk, EncodeSettings, encode_chunk
from .tokenizers import Tokenizer, TokenizerConfig, build_tokenizer

# Threads of the in-process mode: one parsing the next chunk while another encodes the current one.
IN_PROCESS_THREADS = 2
# Chunks in flight per worker process: one being encoded, one waiting in its pipe.
CHUNKS_IN_FLIGHT_PER_WORKER = 2
# How often a blocked feeder re-checks whether the run was stopped (seconds).
_STOP_POLL_SECONDS = 0.1
_DIED = "a worker process died (killed, or out of memory); nothing was written"


def _ordered_in_threads(executor: ThreadPoolExecutor, function, items: Iterable, window: int) -> Iterator:
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


def _worker_main(config: TokenizerConfig, settings: EncodeSettings, tasks, results) -> None:
    # Ctrl-C reaches every process of the terminal's group: the main process handles it (and kills
    # the workers), so a worker must not print a KeyboardInterrupt traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    tokenizer = build_tokenizer(config)
    try:
        _serve(tokenizer, settings, tasks, results)
    except (EOFError, OSError):  # the main process is gone (killed, or stopped the run): nothing to say
        return


def _serve(tokenizer: Tokenizer, settings: EncodeSettings, tasks, results) -> None:
    """Encode the chunks arriving on `tasks` until None, sending each result (or error) on `results`."""
    while (chunk := tasks.recv()) is not None:
        try:
            results.send(encode_chunk(chunk, tokenizer, settings))
        except TokenmillError as error:  # ours pickle; the main process re-raises them
            results.send(error)
        except (EOFError, OSError):
            raise
        except Exception as error:  # a bug: keep its traceback
            results.send(_Failure(error))


class _ProcessPool:
    """N spawned workers, each with its own task and result pipe."""

    def __init__(self, workers: int, config: TokenizerConfig, settings: EncodeSettings) -> None:
        context = multiprocessing.get_context("spawn")
        self.processes, self.tasks, self.results = [], [], []
        for _ in range(workers):
            task_reader, task_writer = context.Pipe(duplex=False)
            result_reader, result_writer = context.Pipe(duplex=False)
            process = context.Process(target=_worker_main, args=(config, settings, task_reader, result_writer),
                                      daemon=True)
            process.start()
            # Only the worker may hold its pipes' other ends: then its death reads as end-of-file.
            task_reader.close()
            result_writer.close()
            self.processes.append(process)
            self.tasks.append(task_writer)
            self.results.append(result_reader)
        self.stop = threading.Event()

    def _feed(self, chunks: Iterable, order: queue.Queue, window: threading.Semaphore) -> None:
        """Send chunk k to worker k mod N; tell the reader which worker holds each, then None."""
        try:
            for index, chunk in enumerate(chunks):
                while not window.acquire(timeout=_STOP_POLL_SECONDS):
                    if self.stop.is_set():
                        return
                worker = index % len(self.processes)
                self.tasks[worker].send(chunk)
                order.put(worker)
            for task in self.tasks:
                task.send(None)
        except (BrokenPipeError, OSError):
            order.put(TokenmillError(_DIED))
        except BaseException as error:  # e.g. an InputError from reading the input
            order.put(error)
        finally:
            order.put(None)

    def _receive(self, worker: int) -> EncodedChunk:
        connection, process = self.results[worker], self.processes[worker]
        wait([connection, process.sentinel])
        try:
            result = connection.recv()
        except (EOFError, OSError):
            raise TokenmillError(_DIED) from None
        if isinstance(result, BaseException):
            raise result
        if isinstance(result, _Failure):
            raise RuntimeError(f"worker process failed:\n{result.text}")
        return result

    def map_ordered(self, chunks: Iterable) -> Iterator[EncodedChunk]:
        order: queue.Queue = queue.Queue()
        window = threading.Semaphore(len(self.processes) * CHUNKS_IN_FLIGHT_PER_WORKER)
        feeder = threading.Thread(target=self._feed, args=(chunks, order, window), daemon=True)
        feeder.start()
        try:
            while (worker := order.get()) is not None:
                if isinstance(worker, BaseException):
                    raise worker
                yield self._receive(worker)
                window.release()
        finally:
            self.stop.set()
            if feeder.is_alive():
                self.close(kill=True)
            feeder.join()

    def close(self, kill: bool) -> None:
        for process in self.processes:
            if kill and process.is_alive():
                process.kill()
        for process in self.processes:
            process.join()
        for connection in self.tasks + self.results:
            connection.close()


@contextmanager
def chunk_encoder(
    workers: int, tokenizer: Tokenizer, tokenizer_config: TokenizerConfig, settings: EncodeSettings
) -> Iterator:
    """A function mapping an iterable of chunks to their EncodedChunks, in order.

    Args:
        workers: 1 = encode in this process (threads); N > 1 = N spawned worker processes.
        tokenizer: this process's tokenizer (used when workers == 1).
        tokenizer_config: how workers build theirs.
        settings: what to do with each chunk.

    Raises:
        TokenmillError: (while iterating) a worker died, or a chunk held bad input.
    """
    if workers == 1:
        executor = ThreadPoolExecutor(IN_PROCESS_THREADS)
        function = partial(encode_chunk, tokenizer=tokenizer, settings=settings)
        try:
            yield lambda chunks: _ordered_in_threads(executor, function, chunks, IN_PROCESS_THREADS + 1)
        finally:
            executor.shutdown(wait=True, cancel_futures=True)
        return
    pool = _ProcessPool(workers, tokenizer_config, settings)
    clean = False
    try:
        yield pool.map_ordered
        clean = True
    finally:
        pool.close(kill=not clean)
