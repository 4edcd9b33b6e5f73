"""Large copies between host arrays and the GPU through page-locked staging buffers.

A copy from pageable NumPy memory makes the driver stage it through a small buffer of its
own on one thread: about a third of the bus's speed, and the first touch of a freshly
allocated result array faults its pages in on that one thread too. Here a large copy is
cut into chunks that host threads copy into (or out of) a page-locked staging buffer
while the DMA engine moves the chunks before (or after) them: the host copies run in
parallel and overlap the bus. Staging buffers are kept (one for uploads, one for
downloads, each as large as the largest copy so far) and reused once their last DMA is
done. Small copies, and any while a graph is being captured, stay on the driver's path.

Imports PyCUDA: loaded by cuda_backend alone.
"""

import concurrent.futures
import os

import numpy as np
import pycuda.driver as drv

# A copy smaller than this takes the driver's path (the staging would cost more than it
# saves). Measured on an H100: a 2 MiB upload took 0.15 ms on the driver's path and 0.23
# staged, a 0.7 MiB download 0.105 ms on the driver's path and 0.064 staged.
MIN_STAGED_BYTES = 4 << 20
MIN_STAGED_DOWNLOAD_BYTES = 256 << 10
# The most page-locked memory a staging buffer takes (each direction has one); a larger
# copy goes through it in rounds, each waiting for the DMAs of the one before.
STAGING_CAP_BYTES = 256 << 20
CHUNK_BYTES = 4 << 20
_THREADS = max(1, min(8, os.cpu_count() or 1))


class _Staging:
    """A page-locked host buffer and the event after the last DMA that uses it."""

    def __init__(self):
        self.buffer = None
        self.done = None

    def get(self, nbytes):
        """The buffer (uint8, at least nbytes) once no DMA of an earlier copy uses it."""
        if self.done is not None:
            self.done.synchronize()
        if self.buffer is None or self.buffer.nbytes < nbytes:
            self.buffer = None  # the old one is freed before the larger one is taken
            self.buffer = drv.pagelocked_empty(nbytes, np.uint8)
        return self.buffer

    def used_until(self, stream):
        self.done = self.done or drv.Event(drv.event_flags.DISABLE_TIMING)
        self.done.record(stream)


class PinnedTransfers:
    """upload/download of large arrays on `stream` (see the module's docstring)."""

    def __init__(self, stream):
        self.stream = stream
        self._up, self._down = _Staging(), _Staging()
        self._pool = None
        self._in_flight = None  # the _Download not finished yet, if any

    def close(self):
        """Free the staging buffers (before the context goes) and stop the threads."""
        self._in_flight = None
        self._up, self._down = _Staging(), _Staging()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def _threads(self):
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                _THREADS, thread_name_prefix="darknet-py-copy"
            )
        return self._pool

    @staticmethod
    def _chunks(nbytes):
        return [
            (start, min(start + CHUNK_BYTES, nbytes)) for start in range(0, nbytes, CHUNK_BYTES)
        ]

    @staticmethod
    def _rounds(nbytes):
        return range(0, nbytes, STAGING_CAP_BYTES)

    def upload(self, dst_ptr, host, stream=None):
        """Queue the copy of contiguous array `host` to device address dst_ptr on `stream`
        (default: the backend's). Returns once host has been read (it may change or go)."""
        stream = stream or self.stream
        src = host.reshape(-1).view(np.uint8)
        for start in self._rounds(src.nbytes):
            self._upload_round(dst_ptr + start, src[start : start + STAGING_CAP_BYTES], stream)

    def _upload_round(self, dst_ptr, src, stream):
        staging = self._up.get(src.nbytes)

        def stage(span):
            staging[span[0] : span[1]] = src[span[0] : span[1]]

        spans = self._chunks(src.nbytes)
        if len(spans) == 1:  # one chunk: a hand-off to a thread would cost more
            stage(spans[0])
            staged = [None]
        else:
            staged = [self._threads().submit(stage, span) for span in spans]
        for (start, end), done in zip(spans, staged):
            if done is not None:
                done.result()
            drv.memcpy_htod_async(dst_ptr + start, staging[start:end], stream)
        self._up.used_until(stream)

    def download(self, src_ptr, out):
        """Copy from device address src_ptr into contiguous host array `out` after the work
        queued on the stream; returns when out holds the values."""
        dst = out.reshape(-1).view(np.uint8)
        for start in self._rounds(dst.nbytes):
            self.start_download(src_ptr + start, dst[start : start + STAGING_CAP_BYTES]).finish()

    def finish_in_flight(self):
        """Finish the download still in flight, if any (its DMAs done, its array filled)."""
        if self._in_flight is not None:
            self._in_flight.finish()

    def start_download(self, src_ptr, out, stream=None):
        """Queue that copy's DMAs on `stream` (default: the backend's) and return it (a
        _Download): its finish() waits for them and fills `out`. One download is in flight
        at a time (they share the staging): a second one finishes the first first."""
        stream = stream or self.stream
        self.finish_in_flight()
        dst = out.reshape(-1).view(np.uint8)
        if dst.nbytes > STAGING_CAP_BYTES:  # in rounds, done before returning
            for start in self._rounds(dst.nbytes):
                self.start_download(
                    src_ptr + start, dst[start : start + STAGING_CAP_BYTES], stream
                ).finish()
            return _Download(self, dst, None, [], [])
        staging = self._down.get(dst.nbytes)
        spans = self._chunks(dst.nbytes)
        landed = []
        for start, end in spans:
            drv.memcpy_dtoh_async(staging[start:end], src_ptr + start, stream)
            event = drv.Event(drv.event_flags.DISABLE_TIMING)
            event.record(stream)
            landed.append(event)
        self._down.used_until(stream)
        self._in_flight = _Download(self, dst, staging, spans, landed)
        return self._in_flight


class _Download:
    """A download whose DMAs are queued; finish() moves the chunks out of the staging as
    each lands (host threads) and returns once every one is in the destination."""

    def __init__(self, transfers, dst, staging, spans, landed):
        self._transfers, self._dst, self._staging = transfers, dst, staging
        self._spans, self._landed = spans, landed
        self.done = False

    def finish(self):
        if self.done:
            return
        self.done = True
        if self._transfers._in_flight is self:
            self._transfers._in_flight = None
        dst, staging = self._dst, self._staging

        def unstage(span):
            dst[span[0] : span[1]] = staging[span[0] : span[1]]

        if len(self._spans) == 1:  # one chunk: no hand-off to a thread
            self._landed[0].synchronize()
            unstage(self._spans[0])
            return
        copies = []
        for span, event in zip(self._spans, self._landed):
            event.synchronize()
            copies.append(self._transfers._threads().submit(unstage, span))
        for copy in copies:
            copy.result()
