"""TensorBoard event files, written by rank 0 without TensorBoard.

An event file is a TFRecord stream of `Event` protocol buffers. The few
messages a run needs (scalars, PNG images, the file version, a restart
marker) are encoded here by hand: no tensorboard, tensorboardX or protobuf
to install or import (torch.utils.tensorboard needs tensorboard: about 60 MB
with grpcio, protobuf and its data server, 0.23 s of imports after torch;
this module takes 8 ms). TensorBoard itself, on a login node, reads the
files from the shared run directory.

Writing happens on a daemon thread fed by a queue: a training step only
puts a small tuple on it and never waits for the file system.

A requeued run writes a new file beside the old ones, beginning with
`SessionLog.START` at the step it resumes from: TensorBoard then drops
every event of the earlier files at or after that step (they were trained
again), so no step appears twice.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path

from .background import Background

FOLDER = "tensorboard"  # in the run directory


# -- the record format -------------------------------------------------------

def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum TFRecord uses."""
    c = 0xFFFFFFFF
    table = _TABLE
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(payload: bytes) -> bytes:
    """One TFRecord: length, its masked CRC, the payload, its masked CRC."""
    length = struct.pack("<Q", len(payload))
    return (length + struct.pack("<I", _masked(crc32c(length))) + payload
            + struct.pack("<I", _masked(crc32c(payload))))


# -- protocol buffer encoding (only what Event needs) -------------------------

def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int64s as protobuf writes them
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _field(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _bytes(number: int, data: bytes) -> bytes:
    return _field(number, 2) + _varint(len(data)) + data


def _event(wall_time: float, step: int, body: bytes) -> bytes:
    """Event: wall_time (1, double), step (2, int64), then one of its bodies."""
    return _field(1, 1) + struct.pack("<d", wall_time) + _field(2, 0) + _varint(step) + body


def scalar_value(tag: str, value: float) -> bytes:
    """Summary.Value: tag (1), simple_value (2, float)."""
    return _bytes(1, tag.encode()) + _field(2, 5) + struct.pack("<f", value)


def image_value(tag: str, png: bytes, height: int, width: int) -> bytes:
    """Summary.Value: tag (1), image (4): height, width, colorspace (3: RGB), the PNG."""
    image = _field(1, 0) + _varint(height) + _field(2, 0) + _varint(width) + _field(3, 0) + _varint(3) \
        + _bytes(4, png)
    return _bytes(1, tag.encode()) + _bytes(4, image)


def summary_event(wall_time: float, step: int, values: list[bytes]) -> bytes:
    """Event.summary (5): Summary's repeated value (1)."""
    return _event(wall_time, step, _bytes(5, b"".join(_bytes(1, v) for v in values)))


def version_event(wall_time: float) -> bytes:
    """Event.file_version (3): the first event of every file."""
    return _event(wall_time, 0, _bytes(3, b"brain.Event:2"))


def restart_event(wall_time: float, step: int) -> bytes:
    """Event.session_log (7) with status START (1): a run resumed at `step`."""
    return _event(wall_time, step, _bytes(7, _field(1, 0) + _varint(1)))


# -- the writer ----------------------------------------------------------------

class EventWriter:
    """Rank 0's event file in `run`/tensorboard. `resumed_at`: the step a
    requeued run starts from (None for a new run). Calls only queue."""

    def __init__(self, run: Path, resumed_at: int | None = None):
        folder = Path(run) / FOLDER
        folder.mkdir(parents=True, exist_ok=True)
        now = time.time()
        self.path = folder / f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}.hpcyolo"
        self._file = open(self.path, "ab")
        self._thread = Background("tensorboard")
        self._thread.submit(self._write, version_event(now))
        if resumed_at is not None:
            self._thread.submit(self._write, restart_event(now, resumed_at))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self._thread.submit(self._write_scalars, time.time(), step, values)

    def image(self, step: int, tag: str, path: Path) -> None:
        """A PNG or JPEG file as an image summary (read and encoded on the thread)."""
        self._thread.submit(self._write_image, time.time(), step, tag, Path(path))

    def close(self) -> None:
        """Write what is queued and close the file."""
        self._thread.wait()
        self._file.close()

    def _write(self, event: bytes) -> None:
        self._file.write(record(event))
        self._file.flush()

    def _write_scalars(self, wall_time: float, step: int, values: dict[str, float]) -> None:
        self._write(summary_event(wall_time, step, [scalar_value(k, float(v)) for k, v in values.items()]))

    def _write_image(self, wall_time: float, step: int, tag: str, path: Path) -> None:
        png, height, width = _png(path)
        self._write(summary_event(wall_time, step, [image_value(tag, png, height, width)]))


def _png(path: Path) -> tuple[bytes, int, int]:
    """The file's pixels as PNG bytes (TensorBoard shows PNG), and its size."""
    import io

    from PIL import Image

    with Image.open(path) as im:
        rgb = im.convert("RGB")
        out = io.BytesIO()
        rgb.save(out, format="PNG")
        return out.getvalue(), rgb.height, rgb.width


class StepLosses:
    """The running training losses every few optimizer steps, read one
    interval late: by then the device has long computed them, so reading
    never makes the CPU wait for a step still running on a GPU."""

    def __init__(self, writer: EventWriter, names: tuple[str, ...]):
        self.writer, self.names = writer, names
        self.pending: tuple[int, object] | None = None

    def add(self, step: int, mean_losses) -> None:
        """`mean_losses`: a tensor of the loss items' running means at `step`."""
        self.flush()
        self.pending = (step, mean_losses.detach().clone())

    def flush(self) -> None:
        if self.pending is not None:
            step, losses = self.pending
            self.writer.scalars(step, {f"train_step/{n}": v for n, v in zip(self.names, losses.tolist())})
            self.pending = None

    def close(self) -> None:
        self.flush()
        self.writer.close()
