"""Reading what W&B wrote offline (tests only): the run file's records, the history rows."""

from __future__ import annotations

import json
import struct
from pathlib import Path


def wandb_records(path: Path) -> list:
    """The records of a W&B run file: a 7-byte header (`:W&B`, a magic number, a version),
    then LevelDB log blocks of 32 KiB holding chunks (crc32c, length, type: full, first,
    middle, last), each record one `wandb_internal_pb2.Record`."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    records, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the block's tail: padding
            pos += block - pos % block
            continue
        length, kind = struct.unpack_from("<HB", data, pos + 4)
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def history(run_dir: Path) -> list[dict]:
    (found,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    rows = []
    for record in wandb_records(found):
        if record.WhichOneof("record_type") == "history":
            rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                         for i in record.history.item})
    return rows
